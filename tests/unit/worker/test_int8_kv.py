"""The int8 KV cache (--kv-cache-dtype int8): the extension's write ops quantize each token's
heads as kv_cache.quantize_int8 does (the same bits), every value within scale / 2 of what was
written; its paged attention reads the int8 rows with their scales as the torch path reads them
dequantized (a decode's queries rounded to int16 where the extension scores them so), and stays
within what the quantization allows of attention over the float values, for decodes, prefill
chunks, GQA and sliding windows over several blocks."""

from __future__ import annotations

import math

import pytest
import torch

from services.worker.layers.cpu_attention import CpuAttention, has_int16_queries
from services.worker.layers.kv_cache import (
    PagedKVCache,
    bytes_per_block,
    dequantize_int8,
)
from services.worker.layers.torch_attention import TorchAttention

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16
QUERY_TILE = 16  # cpu_attention.cpp's tokens per work item: a tile of one token is a decode's
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


class _Shape:
    num_layers, num_kv_heads = 2, KV_HEADS

    def __init__(self, head_dim: int = DIM) -> None:
        self.head_dim = head_dim
        self.kv_size = KV_HEADS * head_dim

    def window(self, layer: int) -> int | None:
        return None


def _kv(
    tokens: int, dtype: torch.dtype, seed: int = 0, dim: int = DIM
) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [T, Hkv, D] with heads of very different magnitudes (and one all zeros), as real
    keys have: per-head scales must follow them."""
    generator = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, tokens, KV_HEADS, dim, generator=generator)
    k = k * torch.tensor([0.05, 1.0, 4.0])[:, None]
    if tokens > 1:
        v[1, 2] = 0.0
    return k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_quantizes_as_the_reference(dtype: torch.dtype) -> None:
    k, v = _kv(11, dtype)
    slots = torch.tensor([5, 0, 17, 3, 40, 41, 42, 9, 30, 31, 12])
    native = PagedKVCache(_Shape(), 4, BLOCK, torch.int8, CPU)
    torch.ops.layerserve.write_kv_(
        *native.flat_layer(1)[:2], k, v, slots, *native.flat_layer(1)[2:]
    )
    reference = PagedKVCache(_Shape(), 4, BLOCK, torch.int8, CPU)
    reference.write(1, k, v, slots)
    for mine, want in zip(native.flat_layer(1), reference.flat_layer(1), strict=True):
        assert torch.equal(mine, want)
    k_q, v_q, k_scale, v_scale = native.flat_layer(1)
    for x, values, scale in ((k, k_q, k_scale), (v, v_q, v_scale)):
        back = dequantize_int8(values[slots], scale[slots], torch.float32)
        error = (back - x.float()).abs()
        # scale / 2, plus float32's rounding of x / scale and q * scale (|q| <= 127)
        assert (error <= scale[slots][..., None] * (0.5 + 127 * 2**-22)).all()
        assert values[slots].abs().amax(-1)[scale[slots] > 0].eq(127).all()  # absmax -> 127
    assert v_scale[slots[1], 2] == 0 and v_q[slots[1], 2].eq(0).all()  # a zero head stays zero
    assert native.flat_layer(0)[0].eq(0).all()  # another layer untouched


def test_rope_write_kv_quantizes_the_rotated_keys() -> None:
    qkv = torch.randn(6, HEADS + 2 * KV_HEADS, DIM)
    q, k, v = qkv.split_with_sizes([HEADS, KV_HEADS, KV_HEADS], 1)
    positions = torch.arange(6) + 3
    freqs = positions[:, None].float() / 10 ** (torch.arange(DIM // 2) / DIM * 4)
    angles = torch.cat([freqs, freqs], -1)
    cos, sin = angles.cos(), angles.sin()
    rotary = TorchAttention().rotary(cos, sin, torch.arange(6), torch.float32)
    slots = torch.tensor([1, 2, 3, 20, 21, 22])
    meta = CpuAttention().metadata([6], [6], [[0, 1]], BLOCK, CPU)
    meta.slot_mapping = slots
    fused = PagedKVCache(_Shape(), 4, BLOCK, torch.int8, CPU)
    q_fused = CpuAttention().rope_write_kv(fused, 0, q.clone(), k.clone(), v, rotary, meta)
    reference = PagedKVCache(_Shape(), 4, BLOCK, torch.int8, CPU)
    q_ref = TorchAttention().rope_write_kv(reference, 0, q.clone(), k.clone(), v, rotary, meta)
    assert torch.equal(q_fused, q_ref)
    for mine, want in zip(fused.layer(0), reference.layer(0), strict=True):
        assert torch.equal(mine, want)


def test_int8_cache_counts_its_scales() -> None:
    values = 2 * _Shape().num_layers * BLOCK * KV_HEADS * DIM
    assert bytes_per_block(_Shape(), BLOCK, torch.float32) == 4 * values
    assert bytes_per_block(_Shape(), BLOCK, torch.int8) == values + 2 * 2 * BLOCK * KV_HEADS * 4
    cache = PagedKVCache(_Shape(), 3, BLOCK, torch.int8, CPU)
    k, v, k_scale, v_scale = cache.layer(1)
    assert k.dtype == v.dtype == torch.int8 and k.shape == (3, BLOCK, KV_HEADS, DIM)
    assert k_scale.dtype == torch.float32 and v_scale.shape == (3, BLOCK, KV_HEADS)


# (new tokens, context) per sequence: decodes over several blocks, a prefill, a chunk after a
# cached prefix, all in one step.
STEP = [(1, 40), (1, 17), (23, 23), (1, 1), (9, 50)]


def _step(
    window: int | None, seed: int = 0, dim: int = DIM, block: int = BLOCK, q_scale: float = 1.0
):
    """The STEP's keys and values written into an int8 cache and a float32 one (the same float
    values), their blocks scattered; q (standard normal x q_scale), and what the extension and
    both references give."""
    query_lens, contexts = [q for q, _ in STEP], [c for _, c in STEP]
    needed = [-(-c // block) for c in contexts]
    order = torch.randperm(sum(needed), generator=torch.Generator().manual_seed(seed)) + 1
    tables = [order[sum(needed[:i]) : sum(needed[: i + 1])].tolist() for i in range(len(STEP))]
    int8 = PagedKVCache(_Shape(dim), sum(needed) + 1, block, torch.int8, CPU)
    wide = PagedKVCache(_Shape(dim), sum(needed) + 1, block, torch.float32, CPU)
    pairs = zip(tables, contexts, strict=True)
    slots = torch.tensor([t[p // block] * block + p % block for t, c in pairs for p in range(c)])
    k, v = _kv(len(slots), torch.float32, seed, dim)
    int8.write(0, k, v, slots)
    wide.write(0, k, v, slots)
    q = torch.randn(sum(query_lens), HEADS, dim, generator=torch.Generator().manual_seed(seed))
    q = q * q_scale
    native = CpuAttention().metadata(query_lens, contexts, tables, block, CPU)
    torch_meta = TorchAttention().metadata(query_lens, contexts, tables, block, CPU)
    out = CpuAttention().paged_attention(q, int8.layer(0), native, window)
    q_read = _as_read(q, query_lens, dim)
    dequantized = TorchAttention().paged_attention(q_read, int8.layer(0), torch_meta, window)
    _weigh_decodes_as_read(dequantized, q_read, int8, tables, window)
    exact = TorchAttention().paged_attention(q, wide.layer(0), torch_meta, window)
    return q, int8, out, dequantized, exact, tables


def _as_read(q: torch.Tensor, query_lens: list[int], dim: int) -> torch.Tensor:
    """q as the extension scores it: with VNNI or AVX2, a one-token tile's rows (a decode's)
    rounded to int16 per query head, q x 2^-3 (the softmax scale, a power of two for D = 64) to
    round(q x 32767 / max|q|) steps of max|q| / 32767; other rows, and D = 32 (widened a
    block at a time), as they are."""
    if not has_int16_queries() or dim % 64:
        return q
    decodes = [token for token, _ in _decodes(query_lens)]
    scaled = q[decodes] / math.sqrt(dim)
    largest = scaled.abs().amax(-1, keepdim=True)
    steps = torch.round(scaled * (32767.0 / largest)).clamp(-32768, 32767)
    read = q.clone()
    read[decodes] = steps * (largest / 32767.0) * math.sqrt(dim)
    return read


def _decodes(query_lens: list[int]) -> list[tuple[int, int]]:
    """(token, sequence) of each one-token tile: the rows the int16 passes take."""
    ends = torch.tensor(query_lens).cumsum(0) - 1
    return [(int(ends[i]), i) for i, n in enumerate(query_lens) if n % QUERY_TILE == 1]


def _weigh_decodes_as_read(
    out: torch.Tensor, q: torch.Tensor, cache: PagedKVCache, tables, window: int | None
) -> None:
    """out's decode rows as the extension's int16 pass 2 computes them (with VNNI or AVX2,
    D = 64): per query head the softmax numerators p over the keys it sees, and per chunk of
    16 keys from its first, the weights p x v_scale (denormals flushed to zero) rounded to int16
    steps of the chunk's largest / 32767, times the int8 values (summed exactly here in
    float64), over the sum of p."""
    dim = q.shape[-1]
    if not has_int16_queries() or dim % 64:
        return
    k, v, k_scale, v_scale = (t.flatten(0, 1) for t in cache.layer(0))  # per slot
    block = cache.block_size
    for token, seq in _decodes([n for n, _ in STEP]):
        context = STEP[seq][1]
        first = max(0, context - window) if window else 0
        slots = [tables[seq][j // block] * block + j % block for j in range(first, context)]
        keys = dequantize_int8(k[slots], k_scale[slots], torch.float32)
        for head in range(HEADS):
            kv = head // (HEADS // KV_HEADS)
            scores = keys[:, kv] @ q[token, head] / math.sqrt(dim)
            p = torch.exp(scores - scores.max())
            weights = p * v_scale[slots, kv]
            weights[weights < torch.finfo(torch.float32).tiny] = 0.0  # flushed as denormal
            total = torch.zeros(dim, dtype=torch.float64)
            for c in range(0, len(slots), 16):
                largest = weights[c : c + 16].max()
                if largest == 0:
                    continue
                steps = torch.round(weights[c : c + 16] * (32767.0 / largest))
                values = v[slots[c : c + 16], kv].double()
                total += (steps.double()[:, None] * values).sum(0) * float(largest / 32767.0)
            out[token, head] = (total / p.sum().double()).float()


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("dim", [DIM, 32])  # 32: not whole registers' 64, widened a block at a time
@pytest.mark.parametrize("block", [BLOCK, 4])  # 4: each chunk of 16 keys spans 4 blocks
def test_int8_attention_reads_what_was_quantized(window: int | None, dim: int, block: int) -> None:
    _, _, out, dequantized, _, _ = _step(window, dim=dim, block=block)
    torch.testing.assert_close(out, dequantized, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 20])
def test_int8_attention_within_the_quantization_error(window: int | None) -> None:
    """Per query head: each key within scale_k / 2 moves a score by at most
    eps = |q|_1 max(scale_k) / 2 / sqrt(D), so each probability by a factor within e^(+-2 eps):
    the output by at most (e^(2 eps) - 1) max|v|, plus max(scale_v) / 2 from the values."""
    q, cache, out, _, exact, _ = _step(window)
    _, v, k_scale, v_scale = cache.layer(0)
    kv_head = torch.arange(HEADS) // (HEADS // KV_HEADS)  # each query head's KV head
    max_k_scale = k_scale.amax((0, 1))[kv_head]  # [H]
    max_v_scale = v_scale.amax((0, 1))[kv_head]
    max_v = dequantize_int8(v, v_scale, torch.float32).abs().amax((0, 1, 3))[kv_head]
    eps = q.abs().sum(-1) * max_k_scale / 2 / math.sqrt(DIM)  # [T, H]
    bound = (torch.exp(2 * eps) - 1) * max_v + max_v_scale / 2 + 1e-5
    error = (out - exact).abs().amax(-1)  # [T, H]
    assert (error <= bound).all()
    assert error.max() > 0  # the values were quantized: not the float cache read back
    assert (error / bound).max() > 0.02  # the bound is one the kernel comes near


def test_scores_spread_past_floats_range_leave_the_callers_float_mode() -> None:
    """Queries 30x larger spread each row's scores over hundreds: many softmax weights fall
    to e^-87 and below, where the products the kernel forms are denormal. It flushes those to
    zero while it runs (x86 spends ~100 cycles on each denormal operation otherwise), so its
    result is the dequantized reference's; and the calling thread's float mode is its own
    again afterwards: torch still computes denormals."""
    _, _, out, dequantized, _, _ = _step(None, q_scale=30.0)
    torch.testing.assert_close(out, dequantized, atol=2e-5, rtol=1e-5)
    tiny = torch.tensor([1e-39]) * torch.tensor([1.0])
    assert tiny.item() != 0.0


def test_int8_attention_takes_bfloat16_queries() -> None:
    """A bfloat16 model's q over an int8 cache: widened exactly, float32 inside, rounded once."""
    q, cache, out, _, _, tables = _step(None)
    q16 = q.to(torch.bfloat16)
    meta = CpuAttention().metadata([n for n, _ in STEP], [c for _, c in STEP], tables, BLOCK, CPU)
    out16 = CpuAttention().paged_attention(q16, cache.layer(0), meta)
    wide = CpuAttention().paged_attention(q16.float(), cache.layer(0), meta)
    assert out16.dtype == torch.bfloat16
    assert torch.equal(out16, wide.to(torch.bfloat16))


def test_paged_attention_refuses_scales_without_int8() -> None:
    cache = PagedKVCache(_Shape(), 2, BLOCK, torch.float32, CPU)
    meta = CpuAttention().metadata([1], [1], [[1]], BLOCK, CPU)
    scales = torch.zeros(2, BLOCK, KV_HEADS)
    with pytest.raises(RuntimeError, match="scales go with int8"):
        torch.ops.layerserve.paged_attention(
            torch.zeros(1, HEADS, DIM), *cache.layer(0), meta.query_start,
            meta.context_lens_device, meta.block_tables, 0, 0.125, True, scales, scales,
        )  # fmt: skip
