"""The torch attention backend: attention, KV cache writes and the ops around them as torch
ops. Runs everywhere (the CPU worker, and models the Triton kernels do not cover such as Gemma 3's
head_dim 256 and sliding windows). Its paged_attention batches all single-token decode
sequences into one SDPA call and runs each prefill chunk on its own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from services.worker.layers import torch_ops
from services.worker.layers.attention_metadata import (
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
    lay_out,
)
from services.worker.layers.kv_cache import PagedKVCache, gather_layer


class TorchAttention:
    """The AttentionBackend (attention.py) of torch ops."""

    name = "torch"
    supports_sliding_window = True
    supports_decode_graphs = False  # its metadata is rebuilt on the host every step
    supports_int8_kv = True  # PagedKVCache.write quantizes; paged_attention dequantizes

    def metadata(
        self,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        meta, tables = lay_out(query_lens, context_lens, block_tables, block_size, device)
        starts = _starts(query_lens)
        meta.decode = _decode_group(starts, query_lens, context_lens, tables, block_size, device)
        meta.prefills = _prefill_chunks(
            starts, query_lens, context_lens, tables, block_size, device
        )
        return meta

    def write_kv(
        self,
        cache: PagedKVCache,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        attn: AttentionMetadata,
    ) -> None:
        cache.write(layer, k, v, attn.slot_mapping)

    def paged_attention(
        self,
        q: torch.Tensor,
        layer_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        window: int | None = None,
    ) -> torch.Tensor:
        return paged_attention(q, layer_cache, attn, window)

    # Norm, SiLU-mul and RoPE: torch_ops.py's, which give the references below bit for bit in
    # fewer ops (tests/unit/worker/test_torch_ops.py).
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch_ops.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return torch_ops.rms_norm(residual.add_(x), weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return torch_ops.silu_mul(gate_up)

    def rotary(
        self, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [T, 1, D] of each token: made once per step, shared by all layers."""
        return torch_ops.rope_tables(cos, sin, positions, dtype)

    def apply_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch_ops.apply_rope(q, *rotary), torch_ops.apply_rope(k, *rotary)

    def rope_write_kv(
        self,
        cache: PagedKVCache,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        return rope_then_write_kv(self, cache, layer, q, k, v, rotary, attn)


def rope_then_write_kv(
    backend: Any,
    cache: PagedKVCache,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    attn: AttentionMetadata,
) -> torch.Tensor:
    """AttentionBackend.rope_write_kv (attention.py) as its two steps, backend.apply_rope then
    backend.write_kv: what a backend without a fused op does. Returns q rotated."""
    q, k = backend.apply_rope(q, k, attn.positions, rotary)
    backend.write_kv(cache, layer, k, v, attn)
    return q


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference (torch_ops.rms_norm runs). x: [T, d] -> [T, d]; the statistic in float32
    as HF does, for low-precision dtypes."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The reference (torch_ops.apply_rope runs; Gemma 3 uses this).
    x: [T, heads, D], cos/sin: [T, 1, D] -> rotated x [T, heads, D] (HF rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _starts(query_lens: list[int]) -> list[int]:
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    return starts


def _decode_group(
    starts: list[int],
    query_lens: list[int],
    context_lens: list[int],
    tables: torch.Tensor,
    block_size: int,
    device: torch.device,
) -> DecodeGroup | None:
    rows = [i for i, q in enumerate(query_lens) if q == 1]
    if not rows:
        return None
    contexts = torch.tensor([context_lens[i] for i in rows], dtype=torch.int64)
    # Only as many blocks as the longest decode context needs, so short batches gather little.
    num_blocks = -(-int(contexts.max()) // block_size)
    key_pos = torch.arange(num_blocks * block_size)
    key_mask = key_pos[None, :] < contexts[:, None]  # [B, L]
    return DecodeGroup(
        token_index=torch.tensor([starts[i] for i in rows], dtype=torch.int64, device=device),
        block_tables=tables[rows, :num_blocks].to(device),
        key_mask=key_mask[:, None, None, :].to(device),
    )


def _prefill_chunks(
    starts: list[int],
    query_lens: list[int],
    context_lens: list[int],
    tables: torch.Tensor,
    block_size: int,
    device: torch.device,
) -> list[PrefillChunk]:
    chunks = []
    for i, (q_len, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
        if q_len <= 1:
            continue
        num_blocks = -(-ctx // block_size)
        query_pos = torch.arange(ctx - q_len, ctx)
        key_pos = torch.arange(num_blocks * block_size)
        # A query sees every cached key and the new keys up to itself; keys past ctx are padding.
        mask = key_pos[None, :] <= query_pos[:, None]  # [q_len, L]
        chunks.append(
            PrefillChunk(
                start=starts[i],
                end=starts[i] + q_len,
                block_table=tables[i : i + 1, :num_blocks].to(device),
                mask=mask.to(device),
            )
        )
    return chunks


def paged_attention(
    q: torch.Tensor,
    layer_cache: tuple[torch.Tensor, torch.Tensor],
    attn: AttentionMetadata,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of new queries over cached keys/values (the new K/V must already be written).

    q: [T, H, D]; layer_cache: K and V [num_blocks, block_size, Hkv, D] (an int8 cache's scales
    after them: PagedKVCache.layer(); what is gathered is dequantized). Returns [T, H, D].
    window: a sliding-window layer's width: the query at position p sees keys in
    (p - window, p] only, as Hugging Face and llama.cpp define it. None: every earlier key."""
    out = torch.empty_like(q)
    if attn.decode is not None:
        group = attn.decode
        if window is not None:
            group = _windowed_decode(group, attn.positions[group.token_index], window, attn)
        out[group.token_index] = _decode_attention(q[group.token_index], layer_cache, group)
    for chunk in attn.prefills:
        if window is not None:
            query_pos = attn.positions[chunk.start : chunk.end].view(-1, 1)
            chunk = replace(chunk, mask=_in_window(chunk.mask, query_pos, window))
        out[chunk.start : chunk.end] = _prefill_attention(
            q[chunk.start : chunk.end], layer_cache, chunk
        )
    return out


def _windowed_decode(
    group: DecodeGroup, query_pos: torch.Tensor, window: int, attn: AttentionMetadata
) -> DecodeGroup:
    """The decode group narrowed to the blocks each query's window touches: column j of row b
    becomes block first_b + j, so a long context gathers about window / block_size blocks.

    query_pos: [B]. Columns past a row's last block repeat its table's last entry; their key
    positions (computed before clamping) lie beyond the query, so the mask drops them."""
    size = attn.block_size
    first = (query_pos - window + 1).clamp(min=0) // size  # [B]
    width = int((query_pos // size - first).max()) + 1
    if width >= group.block_tables.shape[1]:
        mask = _in_window(group.key_mask, query_pos.view(-1, 1, 1, 1), window)
        return replace(group, key_mask=mask)
    columns = first[:, None] + torch.arange(width, device=first.device)  # [B, W]
    tables = group.block_tables.gather(1, columns.clamp(max=group.block_tables.shape[1] - 1))
    key_pos = (columns[:, :, None] * size + torch.arange(size, device=first.device)).flatten(1)
    pos = query_pos[:, None]
    mask = (key_pos <= pos) & (key_pos > pos - window)  # [B, W * size]
    return replace(group, block_tables=tables, key_mask=mask[:, None, None, :])


def _in_window(mask: torch.Tensor, query_pos: torch.Tensor, window: int) -> torch.Tensor:
    """mask [..., L] over key positions 0..L-1, narrowed to keys within `window` of each query
    (query_pos broadcasts against mask's leading dims)."""
    key_pos = torch.arange(mask.shape[-1], device=mask.device)
    return mask & (key_pos > query_pos - window)


def _decode_attention(
    q: torch.Tensor, layer_cache: tuple[torch.Tensor, ...], group: DecodeGroup
) -> torch.Tensor:
    """q: [B, H, D] -> [B, H, D], one query per sequence."""
    batch, num_heads, dim = q.shape
    num_kv_heads = layer_cache[0].shape[2]
    keys, values = gather_layer(layer_cache, group.block_tables, q.dtype)  # [B, Hkv, L, D]
    # GQA without copying K/V: the G query heads sharing a KV head become G query rows.
    q_grouped = q.view(batch, num_kv_heads, num_heads // num_kv_heads, dim)  # [B, Hkv, G, D]
    out = F.scaled_dot_product_attention(q_grouped, keys, values, attn_mask=group.key_mask)
    return out.reshape(batch, num_heads, dim)


def _prefill_attention(
    q: torch.Tensor, layer_cache: tuple[torch.Tensor, ...], chunk: PrefillChunk
) -> torch.Tensor:
    """q: [Q, H, D] -> [Q, H, D] for one sequence's chunk of new tokens."""
    q_len, num_heads, dim = q.shape
    num_kv_heads = layer_cache[0].shape[2]
    group_size = num_heads // num_kv_heads
    keys, values = gather_layer(layer_cache, chunk.block_table, q.dtype)
    keys, values = keys[0], values[0]  # [Hkv, L, D]
    # [Q, Hkv, G, D] -> [Hkv, G * Q, D]: query heads of one KV head stacked as rows (GQA).
    q_rows = q.view(q_len, num_kv_heads, group_size, dim).permute(1, 2, 0, 3)
    q_rows = q_rows.reshape(num_kv_heads, group_size * q_len, dim)
    mask = chunk.mask.repeat(group_size, 1)  # [G * Q, L], same row order as q_rows
    out = F.scaled_dot_product_attention(q_rows, keys, values, attn_mask=mask)
    out = out.view(num_kv_heads, group_size, q_len, dim).permute(2, 0, 1, 3)
    return out.reshape(q_len, num_heads, dim)
