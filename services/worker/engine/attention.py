"""Attention over the paged KV cache for one flattened, variable-length batch.

AttentionMetadata is built once per step and shared by every layer. Its `kernels` says who runs
paged_attention and write_kv: the Triton kernels (triton_attention.py; one launch over the whole
mixed step) or the torch implementation below, which batches all single-token decode sequences
into one SDPA call and runs each prefill chunk on its own."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from services.worker.engine.kv_cache import PagedKVCache, gather_blocks


@dataclass(slots=True)
class DecodeGroup:
    """Every sequence with exactly one new token, attended in one batched call."""

    token_index: torch.Tensor  # [B] int64: rows of the flattened batch
    block_tables: torch.Tensor  # [B, nb] int64, nb blocks cover the longest context
    key_mask: torch.Tensor  # [B, 1, 1, nb * block_size] bool, True where a key is real


@dataclass(slots=True)
class PrefillChunk:
    """One sequence with several new tokens (a prompt or a chunk of it)."""

    start: int  # first row of the flattened batch
    end: int  # one past the last row
    block_table: torch.Tensor  # [1, nb] int64
    mask: torch.Tensor  # [q_len, nb * block_size] bool: causal, shifted by the cached prefix


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step layout of the flattened batch: S sequences contributing T tokens in total."""

    query_start: torch.Tensor  # [S + 1] int64: sequence i owns rows query_start[i]:query_start[i+1]
    query_lens: list[int]  # [S]: tokens computed this step
    context_lens: list[int]  # [S]: cached + new tokens, i.e. keys visible to the last query
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with block 0 (masked by length)
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot of each new token's K/V
    positions: torch.Tensor  # [T] int64: position of each new token in its sequence
    block_size: int
    decode: DecodeGroup | None  # torch path only
    prefills: list[PrefillChunk]  # torch path only
    kernels: str = "torch"  # or "triton" (kernel_choice.py)
    context_lens_device: torch.Tensor | None = None  # [S] int64, triton path only
    max_query_len: int = 0
    max_context_len: int = 0

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
        kernels: str = "torch",
    ) -> AttentionMetadata:
        """Lays out S sequences; each block table must cover its context (checked by the caller).

        -1 entries (blocks a sliding-window group dropped) read block 0, which the window masks.
        The torch path's decode group and prefill masks are built only for kernels="torch"."""
        starts = [0]
        for length in query_lens:
            starts.append(starts[-1] + length)
        max_blocks = max(len(table) for table in block_tables)
        tables = torch.zeros((len(block_tables), max_blocks), dtype=torch.int64)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int64)
        tables.clamp_(min=0)
        positions, seq_of_token = _positions(query_lens, context_lens)
        blocks = tables[seq_of_token, positions // block_size]
        slots = blocks * block_size + positions % block_size
        decode: DecodeGroup | None = None
        prefills: list[PrefillChunk] = []
        device_lens: torch.Tensor | None = None
        if kernels == "torch":
            decode = _decode_group(starts, query_lens, context_lens, tables, block_size, device)
            prefills = _prefill_chunks(starts, query_lens, context_lens, tables, block_size, device)
        else:
            device_lens = torch.tensor(context_lens, dtype=torch.int64, device=device)
        return cls(
            query_start=torch.tensor(starts, dtype=torch.int64, device=device),
            query_lens=list(query_lens),
            context_lens=list(context_lens),
            block_tables=tables.to(device),
            slot_mapping=slots.to(device),
            positions=positions.to(device),
            block_size=block_size,
            decode=decode,
            prefills=prefills,
            kernels=kernels,
            context_lens_device=device_lens,
            max_query_len=max(query_lens),
            max_context_len=max(context_lens),
        )

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))


@dataclass(frozen=True, slots=True)
class StepAttention:
    """One step's layout as every KV cache group (kv_cache.py) sees it: the same sequences and
    tokens, each group through its own block tables. A layer of group g reads groups[g]."""

    groups: tuple[AttentionMetadata, ...]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[list[int]]],
        block_size: int,
        device: torch.device,
        kernels: str = "torch",
    ) -> StepAttention:
        """block_tables: per KV cache group, the S block tables of that group."""
        return cls(
            tuple(
                AttentionMetadata.build(
                    query_lens, context_lens, tables, block_size, device, kernels
                )
                for tables in block_tables
            )
        )

    def for_group(self, group: int) -> AttentionMetadata:
        """The metadata addressing KV cache group `group`'s blocks."""
        return self.groups[group]

    @property
    def positions(self) -> torch.Tensor:
        """[T] int64: position of each new token in its sequence (the same in every group)."""
        return self.groups[0].positions

    @property
    def query_start(self) -> torch.Tensor:
        """[S + 1] int64: the rows each sequence owns (the same in every group)."""
        return self.groups[0].query_start

    @property
    def kernels(self) -> str:
        return self.groups[0].kernels


