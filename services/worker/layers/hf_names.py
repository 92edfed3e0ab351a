"""Hugging Face checkpoint names of our fused projections: which slice of qkv_proj is q_proj,
of gate_up_proj is gate_proj, and so on. Every model fuses the same way (fewer, larger matmuls),
so every loader fills the same slices."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def attention_targets(
    qkv_proj: torch.Tensor, o_proj: torch.Tensor, q_size: int, kv_size: int
) -> dict[str, torch.Tensor]:
    """self_attn.{q,k,v,o}_proj.weight -> qkv_proj's rows [q | k | v] and o_proj."""
    return {
        "self_attn.q_proj.weight": qkv_proj[:q_size],
        "self_attn.k_proj.weight": qkv_proj[q_size : q_size + kv_size],
        "self_attn.v_proj.weight": qkv_proj[q_size + kv_size :],
        "self_attn.o_proj.weight": o_proj,
    }


def mlp_targets(
    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, intermediate_size: int
) -> dict[str, torch.Tensor]:
    """mlp.{gate,up,down}_proj.weight -> gate_up_proj's rows [gate | up] and down_proj."""
    return {
        "mlp.gate_proj.weight": gate_up_proj[:intermediate_size],
        "mlp.up_proj.weight": gate_up_proj[intermediate_size:],
        "mlp.down_proj.weight": down_proj,
    }


def per_layer(layer_targets: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each layer's targets under "layers.{i}." (HF names without the "model." prefix)."""
    return {
        f"layers.{i}.{suffix}": tensor
        for i, targets in enumerate(layer_targets)
        for suffix, tensor in targets.items()
    }
