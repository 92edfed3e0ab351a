"""Causal prefill attention over the paged cache, host side: checks the arguments, launches.

The kernel is in prefill_attention_kernel.py; the cache layout and block tables are described in
attention_inputs.py. Reference: attention_reference.prefill_attention_ref."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.kernels.attention_inputs import (
    cdiv,
    check_out,
    check_paged_kv,
    check_sequences,
    dot_precision,
    qk_scale,
)
from services.worker.kernels.platform_tensors import check_index, check_shape, check_tensor
from services.worker.kernels.prefill_attention_kernel import prefill_attention_kernel


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def prefill_tiles(device: torch.device, head_dim: int, dtype: torch.dtype) -> PrefillTiles:
    """Query rows and keys per step, and launch shape, for the device, head dim and dtype."""
    if device.type == "cpu":
        # The interpreter: 16 x 16 tiles let small test chunks cross tile and step boundaries.
        return PrefillTiles(block_m=16, block_n=16, num_warps=1, num_stages=1)
    # Compiled for sm_90 and read with ptxas -v (python -m tests.kernels.attention_sm90), of
    # BLOCK_M 32..128 x BLOCK_N 16..64 on 4 or 8 warps these are the largest with no register
    # spills. A larger BLOCK_M reuses each gathered K/V step over more rows. fp16/bf16: 128 x 64
    # at D=64 (128 registers), 64 x 32 at D=128 (109). fp32 tiles hold twice the bytes per
    # element, and the fp16/bf16 tiles spill there (128 x 64 at D=64: 255 registers and ~3 KB
    # of spills; 64 x 32 at D=128: ~2 KB); 64 x 32 at D=64 (178 registers) and 32 x 32 at
    # D=128 (210) do not. All on 8 warps. num_stages adds no pipeline buffers for the gathered
    # loads (same shared memory at 1..3), so one stage. Not yet timed on a GPU:
    # benchmarks/kernels/attention.py is where to tune.
    wide = dtype == torch.float32
    if head_dim <= 64:
        if wide:
            return PrefillTiles(block_m=64, block_n=32, num_warps=8, num_stages=1)
        return PrefillTiles(block_m=128, block_n=64, num_warps=8, num_stages=1)
    if wide:
        return PrefillTiles(block_m=32, block_n=32, num_warps=8, num_stages=1)
    return PrefillTiles(block_m=64, block_n=32, num_warps=8, num_stages=1)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float | None = None,
    *,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
    tiles: PrefillTiles | None = None,
) -> torch.Tensor:
    """Causal attention of packed new tokens over their sequences' paged K/V.

    q: [T, Hq, D], sequence s's new tokens in rows cu_seqlens[s]:cu_seqlens[s+1] ([S + 1],
    non-decreasing, within 0..T; it need not start at 0 nor end at T, so a run of consecutive
    sequences of a larger batch can go alone, and rows outside it are left as they are in
    out); k_cache, v_cache:
    [num_blocks, block_size, Hkv, D] holding every key each query sees, the new tokens' own
    included (write them first); context_lens: [S], cached + new tokens; block_tables:
    [S, nb]. New token i of sequence s sits at position context_lens[s] - q_len + i and attends
    to keys 0..that position. Query head h reads KV head h // (Hq // Hkv). scale defaults to
    1/sqrt(D). max_query_len bounds the chunk lengths and sizes the grid; left None it is read
    from cu_seqlens (a device sync). tiles overrides the device's (tests: the CUDA tiles under
    the interpreter; benchmarks). Returns out [T, Hq, D] in q's dtype."""
    kv = check_paged_kv(q, k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    check_tensor("cu_seqlens", cu_seqlens, 1)
    check_index("cu_seqlens", cu_seqlens)
    if cu_seqlens.device != q.device or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be a non-empty tensor on {q.device}")
    num_seqs = cu_seqlens.shape[0] - 1
    check_sequences(q, block_tables, context_lens, num_seqs)
    check_shape("cu_seqlens", cu_seqlens, (num_seqs + 1,))
    out = check_out(out, q)
    scale_log2 = qk_scale(scale, head_dim)
    if max_query_len is None:
        max_query_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if num_seqs else 0
    if not 0 <= max_query_len <= num_tokens:
        raise ValueError(f"max_query_len {max_query_len} is outside 0..{num_tokens} rows")
    if num_seqs == 0 or max_query_len == 0:
        return out
    tiles = tiles or prefill_tiles(q.device, head_dim, q.dtype)
    grid = (cdiv(max_query_len, tiles.block_m), num_heads, num_seqs)
    prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens, context_lens, block_tables, scale_log2,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0), block_tables.stride(1),
        GROUP=kv.group(num_heads), HEAD_DIM=head_dim, PAGE_SIZE=kv.page_size,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out
