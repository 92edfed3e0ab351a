"""The torch backend's norm and RoPE in as few ops as give the reference's exact values.

At batch 1 on a CPU each op costs its dispatch (a few µs), not its arithmetic: the reference
rms_norm is 8 ops and apply_rotary 7 per tensor (slices, a negation and a cat for rotate_half),
~30 per layer with SiLU-mul and the residual adds. These give the same bits as the references
in torch_attention.py (float32, bfloat16 and float16; tests/unit/worker/test_torch_ops.py) in
fewer ops: rms_norm is one fused op in float32 (three around it in half precision), RoPE is
four per tensor, its sign folded into a sin table made once per table.

torch.compile does fuse them, but each compiled call costs tens of µs of guards on the CPU,
more than the ops it replaces at batch 1 (docs/benchmarks.md, "Issue 18")."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, d] -> [T, d]: the statistic in float32 as HF does, then weight * x in x's dtype."""
    shape = (x.shape[-1],)
    if x.dtype == torch.float32:
        return F.rms_norm(x, shape, weight, eps)
    return weight * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)


def rope_tables(
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """From the [P, D] tables, cos and signed sin [T, 1, D] of each token in `dtype`: the signed
    sin is (-sin | sin) over the two halves, so apply_rope swaps halves with no negation.

    Once per step, shared by every layer."""
    signed_sin = _signed_sin(sin)[positions]
    return cos[positions].unsqueeze(1).to(dtype), signed_sin.unsqueeze(1).to(dtype)


@functools.lru_cache(maxsize=4)
def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """(-sin | sin) over the two halves of the whole [P, D] table, made once per table (a
    tensor hashes by identity) instead of per step: the same products, a sign flip is exact."""
    half = sin.shape[-1] // 2
    signs = torch.ones(sin.shape[-1], dtype=sin.dtype, device=sin.device)
    signs[:half] = -1
    return sin * signs


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated as HF's rotate_half does: x * cos + (-x2 | x1) * sin.

    (x2 | x1) * (-sin | sin) has the reference's products bit for bit (a sign flip is exact)."""
    tokens, heads, dim = x.shape
    swapped = x.view(tokens, heads, 2, dim // 2).flip(2).view(tokens, heads, dim)
    return x * cos + swapped * signed_sin


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up [T, I]; the silu in place in the matmul's output
    (a temporary the caller drops), so one [T, I] tensor is allocated, not two."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate, inplace=True) * up
