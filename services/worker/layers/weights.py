"""A network's weights: allocated empty, then filled from a checkpoint's Hugging Face-named
tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


def empty_weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """A frozen parameter of `shape`, uninitialised on purpose: every weight is overwritten by a
    loader, and random init of 135M+ parameters would cost seconds for nothing."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


@torch.no_grad()
def copy_hf_weights(
    targets: dict[str, torch.Tensor],
    tensors: Iterable[tuple[str, torch.Tensor]],
    architecture: str,
    skip: Callable[[str], bool] = lambda name: False,
) -> None:
    """Copies each (HF name, tensor) into targets[name] (a parameter, or a slice of a fused one).

    Names for which skip() holds are ignored; ValueError for a name not in targets, a shape that
    differs, or a target no tensor filled."""
    missing = set(targets)
    for name, tensor in tensors:
        if skip(name):
            continue
        target = targets.get(name)
        if target is None:
            raise ValueError(f"unexpected tensor {name!r}: not part of a {architecture} model")
        if target.shape != tensor.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}"
            )
        target.copy_(tensor)
        missing.discard(name)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
