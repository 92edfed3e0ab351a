"""The extension's RMSNorm and residual-add-then-RMSNorm (csrc/small_ops.cpp, CpuAttention's
rms_norm and add_rms_norm) against torch_ops.rms_norm: the same bits in float32, bfloat16 and
float16, for row widths that take each branch of torch's summation order (shorter than a
vector, a tail past the last vector, long enough for its cascade's levels), one row and many,
one thread and two. A bit off would move the float32 stack's greedy tokens away from the dense
reference's (tests/e2e/test_reference.py)."""

from __future__ import annotations

import pytest
import torch

from services.worker.layers import torch_ops
from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.torch_attention import TorchAttention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
WIDTHS = [7, 64, 100, 576, 960, 2304, 5000]


pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


def _rows(tokens: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows of different magnitudes (a sum's rounding depends on them)."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.rand(tokens, 1, generator=generator) * 40
    return (torch.randn(tokens, width, generator=generator) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("tokens", [1, 37])
def test_rms_norm_matches_the_torch_ops_bit_for_bit(
    dtype: torch.dtype, width: int, tokens: int
) -> None:
    x = _rows(tokens, width, dtype, seed=width + tokens)
    weight = _rows(1, width, dtype, seed=1)[0]

    got = CpuAttention().rms_norm(x, weight, 1e-5)

    assert torch.equal(got, torch_ops.rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [7, 576, 2304])
def test_add_rms_norm_adds_in_place_then_norms_as_the_torch_path(
    dtype: torch.dtype, width: int
) -> None:
    x = _rows(5, width, dtype, seed=2)
    residual = _rows(5, width, dtype, seed=3)
    weight = _rows(1, width, dtype, seed=4)[0]
    summed = residual + x
    want = torch_ops.rms_norm(summed, weight, 1e-6)
    torch_residual = residual.clone()

    got = CpuAttention().add_rms_norm(x.clone(), residual, weight, 1e-6)

    assert torch.equal(residual, summed)  # the stream, updated in place
    assert torch.equal(got, want)
    assert torch.equal(TorchAttention().add_rms_norm(x.clone(), torch_residual, weight, 1e-6), want)
    assert torch.equal(torch_residual, summed)


def test_many_rows_on_two_threads_give_the_same_bits() -> None:
    """A prefill's rows are split across threads; each row's sum keeps its order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = _rows(300, 2304, torch.float32, seed=5)
        weight = _rows(1, 2304, torch.float32, seed=6)[0]
        assert torch.equal(
            CpuAttention().rms_norm(x, weight, 1e-6), torch_ops.rms_norm(x, weight, 1e-6)
        )
    finally:
        torch.set_num_threads(threads)
