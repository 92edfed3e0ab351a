"""SwiGLU's activation: silu(gate) * up over rows laid out [gate | up], as the fused
gate_up projection of services/worker/model/llama.py produces them.

Rounding follows torch's F.silu(gate) * up in the input dtype: silu in fp32 rounded to the
dtype, then the product in fp32 rounded again."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(
    x_ptr,  # [T, 2 * I]: gate in columns [0, I), up in [I, 2I)
    out_ptr,  # [T, I]
    intermediate_size,
    stride_x,
    stride_out,
    BLOCK_I: tl.constexpr,  # columns per program; the grid's second axis covers the rest
):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31 elements
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < intermediate_size
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + intermediate_size + cols, mask=mask, other=0.0)
    activated = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out + cols, (activated * up.to(tl.float32)).to(dtype), mask=mask
    )
