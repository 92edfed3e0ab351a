"""Host side of SiLU-and-multiply: argument checks, output allocation, launch; the reference.

silu_mul(x [T, 2I]) -> silu(x[:, :I]) * x[:, I:]  [T, I]   (gate first, then up)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from services.worker.kernels.platform_tensors import (
    check_float,
    check_same,
    check_shape,
    check_tensor,
    check_unit_stride,
    next_power_of_2,
)
from services.worker.kernels.silu_mul_kernel import silu_mul_kernel

# Columns per program: 1024 lanes (4 warps x 8 values) is enough work to hide memory latency
# while a [T, I] grid still has thousands of programs for one decode token of a 7B model.
MAX_BLOCK_I = 1024


def silu_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] (gate | up) -> [T, I] in x's dtype."""
    check_tensor("x", x, 2)
    check_float("x", x)
    check_unit_stride("x", x)
    tokens, width = x.shape
    if width % 2:
        raise ValueError(f"x must hold gate and up halves, got an odd width {width}")
    intermediate = width // 2
    if out is None:
        out = torch.empty((tokens, intermediate), dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, 2)
        check_same("out", out, x, "x")
        check_shape("out", out, (tokens, intermediate))
        check_unit_stride("out", out)
    if tokens == 0 or intermediate == 0:
        return out
    block = min(next_power_of_2(intermediate), MAX_BLOCK_I)
    grid = (tokens, triton.cdiv(intermediate, block))
    silu_mul_kernel[grid](
        x, out, intermediate, x.stride(0), out.stride(0), BLOCK_I=block, num_warps=4
    )
    return out


def silu_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """The torch reference, as services/worker/model/llama.py's LlamaMLP computes it."""
    gate, up = x.split(x.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up
