"""rms_norm and add_rms_norm against the model's RMSNorm (services/worker/model/llama.py)."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.rms_norm import add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref
from services.worker.model.llama import RMSNorm
from tests.kernels.small_ops_cases import DEVICE_DTYPES, tolerance

EPS = 1e-5
SHAPES = pytest.mark.parametrize(
    ("tokens", "hidden"),
    [(1, 576), (9, 576), (3, 2048), (4, 1000), (2, 8)],
    ids=["decode-smollm", "ragged-smollm", "2048", "not-pow2", "tiny"],
)


def _inputs(tokens: int, hidden: int, device: str, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen) * 2
    residual = torch.randn(tokens, hidden, generator=gen)
    weight = 1 + 0.5 * torch.randn(hidden, generator=gen)
    return (t.to(device=device, dtype=dtype) for t in (x, residual, weight))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@SHAPES
def test_rms_norm_matches_the_model(
    device: str, dtype: torch.dtype, tokens: int, hidden: int
) -> None:
    x, _, weight = _inputs(tokens, hidden, device, dtype)
    norm = RMSNorm(hidden, EPS, dtype, torch.device(device))
    norm.weight.data.copy_(weight)
    expected = norm(x)
    torch.testing.assert_close(rms_norm_ref(x, weight, EPS), expected, atol=0, rtol=0)
    torch.testing.assert_close(rms_norm(x, weight, EPS), expected, **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@SHAPES
def test_add_rms_norm_matches_reference(
    device: str, dtype: torch.dtype, tokens: int, hidden: int
) -> None:
    x, residual, weight = _inputs(tokens, hidden, device, dtype)
    normed, summed = add_rms_norm(x, residual, weight, EPS)
    expected_normed, expected_sum = add_rms_norm_ref(x, residual, weight, EPS)
    torch.testing.assert_close(summed, expected_sum, atol=0, rtol=0)
    torch.testing.assert_close(normed, expected_normed, **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_add_rms_norm_in_place(device: str, dtype: torch.dtype) -> None:
    """inplace: the norm overwrites x and the sum overwrites residual, as returned."""
    x, residual, weight = _inputs(5, 576, device, dtype, seed=1)
    expected_normed, expected_sum = add_rms_norm_ref(x, residual, weight, EPS)
    normed, summed = add_rms_norm(x, residual, weight, EPS, inplace=True)
    assert normed.data_ptr() == x.data_ptr() and summed.data_ptr() == residual.data_ptr()
    torch.testing.assert_close(residual, expected_sum, atol=0, rtol=0)
    torch.testing.assert_close(x, expected_normed, **tolerance(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_strided_rows_and_in_place_out(device: str, dtype: torch.dtype) -> None:
    """Rows of a wider buffer are read where they are; out=x normalises in place."""
    x, _, weight = _inputs(3, 640, device, dtype, seed=2)
    view = x[:, :576]
    expected = rms_norm_ref(view, weight[:576], EPS)
    torch.testing.assert_close(rms_norm(view, weight[:576], EPS), expected, **tolerance(dtype))
    untouched = x[:, 576:].clone()
    rms_norm(view, weight[:576], EPS, out=view)
    torch.testing.assert_close(view, expected, **tolerance(dtype))
    assert torch.equal(x[:, 576:], untouched)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_no_tokens(device: str, dtype: torch.dtype) -> None:
    x = torch.empty(0, 64, device=device, dtype=dtype)
    assert rms_norm(x, torch.ones(64, device=device, dtype=dtype), EPS).shape == (0, 64)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rejects_bad_arguments(device: str, dtype: torch.dtype) -> None:
    x = torch.zeros(2, 64, device=device, dtype=dtype)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.ones(63, device=device, dtype=dtype), EPS)
    with pytest.raises(ValueError, match="residual must have shape"):
        add_rms_norm(
            x,
            torch.zeros(3, 64, device=device, dtype=dtype),
            torch.ones(64, device=device, dtype=dtype),
            EPS,
        )
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        rms_norm(
            torch.zeros(64, 2, device=device, dtype=dtype).t(),
            torch.ones(64, device=device, dtype=dtype),
            EPS,
        )
    with pytest.raises(ValueError, match="exceeds one program's row"):
        rms_norm(
            torch.zeros(1, 65536, device=device, dtype=dtype),
            torch.ones(65536, device=device, dtype=dtype),
            EPS,
        )
