"""The int4 group-wise matmul (kernels/int4_matmul.py) against its dequantize-then-matmul
reference, on GGUF Q4_1 values."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.int4_matmul import int4_matmul, int4_matmul_ref
from tests.kernels.small_ops_cases import DEVICE_DTYPES


def _weight(n: int, k: int, device: str, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(0, 256, (n, k // 2), generator=generator, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=generator) * 0.02
    offset = -8 * scale + torch.randn(n, k // 32, generator=generator) * 0.01
    return nibbles.to(device), scale.to(device, dtype), offset.to(device, dtype)


def _tolerance(expected: torch.Tensor, dtype: torch.dtype) -> float:
    """fp32: summation order only; half types: the dequantized weight rounded to 8/11 bits."""
    relative = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    return relative * expected.float().abs().max().item() + 1e-6


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@pytest.mark.parametrize(
    ("rows", "n", "k"),
    [(1, 96, 64), (5, 64, 96), (17, 70, 32), (40, 128, 128)],
    ids=["decode", "ragged", "not-a-block-of-n", "prefill"],
)
def test_matches_the_dequantized_reference(
    device: str, dtype: torch.dtype, rows: int, n: int, k: int
) -> None:
    nibbles, scale, offset = _weight(n, k, device, dtype, seed=rows)
    x = torch.randn(rows, k, device=device, dtype=dtype)
    expected = int4_matmul_ref(x, nibbles, scale, offset)
    got = int4_matmul(x, nibbles, scale, offset)
    assert (got.float() - expected.float()).abs().max() <= _tolerance(expected, dtype)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_nibble_order_and_group_offsets_matter(device: str, dtype: torch.dtype) -> None:
    """Column 2j is the low nibble and each group has its own scale: a one-hot x reads one
    weight, so a swapped nibble or group shows as a wrong value."""
    nibbles = torch.tensor([[0x21] * 16 + [0x43] * 16], dtype=torch.uint8, device=device)
    scale = torch.tensor([[1.0, 10.0]], device=device, dtype=dtype)
    offset = torch.tensor([[0.0, 0.5]], device=device, dtype=dtype)
    x = torch.zeros(3, 64, device=device, dtype=dtype)
    x[0, 0], x[1, 1], x[2, 33] = 1, 1, 1  # column 0 (q=1), 1 (q=2), 33 (group 1, q=4)
    got = int4_matmul(x, nibbles, scale, offset).float().flatten().tolist()
    assert got == [1.0, 2.0, 40.5]


def test_rejects_bad_arguments() -> None:
    nibbles, scale, offset = _weight(8, 64, "cpu", torch.float32, seed=0)
    with pytest.raises(ValueError, match="nibbles must be uint8"):
        int4_matmul(torch.zeros(1, 32), nibbles, scale, offset)
    with pytest.raises(ValueError, match="scale must be"):
        int4_matmul(torch.zeros(1, 64), nibbles, scale.t().contiguous().t(), offset)
    with pytest.raises(ValueError, match="whole groups"):
        int4_matmul(torch.zeros(1, 48), nibbles[:, :24], scale, offset)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_int4_weight_computes_with_it_as_its_cuda_kernel(device: str, dtype: torch.dtype) -> None:
    """layers/int4_weight.TritonMM (what an Int4Weight on CUDA runs at decode) reads the
    weight's own nibbles, scales and offsets."""
    from services.worker.layers.int4_weight import TRITON, Int4Weight, int4_kernel

    weight = Int4Weight.quantize(torch.randn(96, 64, device=device, dtype=dtype))
    x = torch.randn(2, 3, 64, device=device, dtype=dtype)
    expected = x @ weight.dequantized().T
    got = TRITON(x, weight)
    assert got.shape == (2, 3, 96)
    assert (got.float() - expected.float()).abs().max() <= _tolerance(expected, dtype)
    assert int4_kernel("auto", torch.device("cuda")).small is TRITON


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU interpreter's")
def test_gpu_check_dry_run_table() -> None:
    """What scripts/gpu_check.py's 4-bit section prints without a GPU: every case, agreeing."""
    from services.worker.kernels.int4_matmul_check import DRY_SHAPES, ROWS, int4_rows, markdown

    rows = int4_rows("cpu", DRY_SHAPES, reps=0)
    assert len(rows) == len(DRY_SHAPES) * len(ROWS)
    assert all(float(r["triton rel err"]) < 1e-5 for r in rows)
    assert markdown(rows).count("\n") == len(rows) + 1
