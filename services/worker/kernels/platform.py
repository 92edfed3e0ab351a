"""The facts of this machine that decide whether the GPU kernels can run: torch and its CUDA
runtime, the NVIDIA driver, Triton and the version torch was released with, the device.

gather_facts() only looks; it never initialises a CUDA context beyond what
torch.cuda.is_available() does, and a missing library is a fact (None), never an error.
platform_check.py judges the facts."""

from __future__ import annotations

import ctypes
import importlib.metadata
import re
from dataclasses import dataclass

import torch

# torch wheels built with CUDA require the Triton they were tested with (nightlies require
# pytorch-triton); CPU wheels require none.
_TRITON_PIN = re.compile(r"^\s*(triton|pytorch-triton)\s*==\s*([^;\s]+)")


@dataclass(frozen=True, slots=True)
class PlatformFacts:
    torch_version: str
    torch_cuda: str | None  # CUDA runtime torch was built with ("12.4"); None: a CPU build
    triton_version: str | None  # None: not installed
    triton_pin: str | None  # the Triton version torch requires; None: it pins none
    driver_version: str | None  # NVIDIA driver ("550.54.15"); None: no NVML found
    driver_cuda: str | None  # newest CUDA the driver supports ("12.4"); None: no libcuda
    cuda_available: bool  # torch.cuda.is_available()
    device_name: str | None  # first CUDA device
    capability: tuple[int, int] | None  # its compute capability


def gather_facts() -> PlatformFacts:
    available = torch.cuda.is_available()
    return PlatformFacts(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        triton_version=_triton_version(),
        triton_pin=_triton_pin(),
        driver_version=_nvml_driver_version(),
        driver_cuda=_driver_cuda_version(),
        cuda_available=available,
        device_name=torch.cuda.get_device_name(0) if available else None,
        capability=tuple(torch.cuda.get_device_capability(0)) if available else None,
    )


def _triton_version() -> str | None:
    for dist in ("triton", "pytorch-triton"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _triton_pin() -> str | None:
    try:
        requirements = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:  # torch from a source tree
        return None
    for requirement in requirements:
        match = _TRITON_PIN.match(requirement)
        if match:
            return match.group(2)
    return None


def _driver_cuda_version() -> str | None:
    """cuDriverGetVersion from libcuda: needs no context and works under a CPU-only torch."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def _nvml_driver_version() -> str | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buffer = ctypes.create_string_buffer(96)
        ok = nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(len(buffer))) == 0
        nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return buffer.value.decode() if ok else None
