"""What the worker's compute dtype costs in quality, beside what it buys in speed, in one run.

    PYTHONPATH=. .venv/bin/python -m benchmarks.dtype_quality [--threads 1] [--cpu-time]
        [--tokens 32] [--batches 1 16]

One float32 load of the bundled SmolLM2-135M-Instruct, then copies in each dtype the worker
can pick (--dtype auto's bfloat16 on a CPU with AVX512-BF16 or AMX; float16; bfloat16 with int8
weights; the file's Q4_1 weights kept 4-bit, on bfloat16 and float32; int4 from the float
weights). Per dtype:
- perplexity of benchmarks/data/public_domain.txt (fixed text, teacher-forced through the
  model's own forward and paged KV cache) and the share of its positions whose top-1 next
  token equals float32's;
- greedy agreement with float32 on the 16 prompts of benchmarks/quantization.py x --tokens
  tokens: tokens before the first divergence (share) and prompts identical throughout;
- decode tok/s at each --batches (the worker's ModelRunner; median of --reps), and at batch 1
  the share of the memory bound: weight bytes / the read bandwidth measured at the start (one
  thread summing 512 MiB, the same clock as the steps) gives the fastest a step can be.
Every side of a comparison runs in its own dtype on the same prompts: float32 is the reference
row, never mixed into another row's run."""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import quantization as q
from benchmarks.machine import load_average, machine
from services.tokenizer.loader import load_tokenizer
from services.worker.model.loader import LoadedModel, default_path, load_model
from services.worker.model.quant import weight_bytes

DTYPES = (
    "float32",
    "bfloat16",
    "float16",
    "bfloat16 + int8 weights",
    "bfloat16 + Q4_1 kept 4-bit",  # --quantization gguf: the CPU default
    "float32 + Q4_1 kept 4-bit",
    "bfloat16 + int4 weights",  # group-wise 4-bit from the float weights
)
_METHODS = {"int8": "int8", "Q4_1": "gguf", "int4": "int4"}


def variant(base: LoadedModel, name: str) -> LoadedModel:
    if name == "float32":
        return base
    dtype = {"float16": torch.float16, "float32": torch.float32}.get(name.split()[0])
    method = next((m for key, m in _METHODS.items() if key in name), "none")
    return q._copy(q._copy(base, dtype or torch.bfloat16, "none"), None, method)


def read_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """Bytes/s one thread reads (a float32 sum over `mib` MiB; median of `reps`, q.CLOCK)."""
    data = torch.ones(mib * 2**20 // 4)
    data.sum()  # pages touched before timing
    times = []
    for _ in range(reps):
        started = q.CLOCK[0]()
        data.sum()
        times.append(q.CLOCK[0]() - started)
    return data.numel() * 4 / sorted(times)[reps // 2]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dtype_quality")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--reps", type=int, default=3, help="decode timings per figure (median)")
    p.add_argument("--steps", type=int, default=8, help="timed decode steps per repetition")
    p.add_argument("--tokens", type=int, default=q.GREEDY_TOKENS, help="greedy tokens a prompt")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--cpu-time", action="store_true", help="as benchmarks.quantization's")
    args = p.parse_args()
    if args.cpu_time and args.threads != 1:
        p.error("--cpu-time needs --threads 1")
    torch.set_num_threads(args.threads)
    q.CLOCK[0] = time.thread_time if args.cpu_time else time.perf_counter
    q.GREEDY_TOKENS = args.tokens
    print(f"machine: {machine()}")
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}")
    tokenizer = load_tokenizer(default_path()).tokenizer
    text = tokenizer.encode(q.TEXT.read_text()).ids
    prompts = [tokenizer.encode(prompt).ids for prompt in q.PROMPTS]
    base = load_model(default_path(), dtype=torch.float32, device=q.CPU)
    bandwidth = read_bandwidth()
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s")
    speeds = " | ".join(f"decode tok/s, batch {b}" for b in args.batches)
    print(
        f"| dtype | perplexity | top-1 = float32 | greedy tokens = float32 "
        f"({len(prompts)} x {args.tokens}) | greedy exact | {speeds} | weights | "
        "batch 1 / memory bound |"
    )
    print("| --- " * (7 + len(args.batches)) + "|")
    reference = None
    base_speed: dict[int, float] = {}
    for name in DTYPES:
        loaded = variant(base, name)
        found, measured = q.quality(loaded, text, prompts, reference)
        reference = reference or measured
        speed = {b: q.decode_tok_s(loaded, b, args.steps, args.reps, "auto") for b in args.batches}
        base_speed = base_speed or speed
        cells = [
            name,
            f"{found['perplexity']:.3f}",
            f"{found['top1_agree']:.1%}",
            f"{found['greedy_prefix']:.1%}",
            f"{int(found['greedy_exact'])}/{len(prompts)}",
        ]
        cells += [f"{speed[b]:.1f} ({speed[b] / base_speed[b]:.2f}x)" for b in args.batches]
        weights = weight_bytes(loaded.model)
        bound = bandwidth / weights  # steps/s if a step only read the weights once
        cells.append(f"{weights / 2**20:.0f} MiB")
        if 1 in speed:
            cells.append(f"{speed[1] / bound:.0%} of {bound:.0f} tok/s")
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
