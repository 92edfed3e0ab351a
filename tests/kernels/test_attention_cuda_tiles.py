"""The attention kernels at the tiles they run with on CUDA, against the float64 reference.

The other kernel tests take the host wrappers' CPU tiles (16 x 16, so that small cases cross
many of them). These pass the CUDA tiles (decode_tiles / prefill_tiles for a CUDA device): the
fp16/bf16 ones (BLOCK_M 128 x BLOCK_N 64 at D=64, 64 x 32 at D=128, 32-key decode steps) and
the smaller fp32 ones, with contexts and chunks that cross those tiles, and every split count
the decode kernel can be given up to MAX_SPLITS. Under the interpreter the data is fp32 (its
bf16 arithmetic is not the GPU's), so the tiles of a half type run with fp32 values; on a GPU
each dtype runs with its own tiles."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.attention_reference import (
    decode_attention_ref,
    prefill_attention_ref,
)
from services.worker.kernels.decode_attention import (
    MAX_SPLITS,
    decode_attention,
    decode_tiles,
)
from services.worker.kernels.prefill_attention import prefill_attention, prefill_tiles
from tests.kernels.attention_cases import CUDA, DEVICE, assert_close, paged_cache, random_queries

ON_GPU = torch.device("cuda")  # only read by the tile choosers
# fp16's tiles are bf16's: under the interpreter, where both run as fp32, one of them will do.
TILE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16} | (
    {"fp16": torch.float16} if CUDA else {}
)


def _data_dtype(tile_dtype: torch.dtype) -> torch.dtype:
    return tile_dtype if CUDA else torch.float32


# (new tokens per sequence, context lengths, KV heads, group, head dim, block size): chunks
# longer than BLOCK_M = 128, prefixes ending mid-step, an empty chunk, a block wider than a step.
PREFILL_CASES = {
    "d64-long-chunks": ([150, 7, 0, 64], [200, 7, 9, 130], 2, 3, 64, 16),
    "d64-gqa8-big-blocks": ([129], [300], 1, 8, 64, 128),
    "d128-long-chunks": ([70, 33, 1], [100, 33, 65], 2, 4, 128, 16),
}


@pytest.mark.parametrize("tile_dtype", TILE_DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES.values(), ids=PREFILL_CASES.keys())
def test_prefill_at_cuda_tiles(case: tuple, tile_dtype: str) -> None:
    query_lens, contexts, num_kv_heads, group, head_dim, block_size = case
    dtype = _data_dtype(TILE_DTYPES[tile_dtype])
    tiles = prefill_tiles(ON_GPU, head_dim, TILE_DTYPES[tile_dtype])
    assert tiles.block_m >= 32 and tiles.block_n >= 32  # the real ones, not the CPU's 16 x 16
    gen = torch.Generator().manual_seed(sum(query_lens) + head_dim)
    cache = paged_cache(contexts, num_kv_heads, head_dim, block_size, dtype, gen)
    q = random_queries(sum(query_lens), num_kv_heads * group, head_dim, dtype, gen)
    cu_seqlens = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device=DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cu_seqlens, cache.context_lens, cache.block_tables)
    out = prefill_attention(*args, max_query_len=max(query_lens), tiles=tiles)
    assert_close(out, prefill_attention_ref(*args), dtype)


# (context lengths, KV heads, group, head dim, block size)
DECODE_CASES = {
    "d64-ragged": ([1, 31, 33, 100, 300], 2, 3, 64, 16),
    "d64-gqa8-pages-of-one": ([70, 5], 1, 8, 64, 1),
    "d128-mha-wide-blocks": ([65, 257], 3, 1, 128, 64),
}


@pytest.mark.parametrize("tile_dtype", TILE_DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES.values(), ids=DECODE_CASES.keys())
def test_decode_at_cuda_tiles(case: tuple, tile_dtype: str) -> None:
    contexts, num_kv_heads, group, head_dim, block_size = case
    dtype = _data_dtype(TILE_DTYPES[tile_dtype])
    tiles = decode_tiles(ON_GPU, head_dim, TILE_DTYPES[tile_dtype])
    gen = torch.Generator().manual_seed(len(contexts) + head_dim + block_size)
    cache = paged_cache(contexts, num_kv_heads, head_dim, block_size, dtype, gen)
    q = random_queries(len(contexts), num_kv_heads * group, head_dim, dtype, gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    expected = decode_attention_ref(*args)
    for num_splits in (1, 3):
        out = decode_attention(*args, num_splits=num_splits, tiles=tiles)
        assert_close(out, expected, dtype)


@pytest.mark.parametrize("num_splits", [2, 5, 17, 33, MAX_SPLITS])
def test_every_split_width_at_cuda_tiles(num_splits: int) -> None:
    """Split counts that pad the reduction to 2, 8, 32 and 64 (MAX_SPLITS) rows, each split
    at least one 32-key step, beside a sequence too short for all but the first split."""
    tile_dtype = torch.bfloat16
    dtype = _data_dtype(tile_dtype)
    tiles = decode_tiles(ON_GPU, 64, tile_dtype)
    contexts = [MAX_SPLITS * tiles.block_n + 5, 20]
    gen = torch.Generator().manual_seed(num_splits)
    cache = paged_cache(contexts, 1, 64, 16, dtype, gen)
    q = random_queries(len(contexts), 4, 64, dtype, gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = decode_attention(*args, num_splits=num_splits, max_context_len=max(contexts),
                           tiles=tiles)  # fmt: skip
    assert_close(out, decode_attention_ref(*args), dtype)
