"""The extension's KV cache write (csrc/kv_write.cpp, CpuAttention.write_kv): one call a layer
storing k and v where the torch path's two index_copy_ store them, bit for bit, for k and v as
the fused qkv projection lays them out (strided views of one matrix), in float32 and bfloat16;
out-of-range slots and mismatched shapes refused before anything is written."""

from __future__ import annotations

import pytest
import torch

from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention

pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


class _Shape:
    num_layers, num_kv_heads, head_dim = 2, 3, 64
    kv_size = num_kv_heads * head_dim

    def window(self, layer: int) -> int | None:
        return None


def _cache(dtype: torch.dtype) -> PagedKVCache:
    return PagedKVCache(
        _Shape(), num_blocks=6, block_size=4, dtype=dtype, device=torch.device("cpu")
    )


def _qkv_views(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    heads, kv_heads, dim = 9, _Shape.num_kv_heads, _Shape.head_dim
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype)
    _, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)


def _metadata(query_lens: list[int], context_lens: list[int], tables: list[list[int]]):
    cpu = torch.device("cpu")
    return CpuAttention().metadata(query_lens, context_lens, tables, 4, cpu)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)


# A prompt of 7 tokens over blocks 2 and 5; a decode at position 9 of blocks 1, 0, 3 with a
# prompt of 2 tokens over block 4 in the same step.
STEPS = [([7], [7], [[2, 5]]), ([1, 2], [10, 2], [[1, 0, 3], [4]])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", STEPS)
def test_write_stores_what_index_copy_stores(dtype: torch.dtype, step: tuple) -> None:
    meta = _metadata(*step)
    k, v = _qkv_views(meta.slot_mapping.numel(), dtype)
    want, got = _cache(dtype), _cache(dtype)
    TorchAttention().write_kv(want, 1, k, v, meta)  # index_copy_
    CpuAttention().write_kv(got, 1, k, v, meta)
    for layer in (0, 1):
        for a, b in zip(want.layer(layer), got.layer(layer), strict=True):
            assert torch.equal(_bits(a), _bits(b))
    last_slot = int(meta.slot_mapping[-1])
    assert torch.equal(_bits(got.flat_layer(1)[0][last_slot]), _bits(k[-1]))


def test_other_dtypes_go_through_the_torch_path() -> None:
    k, v = _qkv_views(2, torch.float32)
    got = _cache(torch.bfloat16)
    CpuAttention().write_kv(got, 0, k, v, _metadata([2], [2], [[1]]))
    assert torch.equal(got.flat_layer(0)[1][5], v[1].to(torch.bfloat16))


def test_bad_slots_and_shapes_are_refused_and_nothing_is_written() -> None:
    cache = _cache(torch.float32)
    k, v = _qkv_views(2, torch.float32)
    k_flat, v_flat = cache.flat_layer(0)
    with pytest.raises(RuntimeError, match="slot 24 out of range for 24 slots"):
        torch.ops.layerserve.write_kv_(k_flat, v_flat, k, v, torch.tensor([0, 24]))
    assert not k_flat.any() and not v_flat.any()
    with pytest.raises(RuntimeError, match="one slot a token"):
        torch.ops.layerserve.write_kv_(k_flat, v_flat, k, v, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="in the cache's dtype"):
        torch.ops.layerserve.write_kv_(k_flat, v_flat, k.double(), v, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="matching the cache's"):
        torch.ops.layerserve.write_kv_(k_flat, v_flat, k[:, :2], v, torch.tensor([0, 1]))
