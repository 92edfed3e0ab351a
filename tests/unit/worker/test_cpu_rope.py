"""The extension's RoPE (csrc/rope.cpp, CpuAttention.apply_rope) and SiLU-mul
(csrc/small_ops.cpp) against torch_ops.py:
the same bits in float32, bfloat16 and float16, on q and k as the fused qkv projection lays
them out (strided views of one matrix), rotated in place. A bit off would move a model's greedy
outputs; the e2e reference tests hold them."""

from __future__ import annotations

import pytest
import torch

from services.worker.layers import torch_ops
from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.rotary import RopeTables

pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 7])
def test_rope_matches_the_torch_ops_bit_for_bit(dtype: torch.dtype, tokens: int) -> None:
    heads, kv_heads, dim = 9, 3, 64
    inv_freq = 1.0 / (1e5 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    tables = RopeTables(inv_freq, 4096, torch.device("cpu"))
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(tokens))
    cos, sin = torch_ops.rope_tables(tables.cos, tables.sin, positions, dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype) * 4
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)
    want_q, want_k = torch_ops.apply_rope(q, cos, sin), torch_ops.apply_rope(k, cos, sin)
    untouched_v = qkv[:, (heads + kv_heads) * dim :].clone()

    got_q, got_k = CpuAttention().apply_rope(q, k, positions, (cos, sin))

    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert got_q.data_ptr() == q.data_ptr()  # in place: no new tensor per layer
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], untouched_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_mul_matches_the_torch_ops_bit_for_bit(dtype: torch.dtype) -> None:
    """csrc/small_ops.cpp: torch_ops.silu_mul in one dispatch (float32 written out with torch's
    exp; an intermediate size not a multiple of 16 through ATen's calls), large gates too."""
    generator = torch.Generator().manual_seed(1)
    backend = CpuAttention()
    for rows, inter, spread in ((5, 1536, 1.0), (9, 1536, 40.0), (3, 40, 5.0)):
        gate_up = (torch.randn(rows, 2 * inter, generator=generator) * spread).to(dtype)
        got = backend.silu_mul(gate_up.clone())
        assert torch.equal(got, torch_ops.silu_mul(gate_up.clone())), (rows, inter, spread)
