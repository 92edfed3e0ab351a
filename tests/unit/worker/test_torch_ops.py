"""The torch backend's norm, RoPE and SiLU-mul (torch_ops.py) against the references they
replace (torch_attention.py): the same bits in every dtype, at batch 1 and over many tokens,
on q and k as the model hands them over (views into the fused qkv projection)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.worker.layers import torch_ops
from services.worker.layers.torch_attention import TorchAttention, apply_rotary, rms_norm

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
H, HKV, D = 9, 3, 64


def _random(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 37])
def test_rms_norm_equals_the_reference(dtype: torch.dtype, tokens: int) -> None:
    x = _random(tokens, 576, dtype=dtype) * 3
    weight = _random(576, dtype=dtype, seed=1)
    assert torch.equal(torch_ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 37])
def test_rope_equals_rotate_half_on_views_of_qkv(dtype: torch.dtype, tokens: int) -> None:
    qkv = _random(tokens, (H + 2 * HKV) * D, dtype=dtype)
    q, k, _ = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k = q.view(tokens, H, D), k.view(tokens, HKV, D)
    angles = _random(512, D, dtype=torch.float32, seed=2) * 10
    cos, sin = angles.cos(), angles.sin()
    positions = torch.randint(512, (tokens,), generator=torch.Generator().manual_seed(3))
    ref_cos, ref_sin = (t[positions].unsqueeze(1).to(dtype) for t in (cos, sin))
    backend = TorchAttention()
    rotary = backend.rotary(cos, sin, positions, dtype)
    got_q, got_k = backend.apply_rope(q, k, positions, rotary)
    assert torch.equal(got_q, apply_rotary(q, ref_cos, ref_sin))
    assert torch.equal(got_k, apply_rotary(k, ref_cos, ref_sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_equals_the_reference(dtype: torch.dtype) -> None:
    gate_up = _random(5, 2 * 1536, dtype=dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    assert torch.equal(torch_ops.silu_mul(gate_up.clone()), want)
