"""What tensors the Triton kernels accept here: the argument checks every host wrapper shares.

A kernel given a tensor it cannot handle reads or writes the wrong memory without a word, so
each wrapper checks device, dtype, rank and strides first and says what is wrong in a
ValueError."""

from __future__ import annotations

import os

import torch

try:
    from triton import knobs
except ImportError:  # triton < 3.3 reads the environment variable directly
    knobs = None

# Under the interpreter kernels run through numpy, which has no bfloat16; fp16 would run but
# is not what the interpreter is for (checking indexing and masking against a reference).
_INTERPRETER_DTYPES = (torch.float32,)
# fp32 is accepted on a GPU too: the kernels compute in fp32 whatever they load.
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_tensor(name: str, tensor: object, ndim: int) -> torch.Tensor:
    """tensor is a torch.Tensor of rank ndim on a device the kernels can run on."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(tensor.shape)}")
    if tensor.device.type == "cpu" and not interpreting():
        raise ValueError(
            f"{name} is on the CPU: Triton runs CPU tensors only under TRITON_INTERPRET=1 "
            "(set before triton is imported); use the torch reference on CPU"
        )
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {tensor.device}; the kernels need a CUDA device")
    return tensor


def check_float(name: str, tensor: torch.Tensor) -> None:
    """tensor's dtype is one the kernels support on its device."""
    allowed = _CUDA_DTYPES if tensor.device.type == "cuda" else _INTERPRETER_DTYPES
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise ValueError(
            f"{name} is {str(tensor.dtype).removeprefix('torch.')}; "
            f"on {tensor.device.type} the kernels take {names}"
        )


def check_index(name: str, tensor: torch.Tensor) -> None:
    """tensor holds integer indices (positions, slots) the kernels can load."""
    if tensor.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")


def check_same(name: str, tensor: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    """tensor sits on like's device with like's dtype."""
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device} but {like_name} on {like.device}")
    if tensor.dtype != like.dtype:
        raise ValueError(f"{name} is {tensor.dtype} but {like_name} is {like.dtype}")


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def check_unit_stride(name: str, tensor: torch.Tensor) -> None:
    """The last dimension is contiguous: kernels load it as one vector."""
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {tensor.stride()}"
        )


def next_power_of_2(n: int) -> int:
    """Triton block shapes must be powers of two; masks cover the padding."""
    return 1 << max(n - 1, 0).bit_length()
