"""silu_mul against the model's F.silu(gate) * up, gate first."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.silu_mul import silu_mul, silu_mul_ref
from tests.kernels.small_ops_cases import DEVICE_DTYPES, tolerance


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@pytest.mark.parametrize(
    ("tokens", "intermediate"),
    [(1, 1536), (7, 1536), (3, 1000), (2, 2048), (5, 3), (1, 2049)],
    ids=["decode-smollm", "ragged-smollm", "not-pow2", "pow2", "tiny", "one-past-block"],
)
def test_matches_reference(device: str, dtype: torch.dtype, tokens: int, intermediate: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(tokens, 2 * intermediate, device=device, dtype=dtype) * 3
    torch.testing.assert_close(silu_mul(x), silu_mul_ref(x), **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_gate_is_the_first_half(device: str, dtype: torch.dtype) -> None:
    """Swapping gate and up changes the answer: the kernel must not mix them up."""
    gate = torch.tensor([[2.0, -1.0]], device=device, dtype=dtype)
    up = torch.tensor([[3.0, 4.0]], device=device, dtype=dtype)
    out = silu_mul(torch.cat([gate, up], dim=1))
    expected = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(out, expected, **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_strided_rows_and_out(device: str, dtype: torch.dtype) -> None:
    """Rows of a wider buffer (stride > 2I) are read in place; out= is written, not replaced."""
    torch.manual_seed(1)
    wide = torch.randn(4, 2 * 96 + 10, device=device, dtype=dtype)
    x = wide[:, : 2 * 96]
    out = torch.full((4, 96), float("nan"), device=device, dtype=dtype)
    result = silu_mul(x, out=out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, silu_mul_ref(x), **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_no_tokens(device: str, dtype: torch.dtype) -> None:
    assert silu_mul(torch.empty(0, 64, device=device, dtype=dtype)).shape == (0, 32)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rejects_bad_arguments(device: str, dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="odd width"):
        silu_mul(torch.zeros(2, 7, device=device, dtype=dtype))
    with pytest.raises(ValueError, match="2-D"):
        silu_mul(torch.zeros(2, 2, 8, device=device, dtype=dtype))
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        silu_mul(torch.zeros(8, 4, device=device, dtype=dtype).t())
    with pytest.raises(ValueError, match="int64"):
        silu_mul(torch.zeros(2, 8, device=device, dtype=torch.int64))
    with pytest.raises(ValueError, match="shape"):
        silu_mul(
            torch.zeros(2, 8, device=device, dtype=dtype),
            out=torch.zeros(2, 8, device=device, dtype=dtype),
        )
