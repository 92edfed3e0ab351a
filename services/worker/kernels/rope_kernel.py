"""Rotary position embedding with Hugging Face's rotate_half pairing (dim i with i + D/2),
the pairing services/worker/model/llama.py uses (its GGUF loader undoes llama.cpp's).

    out[:half] = x[:half] * cos - x[half:] * sin
    out[half:] = x[half:] * cos + x[:half] * sin

One program rotates a block of heads of one token; q's head blocks come first on the grid's
second axis, then k's, so q and k take one launch. Each program loads x and both tables before
it stores, so out may alias x (in place)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    first_head,
    num_heads,
    stride_x_token,
    stride_x_head,
    stride_out_token,
    stride_out_head,
    cos,  # [1, BLOCK_HALF] fp32
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    heads = first_head + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads < num_heads)[:, None] & (dims < HALF)[None, :]
    x = x_ptr + token * stride_x_token + heads[:, None] * stride_x_head + dims[None, :]
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = out_ptr + token * stride_out_token + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(out + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr,  # [T, H, D]
    k_ptr,  # [T, Hkv, D]
    q_out_ptr,  # [T, H, D], may alias q
    k_out_ptr,  # [T, Hkv, D], may alias k
    positions_ptr,  # [T] int32/int64
    cos_ptr,  # [P, >= D/2] fp32: columns [0, D/2) are read
    sin_ptr,
    num_q_heads,
    num_k_heads,
    num_positions,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_q_out_token,
    stride_q_out_head,
    stride_k_out_token,
    stride_k_out_head,
    stride_cos,
    stride_sin,
    HALF: tl.constexpr,  # head_dim // 2: a constexpr so the + HALF offsets are known aligned
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_H: tl.constexpr,  # heads per program
):
    token = tl.program_id(0).to(tl.int64)  # int64: token * stride can pass 2**31 elements
    head_block = tl.program_id(1)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)
    # An out-of-range position reads no memory: its tables load as 0 and its rows come out 0.
    table_mask = (dims < HALF) & (position >= 0) & (position < num_positions)
    cos = tl.load(cos_ptr + position * stride_cos + dims, mask=table_mask, other=0.0)
    sin = tl.load(sin_ptr + position * stride_sin + dims, mask=table_mask, other=0.0)
    cos = cos.to(tl.float32)[None, :]
    sin = sin.to(tl.float32)[None, :]
    q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    if head_block < q_blocks:
        _rotate_heads(
            q_ptr, q_out_ptr, token, head_block * BLOCK_H, num_q_heads,
            stride_q_token, stride_q_head, stride_q_out_token, stride_q_out_head,
            cos, sin, HALF, BLOCK_HALF, BLOCK_H,
        )  # fmt: skip
    else:
        _rotate_heads(
            k_ptr, k_out_ptr, token, (head_block - q_blocks) * BLOCK_H, num_k_heads,
            stride_k_token, stride_k_head, stride_k_out_token, stride_k_out_head,
            cos, sin, HALF, BLOCK_HALF, BLOCK_H,
        )  # fmt: skip
