"""Host side of RoPE: argument checks, outputs, launch; the cos/sin tables; the reference.

apply_rope(q [T, H, D], k [T, Hkv, D], positions [T], cos, sin) -> rotated (q, k)

The tables are [P, D/2] float32 (rope_cos_sin), or the model's own [P, D] buffers, whose
second half repeats the first: only columns [0, D/2) are read. Rope scaling (llama3) lives in
the inverse frequencies the tables are built from, so the kernel needs no knowledge of it."""

from __future__ import annotations

import torch
import triton

from services.worker.kernels.platform_tensors import (
    check_float,
    check_index,
    check_same,
    check_shape,
    check_tensor,
    check_unit_stride,
    next_power_of_2,
)
from services.worker.kernels.rope_kernel import rope_kernel

# Elements of one half-row block a program rotates (BLOCK_H * BLOCK_HALF): with both halves
# loaded that is 2048 values, 16 per thread at 4 warps; more heads go to more programs.
MAX_HALF_BLOCK = 1024


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q [T, H, D] and k [T, Hkv, D] by their tokens' positions [T].

    cos, sin: [P, >= D/2] float32, row p for position p. inplace writes into q and k (views
    into a fused qkv buffer are fine) and returns them. A position outside [0, P) reads no
    memory and yields zeros: positions are the caller's to keep in range."""
    _check_args(q, k, positions, cos, sin)
    q_out = q if inplace else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = k if inplace else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    block_half = next_power_of_2(half)
    block_h = min(
        next_power_of_2(max(num_q_heads, num_k_heads)), max(MAX_HALF_BLOCK // block_half, 1)
    )
    grid = (tokens, triton.cdiv(num_q_heads, block_h) + triton.cdiv(num_k_heads, block_h))
    rope_kernel[grid](
        q, k, q_out, k_out, positions, cos, sin,
        num_q_heads, num_k_heads, cos.shape[0],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos.stride(0), sin.stride(0),
        HALF=half, BLOCK_HALF=block_half, BLOCK_H=block_h, num_warps=4,
    )  # fmt: skip
    return q_out, k_out


def rope_cos_sin(
    inv_freq: torch.Tensor, max_positions: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_positions, D/2] float32 from inverse frequencies [D/2].

    Pass services.worker.model.config.rope_inv_freq(config) (theta and llama3 scaling
    applied); the angles are computed as the models' RopeTables (layers/rotary.py) compute
    them."""
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
    return angles.cos().to(device), angles.sin().to(device)


def apply_rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference: llama.py's lookup and apply_rotary, from half-width tables."""
    half = q.shape[-1] // 2
    cos_t = cos[positions, :half].repeat(1, 2).unsqueeze(1).to(q.dtype)  # [T, 1, D]
    sin_t = sin[positions, :half].repeat(1, 2).unsqueeze(1).to(q.dtype)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos_t + rotated * sin_t

    return rotate(q), rotate(k)


def _check_args(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    check_tensor("q", q, 3)
    check_float("q", q)
    check_unit_stride("q", q)
    check_tensor("k", k, 3)
    check_same("k", k, q, "q")
    check_unit_stride("k", k)
    tokens, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if k.shape[0] != tokens or k.shape[2] != head_dim:
        raise ValueError(f"k must be [{tokens}, Hkv, {head_dim}] like q, got {tuple(k.shape)}")
    check_tensor("positions", positions, 1)
    check_index("positions", positions)
    check_shape("positions", positions, (tokens,))
    if positions.device != q.device:
        raise ValueError(f"positions is on {positions.device} but q on {q.device}")
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(name, table, 2)
        if table.dtype != torch.float32 or table.device != q.device:
            raise ValueError(
                f"{name} must be float32 on {q.device}, got {table.dtype} on {table.device}"
            )
        if table.shape[1] < head_dim // 2:
            raise ValueError(
                f"{name} must have >= {head_dim // 2} columns, got {tuple(table.shape)}"
            )
        check_unit_stride(name, table)
    if cos.shape[0] != sin.shape[0]:
        raise ValueError(f"cos and sin cover different positions: {cos.shape[0]}, {sin.shape[0]}")
