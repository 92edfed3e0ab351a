"""x @ W.T for a weight held as 4-bit values with a scale and offset per 32 input columns
(layers/int4_weight.py): w[n, k] = q[n, k] * scale[n, k // 32] + offset[n, k // 32], the
values two a byte, column 2j in the low nibble of byte j and 2j + 1 in the high one.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output and walks K one group (32
columns, 16 bytes) at a time: the even columns' weights (low nibbles) and the odd columns'
(high nibbles) are dequantized in fp32 and multiplied with the matching columns of x, so no
interleave is needed. The dot runs in x's dtype with an fp32 accumulator."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int4_matmul_kernel(
    x_ptr,  # [M, K], the compute dtype
    w_ptr,  # [N, K / 2] uint8: two 4-bit values a byte
    scale_ptr,  # [N, K / 32], the compute dtype
    offset_ptr,  # [N, K / 32], the compute dtype
    out_ptr,  # [M, N], the compute dtype
    M,
    N,
    groups,  # K / 32
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    BLOCK_M: tl.constexpr,  # >= 16: tl.dot's smallest tile
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pairs = tl.arange(0, 16)  # byte j of a group: columns 2j and 2j + 1
    row_ok = rows < M
    col_ok = cols < N
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    for g in range(0, groups):
        packed = tl.load(w_rows + g * 16 + pairs[None, :], mask=col_ok[:, None], other=0)
        scale = tl.load(scale_ptr + cols * stride_sn + g, mask=col_ok, other=0.0).to(tl.float32)
        offset = tl.load(offset_ptr + cols * stride_sn + g, mask=col_ok, other=0.0).to(tl.float32)
        low = (packed & 0x0F).to(tl.float32) * scale[:, None] + offset[:, None]  # [BN, 16]
        high = (packed >> 4).to(tl.float32) * scale[:, None] + offset[:, None]
        even = tl.load(x_rows + g * 32 + 2 * pairs[None, :], mask=row_ok[:, None], other=0.0)
        odd = tl.load(x_rows + g * 32 + 2 * pairs[None, :] + 1, mask=row_ok[:, None], other=0.0)
        acc += tl.dot(even, tl.trans(low.to(dtype)))
        acc += tl.dot(odd, tl.trans(high.to(dtype)))
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(dtype), mask=row_ok[:, None] & col_ok[None, :])
