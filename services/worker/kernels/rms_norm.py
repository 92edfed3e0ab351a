"""Host side of RMSNorm: argument checks, output allocation, launch; and the torch reference.

rms_norm(x, w, eps)                   -> rmsnorm(x) * w
add_rms_norm(x, residual, w, eps)     -> (rmsnorm(x + residual) * w, x + residual)

The fused form lets a decoder layer keep the residual stream apart from the normalised
activations, reading each row once instead of three times (add, norm, scale)."""

from __future__ import annotations

import torch

from services.worker.kernels.platform_tensors import (
    check_float,
    check_same,
    check_shape,
    check_tensor,
    check_unit_stride,
    next_power_of_2,
)
from services.worker.kernels.rms_norm_kernel import rms_norm_kernel

# A row lives in one program's registers; 64 KiB of input per row (hidden 32768 in fp16)
# is where that stops fitting and a looped kernel would be needed. Llama-3 405B has 16384.
MAX_ROW_BYTES = 65536


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [T, d], weight [d] -> [T, d] in x's dtype (out, if given, may be x itself)."""
    _check_args(x, weight, "x")
    out = _check_out(out, x)
    _launch(x, x, x, weight, out, eps, has_residual=False)
    return out


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, d], weight [d] -> (rmsnorm(x + residual) * weight, x + residual).

    inplace: the normalised rows overwrite x and the sum overwrites residual (both returned),
    which saves two [T, d] allocations per layer."""
    _check_args(x, weight, "x")
    check_tensor("residual", residual, 2)
    check_same("residual", residual, x, "x")
    check_shape("residual", residual, tuple(x.shape))
    check_unit_stride("residual", residual)
    out = x if inplace else torch.empty_like(x)
    residual_out = residual if inplace else torch.empty_like(residual)
    _launch(x, residual, residual_out, weight, out, eps, has_residual=True)
    return out, residual_out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch reference, exactly as services/worker/model/llama.py's RMSNorm computes it."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed


def _check_args(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    check_tensor(name, x, 2)
    check_float(name, x)
    check_unit_stride(name, x)
    check_tensor("weight", weight, 1)
    check_same("weight", weight, x, name)
    check_shape("weight", weight, (x.shape[1],))
    check_unit_stride("weight", weight)
    if x.shape[1] * x.element_size() > MAX_ROW_BYTES:
        raise ValueError(
            f"hidden size {x.shape[1]} ({x.dtype}) exceeds one program's row of "
            f"{MAX_ROW_BYTES} bytes"
        )


def _check_out(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(x)
    check_tensor("out", out, 2)
    check_same("out", out, x, "x")
    check_shape("out", out, tuple(x.shape))
    check_unit_stride("out", out)
    return out


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor,
    residual_out: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    *,
    has_residual: bool,
) -> None:
    tokens, hidden = x.shape
    if tokens == 0:
        return
    block = next_power_of_2(hidden)
    rms_norm_kernel[(tokens,)](
        x,
        residual,
        residual_out,
        weight,
        out,
        hidden,
        x.stride(0),
        residual.stride(0),
        residual_out.stride(0),
        out.stride(0),
        eps,
        HAS_RESIDUAL=has_residual,
        BLOCK_D=block,
        # One warp per 256 lanes keeps ~8 fp32 values per thread; 8 warps suffice for 4096.
        num_warps=min(max(block // 256, 1), 8),
    )
