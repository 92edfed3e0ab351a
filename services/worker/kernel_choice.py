"""Which implementation runs the model's attention and KV cache writes: Triton or torch.

"auto" picks the Triton kernels (services/worker/kernels/) on a CUDA device and torch ops on
the CPU, where Triton has no compiler. "triton" on the CPU runs only under Triton's
interpreter (TRITON_INTERPRET=1): slow, meant for tests that check the kernels against torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by the worker's config, which must not pull in torch
    import torch

KERNEL_CHOICES = ("auto", "torch", "triton")  # --kernels


def resolve_kernels(choice: str, device: torch.device, head_dim: int) -> str:
    """ "torch" or "triton" for --kernels `choice` on `device` with this head dim.

    auto falls back to torch for a head dim the kernels were not tuned for; an explicit
    "triton" that cannot run raises ValueError saying why."""
    from services.worker.kernels.attention_inputs import HEAD_DIMS

    check_kernel_device(choice, device)
    if choice == "auto":
        usable = device.type == "cuda" and head_dim in HEAD_DIMS
        return "triton" if usable else "torch"
    if choice == "triton" and head_dim not in HEAD_DIMS:
        raise ValueError(
            f"--kernels triton supports head_dim {HEAD_DIMS}, the model has {head_dim}: "
            "use --kernels torch"
        )
    return choice


def check_kernel_device(choice: str, device: torch.device) -> None:
    """What can be checked before the model is loaded: the choice and the device."""
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"--kernels must be one of {', '.join(KERNEL_CHOICES)}, got {choice!r}")
    if choice != "triton":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "--kernels triton on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, "
            "for tests); use --kernels torch or a CUDA device"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--kernels triton runs on cuda (or cpu for tests), not {device}")
