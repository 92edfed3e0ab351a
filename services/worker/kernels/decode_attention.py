"""Paged decode attention, host side: checks the arguments, picks the split, launches.

The kernels are in decode_attention_kernel.py; the cache layout and block tables are described in
attention_inputs.py. Reference: attention_reference.decode_attention_ref."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from services.worker.kernels.attention_inputs import (
    PagedKV,
    cdiv,
    check_out,
    check_paged_kv,
    check_sequences,
    dot_precision,
    qk_scale,
)
from services.worker.kernels.decode_attention_kernel import (
    decode_attention_kernel,
    decode_reduce_kernel,
)
from services.worker.kernels.platform_tensors import next_power_of_2

# A split shorter than this spends more on its fixed cost (loading q, writing a partial, the
# reduction reading it back) than it gains in parallelism.
MIN_TOKENS_PER_SPLIT = 256
# Off CUDA (the interpreter): two of its 16-key steps per split.
MIN_TOKENS_PER_SPLIT_CPU = 32
# The reduction holds every split's partial of one head in registers: [SPLITS_PAD, D] fp32.
MAX_SPLITS = 64
# Programs per SM to aim for: two waves hide the latency of one program's gathers.
PROGRAMS_PER_SM = 2


@dataclass(frozen=True, slots=True)
class DecodeTiles:
    block_n: int
    num_warps: int
    num_stages: int


def decode_tiles(device: torch.device, head_dim: int, dtype: torch.dtype) -> DecodeTiles:
    """Keys per loop step and launch shape for the device, head dim and dtype."""
    if device.type == "cpu":
        # The interpreter: 16-key steps let small test contexts cross several steps and splits.
        return DecodeTiles(block_n=16, num_warps=1, num_stages=1)
    # Compiled for sm_90 and read with ptxas -v (python -m tests.kernels.attention_sm90): with
    # 32-key steps, D=64 on 4 warps and D=128 on 8 need 64-80 registers in fp16/bf16 (and
    # fp32), no spills, 7-27 KB of shared memory (64-key steps, measured earlier, needed
    # 249-255 and spilled at D=128 on 4 warps). Fewer registers leave room for more programs
    # per SM, whose gathers overlap. num_stages adds no pipeline buffers for the gathered loads
    # (same shared memory at 1..3), so one stage. Not yet timed on a GPU:
    # benchmarks/kernels/attention.py is where to tune. One exception: fp32 at D=128 with a
    # GQA group of 8 and one split gets 64 registers from ptxas and spills 24 bytes with
    # 32-key steps; 16-key steps do not spill (64 registers, 17 KB) in any fp32 D=128 variant.
    if dtype == torch.float32 and head_dim > 64:
        return DecodeTiles(block_n=16, num_warps=8, num_stages=1)
    return DecodeTiles(block_n=32, num_warps=4 if head_dim <= 64 else 8, num_stages=1)


def group_pad(group: int) -> int:
    """The query heads of one KV head padded to a tile's rows: a power of two, and at least
    16, tl.dot's minimum M."""
    return max(16, next_power_of_2(group))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(
    batch: int, num_kv_heads: int, max_context_len: int, device: torch.device
) -> int:
    """Enough splits that batch * Hkv * splits fills the GPU, none shorter than the minimum.

    Off CUDA (the interpreter, in tests) a context splits every MIN_TOKENS_PER_SPLIT_CPU
    tokens: the worker's CPU tests then take the split path (partials, the reduction, splits
    left empty by shorter sequences) that long contexts take on a GPU."""
    if device.type != "cuda":
        return max(1, min(cdiv(max_context_len, MIN_TOKENS_PER_SPLIT_CPU), MAX_SPLITS))
    wanted = cdiv(PROGRAMS_PER_SM * _sm_count(device.index or 0), batch * num_kv_heads)
    by_length = cdiv(max_context_len, MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged K/V: returns out [B, Hq, D] in q's dtype.

    q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, nb];
    context_lens: [B], each >= 1, the query's own key included (already written to the cache).
    Query head h reads KV head h // (Hq // Hkv). scale defaults to 1/sqrt(D).
    max_context_len bounds context_lens (default nb * block_size: no device sync); it sizes
    the splits. num_splits overrides the split count, tiles the device's tiles (tests: the
    CUDA tiles under the interpreter; benchmarks)."""
    kv = check_paged_kv(q, k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    check_sequences(q, block_tables, context_lens, batch)
    out = check_out(out, q)
    scale_log2 = qk_scale(scale, head_dim)
    capacity = block_tables.shape[1] * kv.page_size
    if max_context_len is None:
        max_context_len = capacity
    if not 0 <= max_context_len <= capacity:
        raise ValueError(
            f"max_context_len {max_context_len} is outside the block tables' "
            f"{block_tables.shape[1]} blocks of {kv.page_size} tokens"
        )
    if batch == 0 or max_context_len == 0:
        return out.zero_()
    tiles = tiles or decode_tiles(q.device, head_dim, q.dtype)
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv.num_kv_heads, max_context_len, q.device)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    tokens_per_split = cdiv(cdiv(max_context_len, num_splits), tiles.block_n) * tiles.block_n
    num_splits = cdiv(max_context_len, tokens_per_split)  # rounding up may leave splits empty
    _launch(q, k_cache, v_cache, block_tables, context_lens, out, kv, scale_log2, tiles,
            num_splits, tokens_per_split)  # fmt: skip
    return out


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    kv: PagedKV,
    scale_log2: float,
    tiles: DecodeTiles,
    num_splits: int,
    tokens_per_split: int,
) -> None:
    batch, num_heads, head_dim = q.shape
    split = num_splits > 1
    if split:
        part_out = torch.empty(
            (batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # not written; any tensor fills the argument
    group = kv.group(num_heads)
    decode_attention_kernel[(batch, kv.num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        scale_log2, tokens_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, GROUP_PAD=group_pad(group), HEAD_DIM=head_dim,
        PAGE_SIZE=kv.page_size, BLOCK_N=tiles.block_n, SPLIT=split,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    if split:
        decode_reduce_kernel[(batch, num_heads)](
            part_out, part_lse, context_lens, out, tokens_per_split, num_splits,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, SPLITS_PAD=next_power_of_2(num_splits),
            num_warps=tiles.num_warps,
        )  # fmt: skip
