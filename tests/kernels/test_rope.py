"""apply_rope against the models' RopeTables (layers/rotary.py) + apply_rotary (rotate_half)."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.rope import apply_rope, apply_rope_ref, rope_cos_sin
from services.worker.layers.rotary import RopeTables
from services.worker.layers.torch_attention import apply_rotary
from services.worker.model.config import Llama3RopeScaling, LlamaConfig, rope_inv_freq
from tests.kernels.small_ops_cases import DEVICE_DTYPES, tolerance

MAX_POSITIONS = 4096
LLAMA3 = Llama3RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=1024
)


def _config(
    heads: int, kv_heads: int, head_dim: int, scaling: Llama3RopeScaling | None
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32, hidden_size=heads * head_dim, intermediate_size=64, num_layers=1,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=100000.0,
        rms_norm_eps=1e-5, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        eos_token_ids=(0,), rope_scaling=scaling,
    )  # fmt: skip


def _qk(tokens: int, heads: int, kv_heads: int, head_dim: int, device: str, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(tokens * heads + head_dim)
    q = torch.randn(tokens, heads, head_dim, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    return q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype)


# Ragged batches: a prefill chunk after a cached prefix, then decodes far into the context.
POSITIONS = {
    "one-token": [7],
    "ragged": [*range(40, 45), 0, 1000, 4095],
}


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "scaling"),
    [(9, 3, 64, None), (32, 8, 128, LLAMA3), (40, 8, 128, None)],
    ids=["smollm2-d64", "llama3-d128", "40-heads-d128"],
)
@pytest.mark.parametrize("batch", POSITIONS)
def test_matches_the_model(
    device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, scaling, batch: str
) -> None:
    config = _config(heads, kv_heads, head_dim, scaling)
    positions = torch.tensor(POSITIONS[batch], device=device)
    q, k = _qk(len(positions), heads, kv_heads, head_dim, device, dtype)
    model_rope = RopeTables(rope_inv_freq(config), MAX_POSITIONS, torch.device(device))
    cos_t, sin_t = model_rope(positions, dtype)
    expected_q, expected_k = apply_rotary(q, cos_t, sin_t), apply_rotary(k, cos_t, sin_t)
    cos, sin = rope_cos_sin(rope_inv_freq(config), MAX_POSITIONS, device)
    # The model's own [P, D] tables work too: only their first half is read.
    for tables in ((cos, sin), (model_rope.cos, model_rope.sin)):
        q_out, k_out = apply_rope(q, k, positions, *tables)
        torch.testing.assert_close(q_out, expected_q, **tolerance(dtype))
        torch.testing.assert_close(k_out, expected_k, **tolerance(dtype))
    ref_q, ref_k = apply_rope_ref(q, k, positions, cos, sin)
    torch.testing.assert_close(ref_q, expected_q, atol=0, rtol=0)
    torch.testing.assert_close(ref_k, expected_k, atol=0, rtol=0)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_in_place_on_a_fused_qkv_buffer(device: str, dtype: torch.dtype) -> None:
    """q and k as strided views of one qkv row are rotated where they lie; v is untouched."""
    tokens, heads, kv_heads, dim = 6, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(device=device, dtype=dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    positions = torch.arange(10, 10 + tokens, device=device, dtype=torch.int32)
    cos, sin = rope_cos_sin(rope_inv_freq(_config(heads, kv_heads, dim, None)), 64, device)
    expected_q, expected_k = apply_rope_ref(q, k, positions, cos, sin)
    q_out, k_out = apply_rope(q, k, positions, cos, sin, inplace=True)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    torch.testing.assert_close(q, expected_q, **tolerance(dtype))
    torch.testing.assert_close(k, expected_k, **tolerance(dtype))
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_position_past_the_table_reads_nothing(device: str, dtype: torch.dtype) -> None:
    q, k = _qk(2, 4, 2, 64, device, dtype)
    cos, sin = rope_cos_sin(rope_inv_freq(_config(4, 2, 64, None)), 16, device)
    q_out, k_out = apply_rope(q, k, torch.tensor([3, 16], device=device), cos, sin)
    assert not q_out[1].any() and not k_out[1].any()
    ref_q, _ = apply_rope_ref(q[:1], k[:1], torch.tensor([3], device=device), cos, sin)
    torch.testing.assert_close(q_out[:1], ref_q, **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rejects_bad_arguments(device: str, dtype: torch.dtype) -> None:
    q, k = _qk(2, 4, 2, 64, device, dtype)
    positions = torch.tensor([0, 1], device=device)
    cos, sin = rope_cos_sin(rope_inv_freq(_config(4, 2, 64, None)), 16, device)
    with pytest.raises(ValueError, match="k must be"):
        apply_rope(q, k[:, :, :32], positions, cos, sin)
    with pytest.raises(ValueError, match="positions must be int32 or int64"):
        apply_rope(q, k, positions.float(), cos, sin)
    with pytest.raises(ValueError, match="positions must have shape"):
        apply_rope(q, k, positions[:1], cos, sin)
    with pytest.raises(ValueError, match="cos must have >= 32 columns"):
        apply_rope(q, k, positions, cos[:, :16], sin)
    with pytest.raises(ValueError, match="sin must be float32"):
        apply_rope(q, k, positions, cos, sin.double())
