"""RMSNorm, alone or fused with the residual add before it, one program per token row.

Numerics follow services/worker/model/llama.py's RMSNorm step by step, so the kernel and the
torch model round at the same places: the statistic in fp32, the normalised row rounded to the
input dtype, then multiplied by the weight and rounded again. The fused form first rounds
x + residual to the dtype (as torch's add would) and normalises that rounded sum."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(
    x_ptr,  # [T, d] input; with HAS_RESIDUAL, the sub-layer output to add
    residual_ptr,  # [T, d] residual stream (read only with HAS_RESIDUAL)
    residual_out_ptr,  # [T, d] x + residual, written only with HAS_RESIDUAL (may alias residual)
    weight_ptr,  # [d]
    out_ptr,  # [T, d] normalised rows (may alias x)
    hidden_size,
    stride_x,
    stride_residual,
    stride_residual_out,
    stride_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,  # the fused add; a constexpr so the plain form pays nothing
    BLOCK_D: tl.constexpr,  # next power of two >= hidden_size: the whole row in one block
):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_D)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty  # the input's dtype: the wrapper allocates out alike
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    x = x.to(tl.float32)
    # Padding lanes loaded 0, so they add nothing to the sum; divide by the real width.
    mean_square = tl.sum(x * x, axis=0) / hidden_size
    normed = (x * tl.rsqrt(mean_square + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * weight).to(dtype), mask=mask)
