"""Where a batch-1 decode step's time goes: matmuls, attention, and the rest (host work).

    PYTHONPATH=. .venv/bin/python -m benchmarks.step_profile [--steps 64] [--prompt 128]
        [--batch 1] [--dtype bfloat16] [--quantization int8|int4|gguf|none] [--threads 1]

The bundled SmolLM2-135M GGUF, as the worker would hold it (--dtype, --quantization; the tied
embedding/head quantized with the rest when --head-int8), on the worker's ModelRunner with its
default CPU attention backend: one --prompt-token prompt per sequence prefilled (untimed), then
--steps decode steps timed by this thread's CPU time (one torch thread: every op runs on it, and
the time other processes held the core is not counted), in 8 rounds; after each round one
step's matmul ops (the linears, int8/int4 kernels, the output head) and its attention op (the
paged attention op, or SDPA on the torch path), captured once, are replayed alone and timed.
Host work is a round's step time minus its replays; each part is the median over the rounds,
and the host share's range over them is printed (a VM's speed drifts: timing the steps first
and the replays a minute later moved the share between 5% and 30%). Then 16 steps under
torch.profiler give the top host ops by self time."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.machine import load_average, machine
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import default_path, load_model
from services.worker.model.quant import quantize_loaded

BLOCK_SIZE = 16
CPU = torch.device("cpu")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int4pack_mm",
              "aten::matmul", "aten::linear", "layerserve::q4_linear",
              "layerserve::q8_0_linear", "layerserve::q4_q16_linear", "layerserve::q4_q8_linear",
              "layerserve::q8_0_q16_linear", "layerserve::q8_0_q8_linear")  # fmt: skip
# The C++ layer loop calls its ops' functions directly (csrc/layer_ops.h), so the profiler sees
# one op whose self time holds the linears and attention: it is left out of the host ops' list.
LAYER_LOOP = "layerserve::llama_layers"
ATTENTION_OPS = ("layerserve::paged_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::scaled_dot_product_attention")  # fmt: skip


def build_runner(args: argparse.Namespace) -> tuple[ModelRunner, list[str]]:
    loaded = load_model(default_path(), dtype=torch.float32, device=CPU)
    dtype = getattr(torch, args.dtype)
    if dtype != torch.float32:
        for param in loaded.model.parameters():
            param.data = param.data.to(dtype)
    if args.quantization != "none":
        loaded = quantize_loaded(loaded, args.quantization, embeddings=args.head_int8)
    per_seq = -(-(args.prompt + args.steps * 3 + 4) // BLOCK_SIZE)
    cache = PagedKVCache(loaded.config, per_seq * args.batch, BLOCK_SIZE, dtype, CPU)
    backend = choose_attention_backend("auto", CPU, loaded.config.head_dim)
    runner = ModelRunner(loaded, cache, max_model_len=4096, model_name="p", backend=backend)
    generator = torch.Generator().manual_seed(0)
    ids = [f"s{i}" for i in range(args.batch)]
    new = []
    for i, rid in enumerate(ids):
        prompt = torch.randint(loaded.config.vocab_size, (args.prompt,), generator=generator)
        table = [list(range(i * per_seq, (i + 1) * per_seq))]
        new.append(NewSequence(rid, prompt.tolist(), args.prompt, 0, args.prompt, table))
    runner.execute(StepPlan(new=new))
    return runner, ids


def decode(runner: ModelRunner, ids: list[str], steps: int) -> None:
    for _ in range(steps):
        runner.execute(StepPlan(running=[RunningSequence(rid, 1, [[]]) for rid in ids]))


class _Capture(TorchDispatchMode):
    """Records the matmul and attention ops one step dispatches, with their arguments, and
    counts every op."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, list] = {"matmul": [], "attention": []}
        self.ops = 0  # every op dispatched from Python (or an extension op's one call)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        kind = _kind(func.name())
        if kind is not None:
            self.calls[kind].append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _kind(name: str) -> str | None:
    base = name.split(".")[0]
    if base in MATMUL_OPS:
        return "matmul"
    return "attention" if base in ATTENTION_OPS else None


