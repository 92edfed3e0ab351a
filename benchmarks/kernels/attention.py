"""Paged attention kernels against torch on the same GPU, with the device's own ceilings:

    python -m benchmarks.kernels.attention [--dtype bfloat16] [--head-dims 64,128]
    python -m benchmarks.kernels.attention --dry-run   # tiny shapes, CPU, TRITON_INTERPRET=1

Decode is memory-bound: GB/s = K and V bytes of every context / time, against the worker's
torch path (gather the blocks, then SDPA) and the copy bandwidth measured at the start.
Prefill is compute-bound: TFLOP/s with causal FLOPs = 4 * B * Hq * S^2 * D / 2, against
torch's SDPA (is_causal, on contiguous K/V: no paging) and a measured bf16 matmul.
Every row is checked against the torch result first; the script exits 1 on a disagreement.
The dry run proves the script and kernels run; its timings measure the interpreter."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS = 32, 8  # Llama-3.2-1B (D=64) and Llama-3-8B (D=128)
BLOCK_SIZE = 16  # the worker's default


def seconds(fn: Callable[[], object], dry_run: bool) -> float:
    """Median time on the GPU (do_bench: warm-up, L2 flushed); one plain call in a dry run."""
    if dry_run:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3


def ceilings(device: str, dtype: torch.dtype, dry_run: bool) -> tuple[float, float]:
    """Measured copy GB/s (read + write) and matmul TFLOP/s of this device, this run."""
    n = 1 << 12 if dry_run else 1 << 28  # 1 GiB of bf16 on a GPU
    src = torch.empty(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    copy_s = seconds(lambda: dst.copy_(src), dry_run)
    m = 64 if dry_run else 8192
    a = torch.randn(m, m, dtype=dtype, device=device)
    mm_s = seconds(lambda: a @ a, dry_run)
    return 2 * src.numel() * src.element_size() / copy_s / 1e9, 2 * m**3 / mm_s / 1e12


def paged(batch: int, context: int, head_dim: int, dtype: torch.dtype, device: str) -> tuple:
    """A cache holding `batch` sequences of `context` tokens in shuffled blocks."""
    per_seq = -(-context // BLOCK_SIZE)
    shape = (batch * per_seq, BLOCK_SIZE, NUM_KV_HEADS, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(batch * per_seq, device=device).view(batch, per_seq)
    lens = torch.full((batch,), context, dtype=torch.int64, device=device)
    return k_cache, v_cache, tables, lens


def decode_row(batch: int, context: int, head_dim: int, dtype: torch.dtype, args) -> tuple:
    from services.worker.kernels.decode_attention import decode_attention
    from services.worker.layers.kv_cache import gather_blocks

    device = "cpu" if args.dry_run else "cuda"
    if context % BLOCK_SIZE:
        raise ValueError(f"decode contexts must be whole blocks of {BLOCK_SIZE}, got {context}")
    k_cache, v_cache, tables, lens = paged(batch, context, head_dim, dtype, device)
    q = torch.randn(batch, NUM_HEADS, head_dim, dtype=dtype, device=device)
    group = NUM_HEADS // NUM_KV_HEADS

    def kernel() -> torch.Tensor:
        return decode_attention(q, k_cache, v_cache, tables, lens, max_context_len=context)

    def torch_path() -> torch.Tensor:  # attention.py's decode; context is whole blocks: no mask
        keys, values = gather_blocks(k_cache, tables), gather_blocks(v_cache, tables)
        q_rows = q.view(batch, NUM_KV_HEADS, group, head_dim)
        return F.scaled_dot_product_attention(q_rows, keys, values).reshape(q.shape)

    error = (kernel().float() - torch_path().float()).abs().max().item()
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * head_dim * q.element_size()
    rates = [kv_bytes / seconds(fn, args.dry_run) / 1e9 for fn in (kernel, torch_path)]
    return rates, error


def prefill_row(seq_len: int, head_dim: int, dtype: torch.dtype, args) -> tuple:
    from services.worker.kernels.prefill_attention import prefill_attention

    device = "cpu" if args.dry_run else "cuda"
    batch = max(1, args.prefill_tokens // seq_len)
    k_cache, v_cache, tables, lens = paged(batch, seq_len, head_dim, dtype, device)
    q = torch.randn(batch * seq_len, NUM_HEADS, head_dim, dtype=dtype, device=device)
    cu_seqlens = torch.arange(0, batch + 1, device=device) * seq_len
    # The same keys, contiguous, for SDPA: [B, Hkv, S, D].
    positions = torch.arange(seq_len, device=device)
    blocks = tables[:, positions // BLOCK_SIZE]
    keys = k_cache[blocks, positions % BLOCK_SIZE].transpose(1, 2).contiguous()
    values = v_cache[blocks, positions % BLOCK_SIZE].transpose(1, 2).contiguous()
    q_sdpa = q.view(batch, seq_len, NUM_HEADS, head_dim).transpose(1, 2).contiguous()

    def kernel() -> torch.Tensor:
        return prefill_attention(
            q, k_cache, v_cache, cu_seqlens, lens, tables, max_query_len=seq_len
        )

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q_sdpa, keys, values, is_causal=True, enable_gqa=True)

    expected = sdpa().transpose(1, 2).reshape(q.shape)
    error = (kernel().float() - expected.float()).abs().max().item()
    flops = 4 * batch * NUM_HEADS * seq_len**2 * head_dim / 2
    rates = [flops / seconds(fn, args.dry_run) / 1e12 for fn in (kernel, sdpa)]
    return rates, error


def error_allowed(dtype: torch.dtype) -> float:
    """Both sides round to dtype (weights and outputs): a few ulps of values of size ~1."""
    return 1e-4 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels.attention")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--batches", default="1,16,64", help="decode batch sizes")
    p.add_argument("--contexts", default="512,2048,8192", help="decode context lengths")
    p.add_argument("--seq-lens", default="1024,2048,4096,8192", help="prefill lengths")
    p.add_argument("--prefill-tokens", type=int, default=16384, help="tokens per prefill batch")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, in the interpreter")
    args = p.parse_args(argv)
    if args.dry_run:
        # Whole blocks: the torch path below treats every gathered key as real.
        args.batches, args.contexts, args.seq_lens = "1,3", "16,48", "16,40"
        args.head_dims, args.prefill_tokens = "64", 40
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
        dtype, device = torch.float32, "cpu"
    elif not torch.cuda.is_available():
        print("attention needs a CUDA device; --dry-run checks it on the CPU", file=sys.stderr)
        return 1
    else:
        dtype, device = getattr(torch, args.dtype), "cuda"
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    copy_gbps, matmul_tflops = ceilings(device, dtype, args.dry_run)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (interpreter)'}")
    print(f"measured ceilings: copy {copy_gbps:.3g} GB/s, matmul {matmul_tflops:.3g} TFLOP/s\n")
    failed = False
    print("| decode | batch | context | D | kernel GB/s | torch GB/s | % of copy | max err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for head_dim in ints(args.head_dims):
        for batch in ints(args.batches):
            for context in ints(args.contexts):
                (ours, theirs), error = decode_row(batch, context, head_dim, dtype, args)
                failed |= error > error_allowed(dtype)
                print(f"| decode | {batch} | {context} | {head_dim} | {ours:.4g} | {theirs:.4g} "
                      f"| {100 * ours / copy_gbps:.0f}% | {error:.1e} |")  # fmt: skip
    print("\n| prefill | seq len | batch | D | kernel TFLOP/s | SDPA TFLOP/s | % of matmul "
          "| max err |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for head_dim in ints(args.head_dims):
        for seq_len in ints(args.seq_lens):
            (ours, theirs), error = prefill_row(seq_len, head_dim, dtype, args)
            failed |= error > error_allowed(dtype)
            batch = max(1, args.prefill_tokens // seq_len)
            print(f"| prefill | {seq_len} | {batch} | {head_dim} | {ours:.4g} | {theirs:.4g} "
                  f"| {100 * ours / matmul_tflops:.0f}% | {error:.1e} |")  # fmt: skip
    if failed:
        print("a kernel disagrees with torch (max err above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
