"""Whole-model decode (L1) with random weights: the worker's ModelRunner against Hugging Face
LlamaForCausalLM holding the very same weights, greedy, same batch and lengths, same device.

For the runner: output tok/s of the decode steps and end to end (prefill included), MBU
(weight + KV bytes one decode step reads / step time / the measured copy bandwidth), and the
share of the decode wall time the GPU is busy (kernel time from torch.profiler). For HF:
generate()'s end-to-end tok/s and its decode-only tok/s (minus a 1-token generate)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from services.worker.model.config import Llama3RopeScaling, LlamaConfig

LLAMA3_SCALING = Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
SHAPES = {  # the published config.json of each model
    "smollm2-135m": LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=True, eos_token_ids=(),
    ),
    "llama-3.2-1b": LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=131072, tie_word_embeddings=True, eos_token_ids=(),
        rope_scaling=LLAMA3_SCALING,
    ),
}  # fmt: skip
TINY = LlamaConfig(
    vocab_size=256, hidden_size=128, intermediate_size=192, num_layers=2, num_heads=2,
    num_kv_heads=1, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5,
    max_position_embeddings=512, tie_word_embeddings=True, eos_token_ids=(),
    rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 64),
)  # fmt: skip
BLOCK_SIZE = 16
MAX_POSITIONS = 4096  # the RoPE table; prompts + outputs stay far below


@dataclass(frozen=True, slots=True)
class Workload:
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int


def hf_model(config: LlamaConfig, dtype: torch.dtype, device: str):
    """A randomly initialised LlamaForCausalLM of this shape (HF's own init), on `device`."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    scaling = config.rope_scaling
    hf_config = HFConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_scaling=None if scaling is None else {
            "rope_type": "llama3", "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        },
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(hf_config)
    return model.to(dtype).eval()


def runner_from(
    hf,
    config: LlamaConfig,
    dtype: torch.dtype,
    device: str,
    kernels: str,
    need: int,
    graph_max_batch: int = 0,
):
    """The worker's ModelRunner over our LlamaModel holding `hf`'s weights (or random ones);
    decode steps of up to graph_max_batch sequences replay CUDA graphs (0: eager), once the
    caller has captured them (runner.capture_decode_graphs())."""
    from services.worker.engine.model_runner import ModelRunner
    from services.worker.layers.attention_backends import choose_attention_backend
    from services.worker.layers.kv_cache import PagedKVCache
    from services.worker.model.llama import LlamaModel
    from services.worker.model.loaded import LoadedModel

    model = LlamaModel(config, dtype, device, max_positions=MAX_POSITIONS)
    with torch.no_grad():
        if hf is not None:
            model.load_hf_weights(
                (name.removeprefix("model."), t) for name, t in hf.state_dict().items()
            )
        else:
            for param in model.parameters():
                param.normal_(0.0, 0.02)
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
    model.eval()
    loaded = LoadedModel(config=config, model=model, fingerprint="random", path=Path("random"))
    cache = PagedKVCache(config, need, BLOCK_SIZE, dtype, torch.device(device))
    backend = choose_attention_backend(kernels, torch.device(device), config.head_dim)
    return ModelRunner(
        loaded, cache, max_model_len=MAX_POSITIONS, model_name="random", backend=backend,
        cuda_graph_max_batch=graph_max_batch,
    )  # fmt: skip


def weight_bytes(config: LlamaConfig, dtype: torch.dtype) -> int:
    """What one decode step reads of the weights: every matrix once; an untied embedding table
    is only gathered (a few rows), so it does not count."""
    size = torch.empty((), dtype=dtype).element_size()
    layer = (
        config.hidden_size * (config.q_size + 2 * config.kv_size)
        + config.q_size * config.hidden_size
        + 3 * config.hidden_size * config.intermediate_size
        + 2 * config.hidden_size
    )
    return size * (config.num_layers * layer + config.vocab_size * config.hidden_size)


def kv_bytes(config: LlamaConfig, dtype: torch.dtype, tokens: int) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.kv_size * size * tokens


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def busy_share(step, device: str, steps: int) -> float | None:
    """Kernel time / wall time over `steps` calls of step(), from torch.profiler; None on CPU."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:  # on the CPU too: a dry run checks the path
        started = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        wall = time.perf_counter() - started
    kernel_us = sum(
        e.device_time_total
        for e in prof.events()
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
    )
    return kernel_us / 1e6 / wall if cuda else None


class _Batch:
    """One batch of random prompts driven through a ModelRunner like the scheduler would: a
    prefill step for all, then one decode step at a time, blocks allocated as they fill."""

    def __init__(self, runner, prompts: list[list[int]], tag: str, options=None) -> None:
        """options: one SamplingOptions per prompt (default: greedy)."""
        from services.common.sampling import SamplingOptions
        from services.worker.engine.plan import NewSequence, StepPlan

        self.runner, self.ids = runner, [f"{tag}-{i}" for i in range(len(prompts))]
        self.lens = [len(p) for p in prompts]
        self.blocks: dict[str, list[int]] = {}
        self.free = list(range(runner.num_blocks))
        new = []
        options = options or [SamplingOptions()] * len(prompts)
        for rid, prompt, sampling in zip(self.ids, prompts, options, strict=True):
            self.blocks[rid] = self._take(-(-len(prompt) // BLOCK_SIZE))
            table = [self.blocks[rid]]
            new.append(NewSequence(rid, prompt, len(prompt), 0, len(prompt), table, sampling))
        self.tokens = [[] for _ in prompts]
        self._record(runner.execute(StepPlan(new=new)))

    def _take(self, count: int) -> list[int]:
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def _record(self, sampled) -> None:
        by_id = {s.request_id: s.token_id for s in sampled}
        for i, rid in enumerate(self.ids):
            self.tokens[i].append(by_id[rid])
            self.lens[i] += 1

    def step(self) -> None:
        from services.worker.engine.plan import RunningSequence, StepPlan

        running = []
        for i, rid in enumerate(self.ids):
            grow = self._take(1) if self.lens[i] > len(self.blocks[rid]) * BLOCK_SIZE else []
            self.blocks[rid].extend(grow)
            running.append(RunningSequence(rid, 1, [grow]))
        self._record(self.runner.execute(StepPlan(running=running)))

    def finish(self) -> None:
        from services.worker.engine.plan import StepPlan

        self.runner.execute(StepPlan(finished_ids=list(self.ids)))


def ours(runner, prompts: list[list[int]], new_tokens: int, device: str, tag: str) -> dict:
    """Timed generation on the runner; the busy share over a second, profiled run."""
    sync(device)
    started = time.perf_counter()
    batch = _Batch(runner, prompts, tag)
    sync(device)
    decode_started = time.perf_counter()
    for _ in range(new_tokens - 1):
        batch.step()
    sync(device)
    done = time.perf_counter()
    tokens, lens = batch.tokens, list(batch.lens)
    batch.finish()
    profiled = _Batch(runner, prompts, tag + "p")
    share = busy_share(profiled.step, device, min(new_tokens - 1, 16))
    profiled.finish()
    steps = max(new_tokens - 1, 1)
    return {
        "tokens": tokens,
        "e2e_s": done - started,
        "step_s": (done - decode_started) / steps,
        "mean_context": (sum(lens) - len(lens) * new_tokens / 2) / len(lens),
        "busy_share": share,
    }


def hf_generate(hf, prompts: list[list[int]], new_tokens: int, device: str) -> dict:
    """generate(): greedy, exactly new_tokens per sequence, equal-length prompts (no padding)."""
    ids = torch.tensor(prompts, device=device)
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}

    def run(n: int) -> tuple[torch.Tensor, float]:
        sync(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        sync(device)
        return out, time.perf_counter() - started

    run(2)  # warm-up
    out, e2e = run(new_tokens)
    _, prefill = run(1)
    steps = max(new_tokens - 1, 1)
    return {
        "tokens": out[:, ids.shape[1] :].tolist(),
        "e2e_s": e2e,
        "step_s": (e2e - prefill) / steps,
    }


def measure(
    name: str, config: LlamaConfig, work: Workload, dtype, device, copy_gbps, on_row=None
) -> list:
    """One row per batch size: ours (runner, triton kernels) beside HF on the same weights.
    on_row(row) is called as each row is measured (the GPU check saves it at once)."""
    try:
        hf = hf_model(config, dtype, device)
        hf_error = None
    except ImportError as err:  # transformers absent: the runner still runs, on its own weights
        hf, hf_error = None, f"NOT RUN: {err}"
    largest = max(work.batches)
    need = largest * (-(-(work.prompt_len + work.new_tokens) // BLOCK_SIZE) + 1)
    runners = {
        "eager": runner_from(hf, config, dtype, device, "triton", need),
        "cuda graphs": runner_from(hf, config, dtype, device, "triton", need, largest),
    }
    capture_s = {}
    for mode, runner in runners.items():  # reported, never inside a timed region
        started = time.perf_counter()
        runner.capture_decode_graphs()
        capture_s[mode] = round(time.perf_counter() - started, 2)
    gen = torch.Generator().manual_seed(1)
    rows = []
    for batch in work.batches:
        prompts = torch.randint(1, config.vocab_size, (batch, work.prompt_len), generator=gen)
        prompts = prompts.tolist()
        theirs = hf_generate(hf, prompts, work.new_tokens, device) if hf is not None else None
        for mode, runner in runners.items():
            warm = _Batch(runner, prompts, f"w{batch}")  # compiles this batch's kernel variants
            for _ in range(2):
                warm.step()
            warm.finish()
            mine = ours(runner, prompts, work.new_tokens, device, f"b{batch}")
            rows.append(_row(name, config, work, dtype, copy_gbps, batch, mine, theirs, hf_error))
            rows[-1]["mode"] = mode
            rows[-1]["graphs_captured"] = runner.cuda_graph_sizes
            rows[-1]["capture_s"] = capture_s[mode]
            if on_row is not None:
                on_row(rows[-1])
    return rows


def _row(name, config, work, dtype, copy_gbps, batch, mine, theirs, hf_error) -> dict:
    step_bytes = weight_bytes(config, dtype) + kv_bytes(
        config, dtype, int(mine["mean_context"] * batch)
    )
    same = None
    if theirs is not None:
        same = sum(a == b for a, b in zip(mine["tokens"], theirs["tokens"], strict=True))
    return {
        "model": name, "batch": batch, "prompt_len": work.prompt_len,
        "new_tokens": work.new_tokens,
        "ours_decode_tok_s": batch / mine["step_s"],
        "ours_e2e_tok_s": batch * work.new_tokens / mine["e2e_s"],
        "ours_step_ms": 1e3 * mine["step_s"],
        "mbu": step_bytes / mine["step_s"] / 1e9 / copy_gbps,
        "busy_share": mine["busy_share"],
        "hf_decode_tok_s": None if theirs is None else batch / max(theirs["step_s"], 1e-9),
        "hf_e2e_tok_s": None if theirs is None else batch * work.new_tokens / theirs["e2e_s"],
        "greedy_same_as_hf": None if same is None else f"{same}/{batch}",
        "hf": hf_error or "ran",
    }  # fmt: skip
