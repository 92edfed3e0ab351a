"""Tensor parallelism for the Llama model: each rank keeps a slice of every layer.

The Megatron split: the fused qkv and gate_up projections are column-parallel (each rank
computes its own attention heads and its own MLP columns), o_proj and down_proj row-parallel
(each rank's output is a partial sum). One all-reduce after attention and one after the MLP
make the hidden states whole and identical on every rank again. Embeddings, norms and the
lm_head are replicated, so each rank can compute the logits itself.

Every rank loads the full weights and then drops what it does not own: simple, and fine for
models that fit in host memory once per rank; a large model would want each rank to read
only its slices from the checkpoint."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from services.worker.model.config import LlamaConfig
from services.worker.model.llama import LlamaAttention, LlamaMLP, LlamaModel


def check_divisible(config: LlamaConfig, world_size: int) -> None:
    """ValueError unless attention heads, KV heads and MLP columns split evenly in world_size."""
    if world_size < 1:
        raise ValueError(f"the tensor-parallel size must be >= 1, got {world_size}")
    sizes = {
        "attention heads": config.num_heads,
        "KV heads": config.num_kv_heads,
        "MLP columns": config.intermediate_size,
    }
    for what, count in sizes.items():
        if count % world_size:
            every = ", ".join(f"{n} {w}" for w, n in sizes.items())
            raise ValueError(
                f"tensor-parallel size {world_size} does not divide the model's {count} "
                f"{what}; pick a size that divides each of: {every}"
            )


def shard_config(config: LlamaConfig, world_size: int) -> LlamaConfig:
    """The shape one rank holds: its share of the heads and MLP columns (size its KV cache)."""
    check_divisible(config, world_size)
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // world_size,
        num_kv_heads=config.num_kv_heads // world_size,
        intermediate_size=config.intermediate_size // world_size,
    )


def shard_model(
    model: nn.Module, rank: int, world_size: int, group: dist.ProcessGroup | None = None
) -> None:
    """Keeps rank's slice of every layer of a loaded LlamaModel, in place, and makes attention
    and MLP outputs all-reduced over `group` (None: the default group). Call it after the
    weights are loaded and before the model runs; the process group must exist by then."""
    if not isinstance(model, LlamaModel):
        raise ValueError(f"tensor parallelism supports Llama models, not {type(model).__name__}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    check_divisible(model.config, world_size)
    for layer in model.layers:
        _shard_attention(layer.self_attn, rank, world_size)
        _shard_mlp(layer.mlp, rank, world_size)
        if world_size > 1:
            layer.self_attn.register_forward_hook(_all_reduce_output(group))
            layer.mlp.register_forward_hook(_all_reduce_output(group))


def _shard_attention(attn: LlamaAttention, rank: int, world_size: int) -> None:
    """qkv rows [q | k | v] -> this rank's q heads, then its KV heads; o_proj columns to match.

    Heads are split in contiguous runs, so the query heads of a rank share exactly the KV
    heads it keeps (grouped-query attention stays local)."""
    heads, kv_heads = attn.num_heads // world_size, attn.num_kv_heads // world_size
    q_part, kv_part = heads * attn.head_dim, kv_heads * attn.head_dim
    q, k, v = attn.qkv_proj.split([attn.q_size, attn.kv_size, attn.kv_size], dim=0)
    qkv = torch.cat([_rows(q, rank, q_part), _rows(k, rank, kv_part), _rows(v, rank, kv_part)])
    attn.qkv_proj = _parameter(qkv)  # [(H + 2 Hkv) / tp * D, d]
    attn.o_proj = _parameter(attn.o_proj[:, rank * q_part : (rank + 1) * q_part])  # [d, H/tp * D]
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    attn.q_size, attn.kv_size = q_part, kv_part


def _shard_mlp(mlp: LlamaMLP, rank: int, world_size: int) -> None:
    """gate_up rows [gate | up] -> this rank's gate and up columns; down_proj columns to match."""
    part = mlp.intermediate_size // world_size
    gate, up = mlp.gate_up_proj.split(mlp.intermediate_size, dim=0)
    mlp.gate_up_proj = _parameter(torch.cat([_rows(gate, rank, part), _rows(up, rank, part)]))
    mlp.down_proj = _parameter(mlp.down_proj[:, rank * part : (rank + 1) * part])  # [d, I/tp]
    mlp.intermediate_size = part


def _rows(weight: torch.Tensor, rank: int, part: int) -> torch.Tensor:
    return weight[rank * part : (rank + 1) * part]


def _parameter(tensor: torch.Tensor) -> nn.Parameter:
    # A contiguous copy, so the full weight it was sliced from is freed.
    return nn.Parameter(tensor.clone(memory_format=torch.contiguous_format), requires_grad=False)


def _all_reduce_output(group: dist.ProcessGroup | None):
    """A forward hook summing a row-parallel block's partial output across the ranks, in place.

    A hook, not a wrapper module: the module tree (and so anything that walks or swaps its
    submodules) stays as the loader built it."""

    def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=group)
        return output

    return hook
