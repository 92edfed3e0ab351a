"""RoPE and the KV cache write as one op (csrc/rope.cpp: rope_write_kv_, what
CpuAttention.rope_write_kv calls once a layer): q, k and the cache end bit for bit as the two
ops it replaces leave them (rope_ then write_kv_) and as the torch path's apply_rope and
index_copy_ leave them, in float32 and bfloat16, for q/k/v as views of one fused projection."""

from __future__ import annotations

import pytest
import torch

from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 4


pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


class _Shape:
    num_layers, num_kv_heads, head_dim = 2, KV_HEADS, DIM
    kv_size = num_kv_heads * head_dim

    def window(self, layer: int) -> int | None:
        return None


def _cache(dtype: torch.dtype) -> PagedKVCache:
    return PagedKVCache(_Shape(), num_blocks=6, block_size=BLOCK, dtype=dtype, device="cpu")


def _qkv(tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, H + 2 Hkv, D]: what FusedAttention.project_qkv splits into q, k, v views."""
    generator = torch.Generator().manual_seed(tokens)
    return torch.randn(tokens, HEADS + 2 * KV_HEADS, DIM, generator=generator).to(dtype)


def _split(qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(qkv.split_with_sizes([HEADS, KV_HEADS, KV_HEADS], 1))


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)


# A prompt of 7 tokens over blocks 2 and 5; a decode at position 9 of blocks 1, 0, 3 with a
# prompt of 2 tokens over block 4 in the same step.
STEPS = [([7], [7], [[2, 5]]), ([1, 2], [10, 2], [[1, 0, 3], [4]])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", STEPS)
def test_one_op_leaves_what_rope_then_write_leave(dtype: torch.dtype, step: tuple) -> None:
    backend = CpuAttention()
    meta = backend.metadata(*step, BLOCK, torch.device("cpu"))
    positions = 11 + meta.positions  # not 0: the rotation must show
    theta = 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM)
    angles = torch.outer(torch.arange(64).float(), theta)
    table = torch.cat([angles, angles], dim=-1)
    rotary = backend.rotary(table.cos(), table.sin(), positions, dtype)
    tokens = meta.slot_mapping.numel()

    fused, fused_cache = _qkv(tokens, dtype), _cache(dtype)
    q, k, v = _split(fused)
    q_out = backend.rope_write_kv(fused_cache, 1, q, k, v, rotary, meta)

    two_ops, two_ops_cache = _qkv(tokens, dtype), _cache(dtype)
    q2, k2, v2 = _split(two_ops)
    q2, k2 = backend.apply_rope(q2, k2, positions, rotary)  # rope_
    backend.write_kv(two_ops_cache, 1, k2, v2, meta)  # write_kv_

    torch_qkv, torch_cache = _qkv(tokens, dtype), _cache(dtype)
    torch_q = TorchAttention().rope_write_kv(torch_cache, 1, *_split(torch_qkv), rotary, meta)

    assert not torch.equal(_bits(q_out), _bits(_split(_qkv(tokens, dtype))[0]))  # rotated
    assert torch.equal(_bits(q_out), _bits(q2)) and torch.equal(_bits(q_out), _bits(torch_q))
    assert torch.equal(_bits(fused), _bits(two_ops))  # q and k rotated in place, v untouched
    for layer in (0, 1):
        for want in (two_ops_cache, torch_cache):
            for a, b in zip(want.layer(layer), fused_cache.layer(layer), strict=True):
                assert torch.equal(_bits(a), _bits(b))
    assert fused_cache.flat_layer(1)[0].abs().sum() > 0  # something was written


def test_out_of_range_slot_is_refused() -> None:
    backend = CpuAttention()
    meta = backend.metadata([1], [1], [[0]], BLOCK, torch.device("cpu"))
    meta.slot_mapping = torch.tensor([6 * BLOCK])  # one past the cache
    cos = torch.ones(1, 1, DIM)
    q, k, v = _split(_qkv(1, torch.float32))
    with pytest.raises(RuntimeError, match="out of range"):
        backend.rope_write_kv(_cache(torch.float32), 0, q, k, v, (cos, cos), meta)
