"""Host side of the KV cache write: argument checks and launch; the torch reference.

write_kv_cache(k, v, k_cache, v_cache, slot_mapping) stores k, v [T, Hkv, D] into one
layer's caches [num_blocks, block_size, Hkv, D] (PagedKVCache.layer(i)) at slot_mapping [T];
a negative slot writes nothing. Strided k and v (views of a fused qkv output) are read in
place, no copy."""

from __future__ import annotations

import torch
import triton

from services.worker.kernels.cache_write_kernel import cache_write_kernel
from services.worker.kernels.platform_tensors import (
    check_float,
    check_index,
    check_same,
    check_tensor,
    check_unit_stride,
    next_power_of_2,
)

# Values one program moves per tensor (BLOCK_H * BLOCK_D): 1024 covers a whole token of
# 8 KV heads x 128 (Llama 3 8B/70B) in one program, 8 per thread at 4 warps; more heads split
# over the grid's second axis.
MAX_TOKEN_BLOCK = 1024


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v [T, Hkv, D] -> k_cache, v_cache [num_blocks, block_size, Hkv, D] at slots [T].

    Slots outside [0, num_blocks * block_size) write nothing (negative: padding rows)."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    tokens, num_kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    num_blocks, block_size = k_cache.shape[:2]
    block_d = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(num_kv_heads), max(MAX_TOKEN_BLOCK // block_d, 1))
    grid = (tokens, triton.cdiv(num_kv_heads, block_h))
    cache_write_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping,
        num_kv_heads, head_dim, block_size, num_blocks * block_size,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The torch reference: PagedKVCache.write's index_copy_, skipping negative slots."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for new, cache in ((k, k_cache), (v, v_cache)):
        flat = cache.view(-1, *cache.shape[2:])  # [num_slots, Hkv, D]
        flat.index_copy_(0, slots, new[keep].to(cache.dtype))


def _check_args(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_tensor("k", k, 3)
    check_float("k", k)
    check_tensor("v", v, 3)
    check_same("v", v, k, "k")
    check_tensor("k_cache", k_cache, 4)
    check_float("k_cache", k_cache)
    check_tensor("v_cache", v_cache, 4)
    check_same("v_cache", v_cache, k_cache, "k_cache")
    if k_cache.device != k.device:
        raise ValueError(f"k_cache is on {k_cache.device} but k on {k.device}")
    if v.shape != k.shape:
        raise ValueError(f"k and v differ in shape: {tuple(k.shape)}, {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache and v_cache differ in shape: {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if tuple(k_cache.shape[2:]) != tuple(k.shape[1:]):
        raise ValueError(
            f"cache heads x dim {tuple(k_cache.shape[2:])} != new K/V's {tuple(k.shape[1:])}"
        )
    for name, tensor in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_stride(name, tensor)
    check_tensor("slot_mapping", slot_mapping, 1)
    check_index("slot_mapping", slot_mapping)
    if slot_mapping.shape[0] != k.shape[0] or slot_mapping.device != k.device:
        raise ValueError(
            f"slot_mapping must be [{k.shape[0]}] on {k.device}, "
            f"got {tuple(slot_mapping.shape)} on {slot_mapping.device}"
        )
