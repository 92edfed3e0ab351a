"""Where the small-op kernel tests run, and how close to the reference they must come.

Under the interpreter (no CUDA): CPU tensors in float32. With a CUDA device: float16 and
bfloat16 (bfloat16 only from compute capability 8.0). A case that cannot run here is SKIPPED
with the reason, never passed."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.platform_tensors import interpreting

_NO_INTERPRETER = "CPU kernels need TRITON_INTERPRET=1 (set when no CUDA device is present)"
_NO_CUDA = "no CUDA device"


def _bf16_ok() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


DEVICE_DTYPES = [
    pytest.param(
        "cpu",
        torch.float32,
        id="cpu-fp32",
        marks=pytest.mark.skipif(not interpreting(), reason=_NO_INTERPRETER),
    ),
    pytest.param(
        "cuda",
        torch.float16,
        id="cuda-fp16",
        marks=pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason=_NO_CUDA),
    ),
    pytest.param(
        "cuda",
        torch.bfloat16,
        id="cuda-bf16",
        marks=pytest.mark.skipif(
            interpreting() or not _bf16_ok(), reason="no CUDA device of compute capability >= 8.0"
        ),
    ),
]


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances: a few units in the last place of dtype, with a floor for fp32
    where the kernel and torch sum a row in a different order."""
    eps = torch.finfo(dtype).eps
    bound = max(4 * eps, 1e-5)
    return {"atol": bound, "rtol": bound}
