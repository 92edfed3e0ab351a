"""The reference models' cache: a plain contiguous K/V per layer, no blocks."""

from __future__ import annotations

import torch


class DenseKV:
    """A growing, contiguous K/V per layer: [Hkv, T, D] tensors extended with torch.cat."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def extend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends k, v [Hkv, n, D]; returns the layer's full K, V [Hkv, T, D]."""
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else torch.cat([old_k, k], dim=1)
        self.values[layer] = v if old_v is None else torch.cat([old_v, v], dim=1)
        return self.keys[layer], self.values[layer]  # type: ignore[return-value]

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[1]
