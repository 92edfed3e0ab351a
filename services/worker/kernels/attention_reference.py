"""Torch references for the paged attention kernels: plain, slow, float64.

Written from the definition, not from services/worker/layers/attention.py, so the kernels and the
worker's torch path are each checked against a third implementation. Each sequence's keys are
read position by position through its block table, and the softmax is spelled out."""

from __future__ import annotations

import math

import torch


def sequence_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """Keys (or values) of positions 0..context_len-1: [context_len, Hkv, D] in float64.

    cache: [num_blocks, block_size, Hkv, D]; block_table: [max_blocks] block ids."""
    block_size = cache.shape[1]
    positions = torch.arange(context_len, device=cache.device)
    blocks = block_table.to(torch.int64)[positions // block_size]
    return cache[blocks, positions % block_size].to(torch.float64)


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal softmax attention of q [Q, Hq, D] at q_positions [Q] over keys/values
    [L, Hkv, D] at positions 0..L-1; query head h uses KV head h // (Hq // Hkv).
    Returns [Q, Hq, D] float64."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)  # [L, Hq, D]
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(torch.float64), keys) * scale  # [Hq, Q, L]
    key_positions = torch.arange(keys.shape[0], device=q.device)
    future = key_positions[None, :] > q_positions[:, None]  # [Q, L]
    scores = scores.masked_fill(future[None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """As decode_attention: q [B, Hq, D], one query at position context_lens[b] - 1.
    Returns [B, Hq, D] float64."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rows = []
    for b, context_len in enumerate(context_lens.tolist()):
        keys = sequence_kv(k_cache, block_tables[b], context_len)
        values = sequence_kv(v_cache, block_tables[b], context_len)
        position = torch.tensor([context_len - 1], device=q.device)
        rows.append(attend(q[b : b + 1], keys, values, position, scale))
    return torch.cat(rows) if rows else q.new_empty(q.shape, dtype=torch.float64)


def prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """As prefill_attention: q [T, Hq, D] packed by cu_seqlens [S + 1]; sequence s's new
    tokens sit at positions context_lens[s] - q_len .. context_lens[s] - 1.
    Returns [T, Hq, D] float64."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    starts = cu_seqlens.tolist()
    for s, context_len in enumerate(context_lens.tolist()):
        start, end = starts[s], starts[s + 1]
        if end == start:
            continue
        keys = sequence_kv(k_cache, block_tables[s], context_len)
        values = sequence_kv(v_cache, block_tables[s], context_len)
        positions = torch.arange(context_len - (end - start), context_len, device=q.device)
        out[start:end] = attend(q[start:end], keys, values, positions, scale)
    return out
