"""Stores each new token's K and V into the paged cache at its flat slot.

slot = block_id * block_size + offset, as AttentionMetadata.slot_mapping holds it. A negative
slot marks a padding row that owns no slot (a batch padded to a fixed size): nothing is
written for it. A slot past the cache is dropped too, so a bad slot mapping can never write
outside the cache buffer."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def cache_write_kernel(
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    slot_mapping_ptr,  # [T] int32/int64
    num_kv_heads,
    head_dim,
    block_size,
    num_slots,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    BLOCK_H: tl.constexpr,  # heads per program
    BLOCK_D: tl.constexpr,  # next power of two >= head_dim
):
    token = tl.program_id(0).to(tl.int64)  # int64: token * stride can pass 2**31 elements
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    in_range = (slot >= 0) & (slot < num_slots)
    mask = in_range & (heads < num_kv_heads)[:, None] & (dims < head_dim)[None, :]
    heads = heads[:, None]
    dims = dims[None, :]
    k = tl.load(k_ptr + token * stride_k_token + heads * stride_k_head + dims, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + heads * stride_v_head + dims, mask=mask)
    k_dst = k_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
    v_dst = v_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
    k_dst = k_dst + heads * stride_kc_head + dims
    v_dst = v_dst + heads * stride_vc_head + dims
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
