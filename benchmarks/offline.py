"""L2: the engine in one process: the scheduler's Scheduler driving a ModelRunner directly,
no RPC. The same decisions the services make, minus the hops; with async_scheduling, the
runner steps in a thread of its own and the next step is scheduled while it computes one, as
the scheduler's engine loop does (services/scheduler/engine.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.result_applier import RequestUpdate
from services.scheduler.scheduler import Sample, ScheduledStep, Scheduler, SchedulerLimits
from services.scheduler.spec_decode import Proposer
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, Sampled, StepPlan
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.model.loader import LoadedModel

MODEL = "smollm2-135m-instruct"
BLOCK_SIZE = 16  # the worker's default


def make_runner(loaded: LoadedModel, num_blocks: int) -> ModelRunner:
    """The worker's ModelRunner over `loaded` with a paged KV cache of `num_blocks` blocks, on
    the model's device and dtype, its layers in KV cache groups as the worker's are."""
    weight = loaded.model.embed_tokens
    groups = kv_cache_groups(loaded.config)
    cache = PagedKVCache(loaded.config, num_blocks, BLOCK_SIZE, weight.dtype, weight.device, groups)
    backend = choose_attention_backend("auto", weight.device, loaded.config.head_dim)
    limit = loaded.config.max_position_embeddings
    return ModelRunner(loaded, cache, max_model_len=limit, model_name=MODEL, backend=backend)


def make_engine(
    loaded: LoadedModel,
    num_blocks: int,
    limits: SchedulerLimits,
    async_scheduling: bool = False,
    proposer: Proposer | None = None,
    adaptive_speculation: bool = True,
) -> OfflineEngine:
    runner = make_runner(loaded, num_blocks)
    return OfflineEngine(runner, limits, async_scheduling, proposer, adaptive_speculation)


def service_async_scheduling(device: str = "cpu") -> bool:
    """The scheduler service's --async-scheduling as its environment sets it, for a worker on
    `device` (auto: on for a GPU): for L2 to schedule as L3's scheduler does."""
    from services.scheduler.config import SchedulerConfig

    ahead = SchedulerConfig.from_args([]).steps_ahead()
    return device.startswith("cuda") if ahead is None else ahead


def service_speculation(device: str = "cpu") -> tuple[Proposer | None, bool]:
    """(proposer, adaptive) as the scheduler service's environment sets them, for a worker on
    `device`: --num-speculative-tokens auto proposes only where steps are synchronous (a CPU
    worker), so L2 speculates where L3's scheduler does."""
    from services.scheduler.config import SchedulerConfig

    config = SchedulerConfig.from_args([])
    proposer = config.proposer()
    if config.speculation_auto and service_async_scheduling(device):
        proposer = None
    return proposer, config.speculation_policy == "adaptive"


def to_plan(step: ScheduledStep) -> StepPlan:
    return StepPlan(
        new=[
            NewSequence(
                new.request.request_id,
                new.request.all_token_ids,
                new.request.num_prompt_tokens,
                new.num_cached,
                new.num_new,
                [list(table) for table in new.request.block_tables],
                new.request.sampling,
            )
            for new in step.new
        ],
        running=[
            RunningSequence(r.request.request_id, r.num_new, r.new_blocks, list(r.draft_token_ids))
            for r in step.running
        ],
        finished_ids=step.finished_ids,
    )


# What a caller sees after each step's result is applied: the requests that got tokens.
OnUpdate = Callable[[list[RequestUpdate]], None]


class OfflineEngine:
    def __init__(
        self,
        runner: ModelRunner,
        limits: SchedulerLimits,
        async_scheduling: bool = False,
        proposer: Proposer | None = None,
        adaptive_speculation: bool = True,
    ) -> None:
        """Prefix caching is on or off as limits.enable_prefix_caching says. proposer:
        speculative decoding's (None: off); it runs synchronously, as the service's engine;
        adaptive_speculation as the Scheduler's."""
        self.runner = runner
        self.async_scheduling = async_scheduling and proposer is None
        windows = tuple(group.window for group in runner.kv_cache_groups)
        pool = BlockPool(runner.num_blocks)
        kv = KVCacheManager(pool, runner.block_size, runner.fingerprint, windows)
        self.scheduler = Scheduler(
            limits,
            kv,
            runner.max_model_len,
            frozenset(runner.eos_token_ids),
            proposer=proposer,
            adaptive_speculation=adaptive_speculation,
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
        self.run(list(requests.values()))
        return {rid: r.output_token_ids for rid, r in requests.items()}

    def run(self, requests: list[Request], on_update: OnUpdate | None = None) -> None:
        """Runs the requests to their end. on_update sees each step's outcome and may abort
        requests (as the tokenizer does on a stop string)."""
        for request in requests:
            self.scheduler.add(request)
        if self.async_scheduling:
            self._run_async(on_update)
            return
        while self.scheduler.has_work():
            step = self.scheduler.schedule()
            self._update(self.runner.execute(to_plan(step)), on_update)

    def _run_async(self, on_update: OnUpdate | None) -> None:
        """At most one step queued behind the one the runner computes (engine.py's loop)."""
        with ThreadPoolExecutor(1, thread_name_prefix="model-step") as pool:
            in_flight: deque[Future[list[Sampled]]] = deque()
            while True:
                step = self.scheduler.schedule() if self.scheduler.has_work() else None
                sent = step is not None and not step.is_empty
                if sent:
                    in_flight.append(pool.submit(self.runner.execute, to_plan(step)))
                if not in_flight:
                    return
                if len(in_flight) == 2 or not sent:
                    self._update(in_flight.popleft().result(), on_update)

    def _update(self, sampled: list[Sampled], on_update: OnUpdate | None) -> None:
        updated = self.scheduler.update(
            [Sample(s.request_id, s.token_id, error=s.error) for s in sampled]
        )
        if on_update is not None:
            on_update(updated)
