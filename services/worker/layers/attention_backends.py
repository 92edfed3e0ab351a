"""Building the AttentionBackend once at start-up, from --kernels (kernel_choice.py resolves
"auto" for the device and head dim). From then on the backend object decides; nothing compares
a kernel name at run time."""

from __future__ import annotations

import logging

import torch

from services.worker.kernel_choice import resolve_kernels
from services.worker.layers.attention import TORCH, AttentionBackend

logger = logging.getLogger(__name__)


def choose_attention_backend(choice: str, device: torch.device, head_dim: int) -> AttentionBackend:
    """The backend for --kernels `choice` on `device` with this head dim; ValueError if the
    choice cannot run there (kernel_choice.resolve_kernels says why)."""
    return attention_backend(resolve_kernels(choice, device, head_dim))


def attention_backend(name: str) -> AttentionBackend:
    """The backend for a resolved kernel choice ("torch" or "triton", kernel_choice.py)."""
    if name == "torch":
        return torch_backend()
    if name == "triton":
        from services.worker.layers.triton_attention import TritonAttention

        return TritonAttention()
    raise ValueError(f"no attention backend {name!r}")


def torch_backend() -> AttentionBackend:
    """The torch backend with the C++ CPU attention when it is built, else the torch path
    alone (it gathers every block of every sequence each step: a warning says so)."""
    from services.worker.layers import cpu_attention_ext

    try:
        loaded = cpu_attention_ext.load()
    except (OSError, RuntimeError) as error:  # built against another torch, or broken
        logger.warning("CPU attention extension failed to load (%s); using torch ops", error)
        return TORCH
    if not loaded:
        logger.warning(
            "CPU attention extension not built (make install builds it: python -m "
            "services.worker.layers.cpu_attention_ext); CPU attention gathers every block "
            "with torch ops"
        )
        return TORCH
    from services.worker.layers.cpu_attention import CpuAttention

    logger.info("CPU attention: the C++ extension, reading the paged cache in place")
    return CpuAttention()
