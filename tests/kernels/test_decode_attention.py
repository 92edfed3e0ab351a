"""Paged decode attention kernel against the float64 torch reference.

On CPU the kernels run under the Triton interpreter in fp32 (tests/kernels/conftest.py), with
16-key steps, so the small contexts here cross steps, blocks and splits."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.attention_reference import decode_attention_ref
from services.worker.kernels.decode_attention import decode_attention
from tests.kernels.attention_cases import (
    DEVICE,
    DTYPES,
    assert_close,
    paged_cache,
    random_queries,
)

# (context lengths, KV heads, query heads per KV head, head dim, block size)
CASES = {
    "one-token": ([1], 1, 1, 64, 16),
    "block-boundaries": ([16, 32, 15, 17], 2, 3, 64, 16),
    "ragged-gqa4-d128": ([5, 40, 23], 2, 4, 128, 16),
    "small-blocks-mha": ([9, 24], 3, 1, 64, 8),
    "block-wider-than-step": ([33, 70], 1, 2, 128, 32),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decode_matches_reference(case: tuple, dtype: torch.dtype) -> None:
    contexts, num_kv_heads, group, head_dim, block_size = case
    gen = torch.Generator().manual_seed(len(contexts) * 100 + head_dim)
    cache = paged_cache(contexts, num_kv_heads, head_dim, block_size, dtype, gen)
    q = random_queries(len(contexts), num_kv_heads * group, head_dim, dtype, gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = decode_attention(*args)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, decode_attention_ref(*args), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_kv_matches_reference(num_splits: int, dtype: torch.dtype) -> None:
    """A context longer than one split is merged right, and sequences shorter than the
    longest leave their later splits empty (a NaN-filled workspace would show it)."""
    contexts = [130, 3, 64, 97]
    gen = torch.Generator().manual_seed(num_splits)
    cache = paged_cache(contexts, 2, 64, 16, dtype, gen)
    q = random_queries(len(contexts), 6, 64, dtype, gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = decode_attention(*args, num_splits=num_splits, max_context_len=max(contexts))
    assert_close(out, decode_attention_ref(*args), dtype)


def test_strided_inputs_and_output_scale() -> None:
    """q as a view into a fused QKV projection, a cache whose blocks are not outermost in
    memory, a caller's output slice, a custom scale: strides are honoured, not assumed."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(7)
    cache = paged_cache([20, 45], 1, 64, 16, dtype, gen)
    cache.k_cache = cache.k_cache.transpose(0, 1).contiguous().transpose(0, 1)
    qkv = random_queries(2, 3 + 1 + 1, 64, dtype, gen)  # [B, Hq + 2 * Hkv, D]
    q = qkv[:, :3]
    out = torch.full((2, 4, 64), 7.0, dtype=dtype, device=DEVICE)
    tables, lens = cache.block_tables, cache.context_lens
    result = decode_attention(q, cache.k_cache, cache.v_cache, tables, lens, 0.3, out=out[:, 1:])
    expected = decode_attention_ref(q, cache.k_cache, cache.v_cache, tables, lens, 0.3)
    assert result.data_ptr() == out[:, 1:].data_ptr()
    assert_close(out[:, 1:], expected, dtype)
    assert (out[:, 0] == 7.0).all(), "the kernel wrote outside its output view"


def _inputs(**changes: object) -> dict:
    gen = torch.Generator().manual_seed(0)
    cache = paged_cache([5, 9], 2, 64, 16, torch.float32, gen)
    inputs = {
        "q": random_queries(2, 4, 64, torch.float32, gen),
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "block_tables": cache.block_tables,
        "context_lens": cache.context_lens,
    }
    inputs.update(changes)
    return inputs


BAD_INPUTS = {
    "heads-not-multiple": (lambda i: {"q": i["q"][:, :3]}, "multiple"),
    "head-dim-96": (lambda i: {"q": i["q"].new_zeros(2, 4, 96)}, "head_dim"),
    "q-dim-mismatch": (lambda i: {"q": i["q"].new_zeros(2, 4, 128)}, "q has head_dim 128"),
    "v-shape": (lambda i: {"v_cache": i["v_cache"][:, :8]}, "v_cache"),
    "float-tables": (lambda i: {"block_tables": i["block_tables"].float()}, "block_tables"),
    "table-rows": (lambda i: {"block_tables": i["block_tables"][:1]}, "rows"),
    "lens-shape": (lambda i: {"context_lens": i["context_lens"][:1]}, "context_lens"),
    "q-last-dim-strided": (
        lambda i: {"q": i["q"].repeat_interleave(2, dim=-1)[..., ::2]},
        "contiguous in its last dimension",
    ),
    "cache-dtype": (lambda i: {"k_cache": i["k_cache"].double()}, "k_cache is torch.float64"),
    "lens-device": (lambda i: {"context_lens": i["context_lens"].to("meta")}, "context_lens"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_rejects_bad_input(case: tuple) -> None:
    change, words = case
    inputs = _inputs()
    inputs.update(change(inputs))
    with pytest.raises(ValueError, match=words):
        decode_attention(**inputs)


def test_rejects_context_beyond_tables() -> None:
    with pytest.raises(ValueError, match="max_context_len"):
        decode_attention(**_inputs(), max_context_len=10_000)
