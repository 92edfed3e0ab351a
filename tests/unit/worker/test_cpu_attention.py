"""The C++ CPU attention (cpu_attention.py, csrc/cpu_attention.cpp) against the torch path it
replaces on the CPU (torch_attention.py, the reference): decodes and prefill chunks in one
batch, cached prefixes, GQA, sliding windows with dropped blocks, several block sizes and head
dims, float32 and bfloat16; and the backend choice with its fallback."""

from __future__ import annotations

import logging
import random

import pytest
import torch
import torch.nn.functional as F

from services.worker.layers import attention, cpu_attention_ext
from services.worker.layers.attention_backends import attention_backend
from services.worker.layers.cpu_attention import (
    CpuAttention,
    has_avx512_bf16,
    native_paged_attention,
)
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention
from services.worker.model.config import LlamaConfig

CPU = torch.device("cpu")
REFERENCE = TorchAttention()


pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


def _config(heads: int, kv_heads: int, dim: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=10, hidden_size=heads * dim, intermediate_size=8, num_layers=1,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, rope_theta=1e4, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=True, eos_token_ids=(0,),
    )  # fmt: skip


def _case(
    seqs: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
    dtype: torch.dtype,
    window: int | None = None,
    seed: int = 0,
):
    """A random layer cache, shuffled block tables and queries for (new tokens, context) per
    sequence. With a window, blocks wholly before a sequence's first query's window are -1,
    as the scheduler leaves a sliding-window group's tables."""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = [-(-ctx // block) for _, ctx in seqs]
    cache = PagedKVCache(_config(heads, kv_heads, dim), sum(needed) + 1, block, dtype, CPU)
    for layer in cache.layer(0):
        layer.copy_(torch.randn(layer.shape, generator=g).to(dtype))
    pool = list(range(1, cache.num_blocks))
    rng.shuffle(pool)
    tables = []
    for (new, ctx), count in zip(seqs, needed, strict=True):
        table, pool = pool[:count], pool[count:]
        if window is not None:
            first_seen = max(0, ctx - new - window + 1) // block
            table = [-1] * first_seen + table[first_seen:]
        tables.append(table)
    q = torch.randn(sum(n for n, _ in seqs), heads, dim, generator=g).to(dtype)
    return cache, tables, q


def _cpu_flags() -> set[str]:
    return set(cpu_attention_ext._cpu_flags().split())


def _both(seqs, cache, tables, q, window=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(in place, reference) outputs."""
    query_lens, contexts = [n for n, _ in seqs], [c for _, c in seqs]
    block = cache.block_size
    ref_meta = REFERENCE.metadata(query_lens, contexts, tables, block, CPU)
    meta = CpuAttention().metadata(query_lens, contexts, tables, block, CPU)
    expected = REFERENCE.paged_attention(q, cache.layer(0), ref_meta, window)
    return CpuAttention().paged_attention(q, cache.layer(0), meta, window), expected


MIXED = [(1, 37), (7, 7), (1, 1), (16, 40), (1, 100), (33, 33), (1, 16), (5, 64)]


@pytest.mark.parametrize("block", [1, 4, 16, 5])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 2), (4, 1)])
def test_mixed_batch_matches_the_torch_path_in_float32(block, heads, kv_heads) -> None:
    """Decodes, fresh prompts and chunks after a cached prefix, one call."""
    cache, tables, q = _case(MIXED, heads, kv_heads, 64, block, torch.float32)
    out, expected = _both(MIXED, cache, tables, q)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dim", [8, 24, 128, 256])  # 8, 24: not a multiple of 16 (scalar loop)
def test_head_dims(dim) -> None:
    cache, tables, q = _case(MIXED, 4, 2, dim, 4, torch.float32, seed=dim)
    out, expected = _both(MIXED, cache, tables, q)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("block", [4, 16])
@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_sliding_window_with_dropped_blocks(block, window) -> None:
    """Gemma 3's sliding layers: keys in (p - window, p]; -1 table entries are never read."""
    seqs = [(1, 90), (12, 70), (1, 3), (30, 30), (1, 41)]
    cache, tables, q = _case(seqs, 4, 1, 32, block, torch.float32, window=window, seed=window)
    assert any(-1 in table for table in tables)
    out, expected = _both(seqs, cache, tables, q, window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("window", [None, 24])
def test_bfloat16_is_at_least_as_close_to_float32_as_the_torch_path(window) -> None:
    """Both read bf16 K/V and q; the extension computes in float32, so against the float32
    answer on the same (rounded) inputs its error is no larger than the torch path's."""
    seqs = [(1, 300), (20, 60), (1, 17), (9, 9)]
    cache, tables, q = _case(seqs, 9, 3, 64, 16, torch.bfloat16, window=window)
    out, reference = _both(seqs, cache, tables, q, window)
    cache32 = PagedKVCache(_config(9, 3, 64), cache.num_blocks, 16, torch.float32, CPU)
    for mine, wide in zip(cache.layer(0), cache32.layer(0), strict=True):
        wide.copy_(mine.float())
    truth = REFERENCE.paged_attention(
        q.float(), cache32.layer(0),
        REFERENCE.metadata([n for n, _ in seqs], [c for _, c in seqs], tables, 16, CPU), window,
    )  # fmt: skip
    assert out.dtype == torch.bfloat16
    ours, theirs = (out.float() - truth).abs().max(), (reference.float() - truth).abs().max()
    assert ours <= theirs + 1e-3
    torch.testing.assert_close(out.float(), truth, rtol=1.6e-2, atol=1e-2)  # bf16's epsilon


needs_avx512_bf16 = pytest.mark.skipif(
    "avx512_bf16" not in _cpu_flags(), reason="this CPU has no AVX512-BF16"
)


@needs_avx512_bf16
def test_a_cpu_with_avx512_bf16_gets_its_dot_products() -> None:
    """-march=native on such a CPU compiles them in; losing them would be a silent slowdown."""
    assert has_avx512_bf16()


@needs_avx512_bf16
@pytest.mark.parametrize(
    ("dim", "block", "window", "heads", "kv_heads"),
    [
        (64, 16, None, 9, 3),
        (64, 5, None, 9, 3),
        (128, 4, 40, 9, 3),
        (32, 16, 7, 9, 3),
        (256, 16, None, 8, 1),  # 8 query heads per KV head: two blocks of 4 rows
        (64, 16, 24, 4, 4),  # one query head per KV head
        (96, 16, None, 12, 2),  # 6 per KV head (4 + 2 rows); 96: one load per 32 dims
    ],
)
def test_avx512_bf16_passes_match_the_widening_path(dim, block, window, heads, kv_heads) -> None:
    """Both multiply the same bf16 values exactly (a bf16 x bf16 product fits float32) and sum
    in float32; only the order of the score sums differs (~1e-7 relative). After rounding to
    bf16 the outputs are equal but for values that sit on a rounding boundary, one bf16 ulp
    (2^-7 relative at most) apart. Blocks of 5 make chunks of 16 keys cross blocks; dim 32
    and 96 take the one-load-per-row path, 64, 128 and 256 the two-load one."""
    seqs = [(1, 300), (20, 60), (1, 17), (9, 9), (16, 100), (1, 1)]
    cache, tables, q = _case(seqs, heads, kv_heads, dim, block, torch.bfloat16, window, dim)
    meta = CpuAttention().metadata([n for n, _ in seqs], [c for _, c in seqs], tables, block, CPU)
    fast = CpuAttention(avx512_bf16=True).paged_attention(q, cache.layer(0), meta, window)
    widened = CpuAttention(avx512_bf16=False).paged_attention(q, cache.layer(0), meta, window)
    assert (fast == widened).float().mean() > 0.99
    torch.testing.assert_close(fast.float(), widened.float(), rtol=2**-7, atol=1e-6)


def test_long_decode_against_dense_attention() -> None:
    """One query over 2k keys spread over shuffled blocks, against SDPA on the dense K/V."""
    cache, tables, q = _case([(1, 2048)], 9, 3, 64, 16, torch.float32)
    meta = CpuAttention().metadata([1], [2048], tables, 16, CPU)
    out = CpuAttention().paged_attention(q, cache.layer(0), meta)
    keys, values = (c[torch.tensor(tables[0])].reshape(2048, 3, 64) for c in cache.layer(0))
    dense = F.scaled_dot_product_attention(
        q.view(1, 3, 3, 64).transpose(0, 1), keys.transpose(0, 1)[:, None].expand(3, 1, 2048, 64),
        values.transpose(0, 1)[:, None].expand(3, 1, 2048, 64),
    )  # fmt: skip  # [Hkv, 1, G, D]
    torch.testing.assert_close(out, dense.transpose(0, 1).reshape(1, 9, 64), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("context", "block"), [(150, 16), (37, 4), (1000, 16)])
def test_a_verify_steps_rows_equal_decodes_of_them(dtype, context, block) -> None:
    """Speculative decoding keeps a proposal only where the sampler picks it itself: the 1 + k
    query rows of a verify step must come out as each row's own decode step would, bit for bit,
    whichever chunk of keys a score is computed in."""
    rows = 9
    cache, tables, q = _case([(rows, context)], 9, 3, 64, block, dtype, seed=context)
    verify_meta = CpuAttention().metadata([rows], [context], tables, block, CPU)
    together = CpuAttention().paged_attention(q, cache.layer(0), verify_meta)
    for i in range(rows):
        seen = context - rows + 1 + i  # row i's position + 1
        meta = CpuAttention().metadata([1], [seen], tables, block, CPU)
        alone = CpuAttention().paged_attention(q[i : i + 1], cache.layer(0), meta)
        assert torch.equal(alone[0], together[i]), f"row {i} of {rows} over {seen} keys"


def test_strided_queries_and_threads() -> None:
    """q as the model makes it (a view of the fused qkv projection), on two threads."""
    seqs = [(1, 50)] * 6 + [(20, 20)]
    cache, tables, q = _case(seqs, 9, 3, 64, 4, torch.float32)
    qkv = torch.cat([q.flatten(1), torch.zeros(q.shape[0], 2 * 3 * 64)], dim=1)
    strided = qkv[:, : 9 * 64].view(-1, 9, 64)
    assert not strided.is_contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out, expected = _both(seqs, cache, tables, strided)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


def test_queries_in_another_dtype_come_back_in_theirs() -> None:
    cache, tables, q = _case([(3, 10)], 2, 1, 16, 4, torch.bfloat16)
    meta = CpuAttention().metadata([3], [10], tables, 4, CPU)
    out = CpuAttention().paged_attention(q.float(), cache.layer(0), meta)
    assert out.dtype == torch.float32 and out.shape == (3, 2, 16)


def test_refuses_mismatched_caches() -> None:
    cache, tables, q = _case([(1, 8)], 2, 1, 16, 4, torch.float32)
    meta = CpuAttention().metadata([1], [8], tables, 4, CPU)
    k, v = cache.layer(0)
    with pytest.raises(RuntimeError, match="one shape and layout"):
        native_paged_attention(q, k, v[:, :2], meta.query_start, meta.context_lens_device,
                               meta.block_tables)  # fmt: skip


def test_the_worker_gets_the_extension_when_built(monkeypatch, caplog) -> None:
    assert isinstance(attention_backend("torch"), CpuAttention)
    monkeypatch.setattr(cpu_attention_ext, "load", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert attention_backend("torch") is attention.TORCH
    assert "CPU attention extension not built" in caplog.text


def test_the_build_is_keyed_by_its_source(monkeypatch, tmp_path) -> None:
    """A changed source (or CPU, or torch) is another build: a stale library is never loaded."""
    before = cpu_attention_ext.library_path()
    changed = tmp_path / "cpu_attention.cpp"
    changed.write_text(cpu_attention_ext.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(cpu_attention_ext, "SOURCES", (changed, *cpu_attention_ext.SOURCES[1:]))
    assert cpu_attention_ext.library_path() != before


def test_benchmark_reports_say_whether_the_kernels_were_built(monkeypatch, tmp_path) -> None:
    """A benchmark's machine record names whether this run had the C++ kernels, and says so
    when they are not built (the same run then takes torch's ops, several times slower)."""
    from benchmarks.machine import machine

    assert machine()["cpu_extension"] == "built"
    monkeypatch.setattr(cpu_attention_ext, "library_path", lambda: tmp_path / "absent.so")
    assert machine()["cpu_extension"] == "not built: torch's ops instead"