def _positions(query_lens: list[int], context_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [T] of the new tokens and the sequence index [T] each belongs to."""
    spans = [torch.arange(c - q, c) for q, c in zip(query_lens, context_lens, strict=True)]
    owners = [torch.full((q,), i) for i, q in enumerate(query_lens)]
    return torch.cat(spans).to(torch.int64), torch.cat(owners).to(torch.int64)


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

    q: [T, H, D]; layer_cache: K and V [num_blocks, block_size, Hkv, D]. Returns [T, H, D].
    window: a sliding-window layer's width: the query at position p sees keys in
    (p - window, p] only, as Hugging Face and llama.cpp define it. None: every earlier key."""
    if window is not None and attn.kernels != "torch":
        raise ValueError("sliding-window attention runs on the torch path only")
    if attn.kernels == "triton":
        # Imported here: a torch-only worker (every CPU one) never loads Triton.
        from services.worker.engine.triton_attention import triton_paged_attention

        return triton_paged_attention(q, layer_cache, attn)
    k_cache, v_cache = layer_cache
    out = torch.empty_like(q)
    if attn.decode is not None:
        group = attn.decode
        if window is not None:
            group = _windowed_decode(group, attn.positions[group.token_index], window, attn)
        out[group.token_index] = _decode_attention(q[group.token_index], k_cache, v_cache, group)
    for chunk in attn.prefills:
        if window is not None:
            query_pos = attn.positions[chunk.start : chunk.end].view(-1, 1)
            chunk = replace(chunk, mask=_in_window(chunk.mask, query_pos, window))
        out[chunk.start : chunk.end] = _prefill_attention(
            q[chunk.start : chunk.end], k_cache, v_cache, chunk
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


def write_kv(
    cache: PagedKVCache, layer: int, k: torch.Tensor, v: torch.Tensor, attn: AttentionMetadata
) -> None:
    """Stores the step's new k, v [T, Hkv, D] of one layer at attn.slot_mapping."""
    if attn.kernels == "triton":
        from services.worker.kernels.cache_write import write_kv_cache

        write_kv_cache(k, v, *cache.layer(layer), attn.slot_mapping)
    else:
        cache.write(layer, k, v, attn.slot_mapping)


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup
) -> torch.Tensor:
    """q: [B, H, D] -> [B, H, D], one query per sequence."""
    batch, num_heads, dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys = gather_blocks(k_cache, group.block_tables)  # [B, Hkv, L, D]
    values = gather_blocks(v_cache, group.block_tables)
    # GQA without copying K/V: the G query heads sharing a KV head become G query rows.
    q_grouped = q.view(batch, num_kv_heads, num_heads // num_kv_heads, dim)  # [B, Hkv, G, D]
    out = F.scaled_dot_product_attention(q_grouped, keys, values, attn_mask=group.key_mask)
    return out.reshape(batch, num_heads, dim)


def _prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: PrefillChunk
) -> torch.Tensor:
    """q: [Q, H, D] -> [Q, H, D] for one sequence's chunk of new tokens."""
    q_len, num_heads, dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group_size = num_heads // num_kv_heads
    keys = gather_blocks(k_cache, chunk.block_table)[0]  # [Hkv, L, D]
    values = gather_blocks(v_cache, chunk.block_table)[0]
    # [Q, Hkv, G, D] -> [Hkv, G * Q, D]: query heads of one KV head stacked as rows (GQA).
    q_rows = q.view(q_len, num_kv_heads, group_size, dim).permute(1, 2, 0, 3)
    q_rows = q_rows.reshape(num_kv_heads, group_size * q_len, dim)
    mask = chunk.mask.repeat(group_size, 1)  # [G * Q, L], same row order as q_rows
    out = F.scaled_dot_product_attention(q_rows, keys, values, attn_mask=mask)
    out = out.view(num_kv_heads, group_size, q_len, dim).permute(2, 0, 1, 3)
    return out.reshape(q_len, num_heads, dim)
