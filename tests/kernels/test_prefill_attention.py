"""Causal prefill attention kernel (packed chunks over a paged, partly cached context) against
the float64 torch reference.

On CPU the kernel runs under the Triton interpreter in fp32 (tests/kernels/conftest.py), with
16 x 16 tiles, so the small chunks here cross query tiles, key steps and blocks."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.attention_reference import prefill_attention_ref
from services.worker.kernels.prefill_attention import prefill_attention
from tests.kernels.attention_cases import (
    DEVICE,
    DTYPES,
    assert_close,
    paged_cache,
    random_queries,
)

# (new tokens per sequence, context lengths (cached + new), KV heads, query heads per KV
# head, head dim, block size)
CASES = {
    "one-token": ([1], [1], 1, 1, 64, 16),
    "fresh-prompts": ([16, 33, 1], [16, 33, 1], 1, 3, 64, 16),
    "prefix-on-block-boundaries-d128": ([20, 7, 16], [52, 23, 48], 2, 4, 128, 16),
    "prefix-mid-block-mha": ([17, 5, 2], [40, 14, 3], 2, 1, 64, 8),
    "chunk-longer-than-tile": ([40], [70], 1, 2, 128, 32),
    "empty-chunk-in-batch": ([3, 0, 4], [3, 9, 20], 1, 2, 64, 16),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_prefill_matches_reference(case: tuple, dtype: torch.dtype) -> None:
    query_lens, contexts, num_kv_heads, group, head_dim, block_size = case
    gen = torch.Generator().manual_seed(sum(query_lens) + head_dim)
    cache = paged_cache(contexts, num_kv_heads, head_dim, block_size, dtype, gen)
    q = random_queries(sum(query_lens), num_kv_heads * group, head_dim, dtype, gen)
    cu_seqlens = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device=DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cu_seqlens, cache.context_lens, cache.block_tables)
    out = prefill_attention(*args, max_query_len=max(query_lens))
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, prefill_attention_ref(*args), dtype)


def test_grid_from_cu_seqlens_and_strided_query() -> None:
    """Without max_query_len the grid still covers the longest chunk; q may be a view."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(3)
    cache = paged_cache([35, 8], 1, 64, 16, dtype, gen)
    qkv = random_queries(25, 2 + 1 + 1, 64, dtype, gen)
    q = qkv[:, :2]
    cu_seqlens = torch.tensor([0, 20, 25], dtype=torch.int32, device=DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cu_seqlens, cache.context_lens, cache.block_tables)
    assert_close(prefill_attention(*args, 0.2), prefill_attention_ref(*args, 0.2), dtype)


def test_run_of_sequences_inside_a_larger_batch() -> None:
    """cu_seqlens may address rows in the middle of q (the prefill chunks of a step whose
    decodes come first); rows outside them keep what the caller's out held."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(5)
    cache = paged_cache([30, 12], 1, 64, 16, dtype, gen)
    q = random_queries(40, 2, 64, dtype, gen)
    cu_seqlens = torch.tensor([4, 21, 33], device=DEVICE)  # rows 0-3 and 33-39: not ours
    out = torch.full_like(q, 5.0)
    args = (q, cache.k_cache, cache.v_cache, cu_seqlens, cache.context_lens, cache.block_tables)
    prefill_attention(*args, max_query_len=17, out=out)
    assert_close(out[4:33], prefill_attention_ref(*args)[4:33], dtype)
    assert (out[:4] == 5.0).all() and (out[33:] == 5.0).all()


def _inputs() -> dict:
    gen = torch.Generator().manual_seed(0)
    cache = paged_cache([5, 9], 2, 64, 16, torch.float32, gen)
    return {
        "q": random_queries(6, 4, 64, torch.float32, gen),
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "cu_seqlens": torch.tensor([0, 2, 6], device=DEVICE),
        "context_lens": cache.context_lens,
        "block_tables": cache.block_tables,
    }


BAD_INPUTS = {
    "cu-seqlens-float": ({"cu_seqlens": torch.tensor([0.0, 2.0, 6.0])}, "cu_seqlens"),
    "cu-seqlens-rank": ({"cu_seqlens": torch.tensor([[0, 2, 6]])}, "cu_seqlens"),
    "one-sequence-too-few": ({"cu_seqlens": torch.tensor([0, 6])}, "block_tables has 2 rows"),
    "max-query-len": ({"max_query_len": 7}, "max_query_len"),
    "scale": ({"scale": float("nan")}, "scale"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_rejects_bad_input(case: tuple) -> None:
    changes, words = case
    inputs = _inputs()
    inputs.update(changes)
    with pytest.raises(ValueError, match=words):
        prefill_attention(**inputs)
