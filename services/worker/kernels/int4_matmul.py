"""Host side of the int4 group-wise matmul: argument checks, output allocation, launch; the
reference.

int4_matmul(x [M, K], nibbles [N, K/2] uint8, scale [N, K/32], offset [N, K/32]) -> [M, N]
   = x @ (q * scale + offset).T, q unpacked from nibbles (column 2j low, 2j + 1 high)."""

from __future__ import annotations

import torch
import triton

from services.worker.kernels.int4_matmul_kernel import int4_matmul_kernel
from services.worker.kernels.platform_tensors import check_float, check_tensor, check_unit_stride

GROUP_SIZE = 32  # input columns per scale/offset (a GGUF block)
# Output columns per program: 64 keeps a decode step's [1, N] output spread over N / 64
# programs (SmolLM2's 576-wide projections: 9; its 3072-wide gate_up: 48).
BLOCK_N = 64


def int4_matmul(
    x: torch.Tensor, nibbles: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; ValueError for shapes, dtypes or layouts it cannot read."""
    check_tensor("x", x, 2)
    check_float("x", x)
    check_unit_stride("x", x)
    check_unit_stride("nibbles", nibbles)
    rows, width = x.shape
    if nibbles.dtype != torch.uint8 or nibbles.dim() != 2 or nibbles.shape[1] * 2 != width:
        raise ValueError(f"nibbles must be uint8 [N, {width // 2}], got {tuple(nibbles.shape)}")
    if width % GROUP_SIZE:
        raise ValueError(f"x's width {width} is not whole groups of {GROUP_SIZE}")
    groups = (nibbles.shape[0], width // GROUP_SIZE)
    for name, t in (("scale", scale), ("offset", offset)):
        if tuple(t.shape) != groups or t.dtype != x.dtype or t.stride(1) != 1:
            raise ValueError(f"{name} must be {x.dtype} {list(groups)} with unit column stride")
    out = torch.empty((rows, nibbles.shape[0]), dtype=x.dtype, device=x.device)
    if rows == 0 or out.shape[1] == 0:
        return out
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    grid = (triton.cdiv(rows, block_m), triton.cdiv(out.shape[1], BLOCK_N))
    int4_matmul_kernel[grid](
        x, nibbles, scale, offset, out, rows, out.shape[1], groups[1],
        x.stride(0), nibbles.stride(0), scale.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, num_warps=4,
    )  # fmt: skip
    return out


def int4_matmul_ref(
    x: torch.Tensor, nibbles: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """The torch reference: the weight dequantized in float32, then x @ W.T in float32."""
    q = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=-1).flatten(-2)  # [N, K]
    w = q.float().unflatten(-1, (scale.shape[1], GROUP_SIZE))
    w = (w * scale.float()[..., None] + offset.float()[..., None]).flatten(-2)
    return (x.float() @ w.T).to(x.dtype)
