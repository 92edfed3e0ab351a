"""Kernel tests: without a CUDA device, Triton runs its kernels in the interpreter on CPU.

TRITON_INTERPRET is read when a kernel is decorated (at import), so it must be set here,
before any test module imports a kernel."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