def replay_ms(calls: list, reps: int) -> float:
    """CPU ms of one step's worth of these calls, each replayed alone (median of reps)."""
    times = []
    for _ in range(reps):
        started = time.thread_time()
        for func, args, kwargs in calls:
            func(*args, **kwargs)
        times.append(time.thread_time() - started)
    return statistics.median(times) * 1e3


@dataclasses.dataclass
class Split:
    step_ms: float
    matmul_ms: float
    attention_ms: float
    top_host: list[tuple[str, float, int]]  # (op, profiled self ms per step, calls per step)
    ops: int = 0  # ops one step dispatches
    host_shares: list[float] = dataclasses.field(default_factory=list)  # per round, sorted

    @property
    def host_ms(self) -> float:
        return max(self.step_ms - self.matmul_ms - self.attention_ms, 0.0)


def measure(runner: ModelRunner, ids: list[str], steps: int, rounds: int = 8) -> Split:
    """Step CPU time; matmul and attention ops replayed alone; the host ops by profiled time.
    Steps and replays alternate in `rounds` rounds (steps / rounds steps, then one replay of
    each), so that a machine whose speed drifts (a shared VM's does, by 20-30% over a minute)
    moves both alike; each part is the median of its rounds, and the host share's spread over
    the rounds is kept (Split.host_shares)."""
    decode(runner, ids, 4)  # warm-up
    capture = _Capture()
    # The C++ layer loop (csrc/llama_layers.cpp) dispatches its ops from C++, out of a Python
    # mode's sight: the captured step runs the Python loop, which issues the same ops.
    flat = runner.flat_layers
    native = flat.native if flat is not None else None
    try:
        if flat is not None:
            flat.native = None
        with capture:
            decode(runner, ids, 1)
    finally:
        if flat is not None:
            flat.native = native
    per_round = max(steps // rounds, 1)
    step_ms, matmul, attention = [], [], []
    for _ in range(rounds):
        started = time.thread_time()
        decode(runner, ids, per_round)
        step_ms.append((time.thread_time() - started) * 1e3 / per_round)
        matmul.append(replay_ms(capture.calls["matmul"], 1))
        attention.append(replay_ms(capture.calls["attention"], 1))
    shares = [max(s - m - a, 0.0) / s for s, m, a in zip(step_ms, matmul, attention, strict=True)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode(runner, ids, min(steps, 16))
    counted = min(steps, 16)
    host = [
        (e.key, e.self_cpu_time_total / 1e3 / counted, e.count // counted)
        for e in prof.key_averages()
        if _kind(e.key) is None and e.key != LAYER_LOOP
    ]
    host.sort(key=lambda h: -h[1])
    median = statistics.median
    return Split(median(step_ms), median(matmul), median(attention), host[:12], capture.ops,
                 sorted(shares))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_profile")
    p.add_argument("--steps", type=int, default=64, help="decode steps timed (and profiled)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--quantization", default="int8", choices=["none", "int8", "int4", "gguf"],
                   help="gguf: the file's 4-bit weights kept as stored")  # fmt: skip
    p.add_argument("--head-int8", action="store_true", help="the embedding/head in int8 too")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU time needs 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {machine()}; load average {load_average()}")
    runner, ids = build_runner(args)
    gc.freeze()  # as the worker does after its load and warm-up (services/worker/__main__.py)
    with torch.inference_mode():
        split = measure(runner, ids, args.steps)
    step = split.step_ms
    print(f"batch {args.batch}, {args.dtype} + {args.quantization}, prompt {args.prompt}: "
          f"step {step:.2f} ms (thread CPU time, {args.steps} steps), "
          f"{split.ops} ops a step")  # fmt: skip
    for name, ms in (("matmuls + head", split.matmul_ms), ("attention", split.attention_ms),
                     ("host work (the rest)", split.host_ms)):  # fmt: skip
        print(f"  {name:<22} {ms:7.2f} ms  {ms / step:6.1%}")
    shares = split.host_shares
    print(f"  host share per round: median {statistics.median(shares):.1%}, "
          f"{shares[0]:.1%} - {shares[-1]:.1%} over {len(shares)} rounds")  # fmt: skip
    print("top ops outside matmuls and attention (profiled self time per step, calls per step):")
    for key, ms, calls in split.top_host:
        print(f"  {key:<48} {ms:7.3f} ms  x{calls}")


if __name__ == "__main__":
    main()
