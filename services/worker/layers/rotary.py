"""RoPE tables: cos and sin of every position's angles for one RoPE base, laid out for Hugging
Face's rotate_half (dim i pairs with i + D/2). Llama has one base; Gemma 3's sliding and global
layers each have their own."""

from __future__ import annotations

import torch
from torch import nn


class RopeTables(nn.Module):
    """cos/sin [P, D] for every position below max_positions (buffers, derived, not saved)."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, device: torch.device) -> None:
        """inv_freq [D/2]: the base's inverse frequencies (scaling already applied)."""
        super().__init__()
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # [P, D]: HF pairs dim i with i + D/2
        self.register_buffer("cos", angles.cos().to(device), persistent=False)
        self.register_buffer("sin", angles.sin().to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin [T, 1, D]; looked up once per step, shared by all layers."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(
            dtype
        )
