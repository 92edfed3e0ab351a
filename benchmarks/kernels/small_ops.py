"""Memory bandwidth (GB/s) of the worker's small Triton kernels against the torch code they
replace, at the shapes of real models:

    python -m benchmarks.kernels.small_ops [--tokens 1,32,512,4096] [--dtype bfloat16]
    python -m benchmarks.kernels.small_ops --dry-run   # tiny shapes, CPU, TRITON_INTERPRET=1

These ops are memory-bound, so GB/s (bytes each must read and write / time) says how close
each comes to the device's bandwidth. The dry run proves the script and the kernels run and
agree with the references; its timings measure the interpreter and mean nothing."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int


EPS = 1e-5
MODELS = {
    "smollm2-135m": ModelShape("smollm2-135m", 576, 1536, 9, 3, 64),
    "llama3-8b": ModelShape("llama3-8b", 4096, 14336, 32, 8, 128),
}


@dataclass(frozen=True, slots=True)
class Case:
    """One op at one shape: the kernel, the torch code it replaces, the bytes either moves."""

    op: str
    kernel: Callable[[], object]
    torch_ref: Callable[[], object]
    bytes_moved: int


def cases(shape: ModelShape, tokens: int, dtype: torch.dtype, device: str) -> list[Case]:
    # Imported here, after main() has set TRITON_INTERPRET for a dry run.
    from services.worker.kernels.rms_norm import (
        add_rms_norm,
        add_rms_norm_ref,
        rms_norm,
        rms_norm_ref,
    )
    from services.worker.kernels.silu_mul import silu_mul, silu_mul_ref

    size = torch.empty((), dtype=dtype).element_size()
    new = lambda *dims: torch.randn(*dims, device=device, dtype=dtype)  # noqa: E731
    x, residual, weight = new(tokens, shape.hidden), new(tokens, shape.hidden), new(shape.hidden)
    gate_up = new(tokens, 2 * shape.intermediate)
    row_bytes = tokens * shape.hidden * size
    return [
        Case(
            "rms_norm",
            lambda: rms_norm(x, weight, EPS),
            lambda: rms_norm_ref(x, weight, EPS),
            2 * row_bytes + shape.hidden * size,  # x in, out; the weight once
        ),
        Case(
            "add_rms_norm",
            lambda: add_rms_norm(x, residual, weight, EPS),
            lambda: add_rms_norm_ref(x, residual, weight, EPS),
            4 * row_bytes + shape.hidden * size,  # x, residual in; normed, sum out
        ),
        Case(
            "silu_mul",
            lambda: silu_mul(gate_up),
            lambda: silu_mul_ref(gate_up),
            3 * tokens * shape.intermediate * size,  # gate, up in; product out
        ),
        _rope_case(shape, tokens, dtype, device),
        _cache_write_case(shape, tokens, dtype, device),
    ]


def _rope_case(shape: ModelShape, tokens: int, dtype: torch.dtype, device: str) -> Case:
    from services.worker.kernels.rope import apply_rope, rope_cos_sin
    from services.worker.layers.torch_attention import apply_rotary

    q = torch.randn(tokens, shape.heads, shape.head_dim, device=device, dtype=dtype)
    k = torch.randn(tokens, shape.kv_heads, shape.head_dim, device=device, dtype=dtype)
    positions = torch.randint(0, 4096, (tokens,), device=device)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, shape.head_dim, 2) / shape.head_dim)
    cos, sin = rope_cos_sin(inv_freq, 4096, device)
    cos_full, sin_full = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)

    def model_rope() -> object:  # llama.py: table lookup, then apply_rotary to q and k
        c, s = (
            cos_full[positions].unsqueeze(1).to(dtype),
            sin_full[positions].unsqueeze(1).to(dtype),
        )
        return apply_rotary(q, c, s), apply_rotary(k, c, s)

    elements = tokens * (shape.heads + shape.kv_heads) * shape.head_dim
    table_bytes = 2 * tokens * (shape.head_dim // 2) * 4 + tokens * 8
    size = q.element_size()
    return Case(
        "rope",
        lambda: apply_rope(q, k, positions, cos, sin),
        model_rope,
        2 * elements * size + table_bytes,
    )


def _cache_write_case(shape: ModelShape, tokens: int, dtype: torch.dtype, device: str) -> Case:
    from services.worker.kernels.cache_write import write_kv_cache

    block_size = 16
    num_blocks = tokens // block_size + 1
    # Separate caches for the kernel and torch, so that the dry run can compare them.
    caches = [
        torch.zeros(
            num_blocks, block_size, shape.kv_heads, shape.head_dim, device=device, dtype=dtype
        )
        for _ in range(4)
    ]
    k = torch.randn(tokens, shape.kv_heads, shape.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]

    def kernel() -> object:
        write_kv_cache(k, v, caches[0], caches[1], slots)
        return caches[0], caches[1]

    def index_copy() -> object:  # PagedKVCache.write
        for new, cache in ((k, caches[2]), (v, caches[3])):
            cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, new)
        return caches[2], caches[3]

    moved = 4 * k.numel() * k.element_size() + tokens * 8
    return Case("cache_write", kernel, index_copy, moved)


def max_error(a: object, b: object) -> float:
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    return max(float((x.float() - y.float()).abs().max()) if x.numel() else 0.0 for x, y in pairs)


def max_error_allowed(dtype: torch.dtype) -> float:
    """Outputs reach a few units; allow some units in their last place (the tests are tighter)."""
    return max(16 * torch.finfo(dtype).eps, 1e-4)


def seconds(fn: Callable[[], object], dry_run: bool) -> float:
    """Median time of fn on the GPU (triton's do_bench: warm-up, L2 flushed between runs);
    one plain call in a dry run."""
    if dry_run:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels.small_ops")
    p.add_argument("--tokens", default="1,32,512,4096", help="comma-separated batch sizes")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    p.add_argument("--models", default=",".join(MODELS), help=f"from {', '.join(MODELS)}")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, in the interpreter")
    args = p.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
        tokens, dtype, device, models = [1, 3], torch.float32, "cpu", ["smollm2-135m"]
    elif not torch.cuda.is_available():
        print("small_ops needs a CUDA device; --dry-run checks it on the CPU", file=sys.stderr)
        return 1
    else:
        tokens = [int(t) for t in args.tokens.split(",")]
        dtype, device, models = getattr(torch, args.dtype), "cuda", args.models.split(",")
    print("| op | model | tokens | dtype | kernel GB/s | torch GB/s | speed-up | max abs err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = False
    for model in models:
        for count in tokens:
            for case in cases(MODELS[model], count, dtype, device):
                error = max_error(case.kernel(), case.torch_ref())
                failed |= error > max_error_allowed(dtype)
                kernel_s = seconds(case.kernel, args.dry_run)
                torch_s = seconds(case.torch_ref, args.dry_run)
                gbps = [f"{case.bytes_moved / t / 1e9:.1f}" for t in (kernel_s, torch_s)]
                print(
                    f"| {case.op} | {model} | {count} | {str(dtype).removeprefix('torch.')} "
                    f"| {gbps[0]} | {gbps[1]} | {torch_s / kernel_s:.2f}x | {error:.2e} |"
                )
    if failed:
        print("a kernel disagrees with its torch reference (max abs err above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
