"""write_kv_cache against PagedKVCache.write: the same slots of the same layer get the same
K/V, across block boundaries, for strided inputs, with padding rows skipped."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.cache_write import write_kv_cache, write_kv_cache_ref
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.config import LlamaConfig
from tests.kernels.small_ops_cases import DEVICE_DTYPES

BLOCK_SIZE = 16
NUM_BLOCKS = 5


def _cache(kv_heads: int, head_dim: int, device: str, dtype: torch.dtype) -> PagedKVCache:
    config = LlamaConfig(
        vocab_size=32, hidden_size=kv_heads * head_dim, intermediate_size=64, num_layers=2,
        num_heads=kv_heads, num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=10000.0,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_ids=(0,),
    )  # fmt: skip
    return PagedKVCache(config, NUM_BLOCKS, BLOCK_SIZE, dtype, torch.device(device))


def _new_kv(tokens: int, kv_heads: int, head_dim: int, device: str, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(tokens + kv_heads + head_dim)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    return k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)


# Slots: block 3's last two and block 0's first two (a sequence crossing a block boundary),
# the very last slot of the cache, and slot 0.
SLOTS = [
    3 * BLOCK_SIZE + 14,
    3 * BLOCK_SIZE + 15,
    0 * BLOCK_SIZE + 1,
    2,
    NUM_BLOCKS * BLOCK_SIZE - 1,
    0,
]


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@pytest.mark.parametrize(
    ("kv_heads", "head_dim"), [(3, 64), (8, 128), (1, 64)], ids=["smollm2", "llama3", "mqa"]
)
@pytest.mark.parametrize("slots", [SLOTS, [37]], ids=["boundaries", "one-token"])
def test_matches_paged_kv_cache_write(
    device: str, dtype: torch.dtype, kv_heads: int, head_dim: int, slots: list[int]
) -> None:
    kernel_cache, model_cache = (
        _cache(kv_heads, head_dim, device, dtype),
        _cache(kv_heads, head_dim, device, dtype),
    )
    k, v = _new_kv(len(slots), kv_heads, head_dim, device, dtype)
    slot_mapping = torch.tensor(slots, device=device)
    write_kv_cache(k, v, *kernel_cache.layer(1), slot_mapping)
    model_cache.write(1, k, v, slot_mapping)
    assert torch.equal(kernel_cache._buffer, model_cache._buffer)
    k_cache, v_cache = kernel_cache.layer(1)
    for row, slot in enumerate(slots):  # the layout itself: slot = block * block_size + offset
        block, offset = divmod(slot, BLOCK_SIZE)
        assert torch.equal(k_cache[block, offset], k[row])
        assert torch.equal(v_cache[block, offset], v[row])


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_strided_views_of_fused_qkv(device: str, dtype: torch.dtype) -> None:
    """k and v as column slices of one qkv buffer (row stride > Hkv * D) are read in place."""
    tokens, heads, kv_heads, dim = 5, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(device=device, dtype=dtype)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    slot_mapping = torch.arange(20, 20 + tokens, device=device, dtype=torch.int32)
    kernel_cache, model_cache = (
        _cache(kv_heads, dim, device, dtype),
        _cache(kv_heads, dim, device, dtype),
    )
    write_kv_cache(k, v, *kernel_cache.layer(0), slot_mapping)
    model_cache.write(0, k, v, slot_mapping.long())
    assert torch.equal(kernel_cache._buffer, model_cache._buffer)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_negative_and_out_of_range_slots_write_nothing(device: str, dtype: torch.dtype) -> None:
    """Padding rows (slot -1) are skipped; a slot past the cache never writes outside it."""
    kernel_cache, ref_cache = _cache(3, 64, device, dtype), _cache(3, 64, device, dtype)
    k, v = _new_kv(4, 3, 64, device, dtype)
    slot_mapping = torch.tensor([5, -1, 6, -1], device=device)
    write_kv_cache(k, v, *kernel_cache.layer(1), slot_mapping)
    write_kv_cache_ref(k, v, *ref_cache.layer(1), slot_mapping)
    assert torch.equal(kernel_cache._buffer, ref_cache._buffer)
    assert kernel_cache._buffer.count_nonzero() == 2 * 2 * 3 * 64  # two rows, K and V

    before = kernel_cache._buffer.clone()
    write_kv_cache(
        k[:1], v[:1], *kernel_cache.layer(0), torch.tensor([NUM_BLOCKS * BLOCK_SIZE], device=device)
    )
    assert torch.equal(kernel_cache._buffer, before)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rejects_bad_arguments(device: str, dtype: torch.dtype) -> None:
    cache = _cache(3, 64, device, dtype)
    k, v = _new_kv(2, 3, 64, device, dtype)
    slots = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="cache heads x dim"):
        write_kv_cache(k[:, :2], v[:, :2], *cache.layer(0), slots)
    with pytest.raises(ValueError, match="slot_mapping must be int32 or int64"):
        write_kv_cache(k, v, *cache.layer(0), slots.float())
    with pytest.raises(ValueError, match=r"slot_mapping must be \[2\]"):
        write_kv_cache(k, v, *cache.layer(0), slots[:1])
    with pytest.raises(ValueError, match="k and v differ in shape"):
        write_kv_cache(k, v[:1], *cache.layer(0), slots)
