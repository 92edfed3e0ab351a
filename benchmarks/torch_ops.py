"""The torch path's non-matmul ops of one Llama layer: the references (torch_attention.py), the
fewer-op versions the worker runs (layers/torch_ops.py), and the same under torch.compile.

    PYTHONPATH=. .venv/bin/python -m benchmarks.torch_ops [--tokens 1 16]

One layer's set at SmolLM2-135M's shapes (d 576, 9 q / 3 kv heads of 64, MLP 1536): two
residual adds, two RMSNorms, RoPE on q and k (views of the fused qkv output), SiLU-mul. One torch
thread, timed by this thread's CPU time (a busy machine's other processes do not count), median
of 5 runs of 400. torch.compile's first call (the compile) is reported apart."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.machine import load_average, machine
from services.worker.layers import torch_attention as reference
from services.worker.layers import torch_ops

D, H, HKV, HEAD, FFN, POSITIONS = 576, 9, 3, 64, 1536, 2048


def layer_ops(tokens: int, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """name -> one layer's non-matmul ops on fixed random inputs."""
    x, w = torch.randn(tokens, D).to(dtype), torch.randn(D).to(dtype)
    qkv = torch.randn(tokens, (H + 2 * HKV) * HEAD).to(dtype)
    gate_up = torch.randn(tokens, 2 * FFN).to(dtype)
    angles = torch.randn(POSITIONS, HEAD)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.randint(POSITIONS, (tokens,))
    ref_rotary = (cos[positions].unsqueeze(1).to(dtype), sin[positions].unsqueeze(1).to(dtype))
    rotary = torch_ops.rope_tables(cos, sin, positions, dtype)

    def q_k() -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = qkv.split([H * HEAD, HKV * HEAD, HKV * HEAD], dim=-1)
        return q.view(tokens, H, HEAD), k.view(tokens, HKV, HEAD)

    def run_reference() -> object:
        h = x + x
        reference.rms_norm(h, w, 1e-5)
        q, k = q_k()
        reference.apply_rotary(q, *ref_rotary), reference.apply_rotary(k, *ref_rotary)
        gate, up = gate_up.clone().chunk(2, dim=-1)  # the clone as on the other side
        F.silu(gate) * up
        return reference.rms_norm(h + x, w, 1e-5)

    def run_fused(ops: tuple[Callable, Callable, Callable] = (
        torch_ops.rms_norm, torch_ops.apply_rope, torch_ops.silu_mul
    )) -> object:  # fmt: skip
        norm, rope, silu_mul = ops
        h = x + x
        norm(h, w, 1e-5)
        q, k = q_k()
        rope(q, *rotary), rope(k, *rotary)
        silu_mul(gate_up.clone())  # in place: on gate_up itself, repeated, it would decay
        return norm(h + x, w, 1e-5)

    compiled = tuple(
        torch.compile(op, dynamic=False)
        for op in (torch_ops.rms_norm, torch_ops.apply_rope, torch_ops.silu_mul)
    )
    return {
        "reference": run_reference,
        "torch_ops (the worker's)": run_fused,
        "torch.compile of torch_ops": lambda: run_fused(compiled),
    }


def cpu_us(fn: Callable[[], object], calls: int = 400, reps: int = 5) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(reps):
        started = time.thread_time()
        for _ in range(calls):
            fn()
        times.append((time.thread_time() - started) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.torch_ops")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    print("| dtype | tokens | ops | µs per layer (CPU) | x30 layers | vs reference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype in (torch.float32, torch.bfloat16):
        for tokens in args.tokens:
            ops = layer_ops(tokens, dtype)
            started = time.perf_counter()
            ops["torch.compile of torch_ops"]()
            compile_s = time.perf_counter() - started
            base = None
            for name, fn in ops.items():
                us = cpu_us(fn)
                base = base or us
                cells = [str(dtype).removeprefix("torch."), str(tokens), name, f"{us:.1f}"]
                cells += [f"{us * 30 / 1000:.2f} ms", f"{us / base:.2f}x"]
                print("| " + " | ".join(cells) + " |", flush=True)
            print(f"(torch.compile's first call, the compile: {compile_s:.1f} s wall)")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
