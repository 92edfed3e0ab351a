"""L2: the engine in one process: the scheduler's Scheduler driving a ModelRunner directly,
no RPC. The same decisions the services make, minus the hops."""

from __future__ import annotations

from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.scheduler import Sample, ScheduledStep, Scheduler, SchedulerLimits
from services.worker.engine.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from services.worker.model.loader import LoadedModel

MODEL = "smollm2-135m-instruct"
BLOCK_SIZE = 16  # the worker's default


def make_runner(loaded: LoadedModel, num_blocks: int) -> ModelRunner:
    """The worker's ModelRunner over `loaded` with a paged KV cache of `num_blocks` blocks, on
    the model's device and dtype, its layers in KV cache groups as the worker's are."""
    weight = loaded.model.embed_tokens
    groups = kv_cache_groups(loaded.config)
    cache = PagedKVCache(loaded.config, num_blocks, BLOCK_SIZE, weight.dtype, weight.device, groups)
    return ModelRunner(
        loaded, cache, max_model_len=loaded.config.max_position_embeddings, model_name=MODEL
    )


def make_engine(loaded: LoadedModel, num_blocks: int, limits: SchedulerLimits) -> OfflineEngine:
    return OfflineEngine(make_runner(loaded, num_blocks), limits)


def to_plan(step: ScheduledStep) -> StepPlan:
    return StepPlan(
        new=[
            NewSequence(
                r.request_id,
                r.all_token_ids,
                r.num_prompt_tokens,
                r.num_computed_tokens - n,
                n,
                [list(table) for table in r.block_tables],
                r.sampling,
            )
            for r, n in step.new
        ],
        running=[RunningSequence(r.request_id, n, blocks) for r, n, blocks in step.running],
        finished_ids=step.finished_ids,
    )


class OfflineEngine:
    def __init__(self, runner: ModelRunner, limits: SchedulerLimits) -> None:
        """Prefix caching is on or off as limits.enable_prefix_caching says."""
        self.runner = runner
        windows = tuple(group.window for group in runner.kv_cache_groups)
        pool = BlockPool(runner.num_blocks)
        kv = KVCacheManager(pool, runner.block_size, runner.fingerprint, windows)
        self.scheduler = Scheduler(
            limits, kv, runner.max_model_len, frozenset(runner.eos_token_ids)
        )

    def generate(
        self,
        prompts: list[list[int]],
        output_lens: list[int],
        sampling: list[SamplingOptions] | None = None,
    ) -> dict[str, list[int]]:
        """EOS ignored: exactly output_lens[i] tokens for prompt i, sampled as sampling[i] says
        (None: greedy). Returns the tokens."""
        options = sampling or [SamplingOptions() for _ in prompts]
        requests = {}
        for i, (prompt, out_len, sample) in enumerate(
            zip(prompts, output_lens, options, strict=True)
        ):
            request = Request(f"r{i}", list(prompt), out_len, sample, frozenset())
            requests[request.request_id] = request
            self.scheduler.add(request)
        while self.scheduler.has_work():
            step = self.scheduler.schedule()
            sampled = self.runner.execute(to_plan(step))
            self.scheduler.update([Sample(s.request_id, s.token_id) for s in sampled])
        return {rid: r.output_token_ids for rid, r in requests.items()}
