"""The layout of one step's flattened, variable-length batch as attention reads it: which rows
belong to which sequence, where each new token's K/V goes and which blocks hold its context.

An attention backend (attention.py) builds it once per step and KV cache group; every layer of
that group reads it. The shared fields come from lay_out(); each backend adds what its own
paged_attention needs (the torch path's decode group and prefill masks, the Triton kernels'
context lengths on the device)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    max_query_len: int
    max_context_len: int
    decode: DecodeGroup | None = None  # torch path only
    prefills: list[PrefillChunk] = field(default_factory=list)  # torch path only
    context_lens_device: torch.Tensor | None = None  # [S] int64, Triton path only

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))


def lay_out(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """The fields every backend shares for S sequences, and the padded block tables
    [S, max_blocks] on the host, for a backend that derives more from them. Each block table
    must cover its context (checked by the caller); -1 entries (blocks a sliding-window group
    dropped) read block 0, which the window masks."""
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    max_blocks = max(len(table) for table in block_tables)
    padded = [table + [0] * (max_blocks - len(table)) for table in block_tables]
    tables = torch.tensor(padded, dtype=torch.int64).clamp_(min=0)
    if starts[-1] <= SMALL_STEP_TOKENS:
        positions, slots = _positions_and_slots(query_lens, context_lens, block_tables, block_size)
    else:
        positions, seq_of_token = _positions(query_lens, context_lens)
        blocks = tables[seq_of_token, positions // block_size]
        slots = blocks * block_size + positions % block_size
    meta = AttentionMetadata(
        query_start=torch.tensor(starts, dtype=torch.int64, device=device),
        query_lens=list(query_lens),
        context_lens=list(context_lens),
        block_tables=tables.to(device),
        slot_mapping=slots.to(device),
        positions=positions.to(device),
        block_size=block_size,
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
    )
    return meta, tables


# Steps of up to this many tokens get their positions and slots from Python lists, one tensor
# each: a batch-1 decode step's metadata took ~15 small torch ops (~40 us of a ~7 ms CPU step);
# longer steps (prefill chunks) get them from vectorised torch ops. The same integers either way.
SMALL_STEP_TOKENS = 256


def _positions_and_slots(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [T] of the new tokens and their flat cache slots [T], from lists."""
    positions: list[int] = []
    slots: list[int] = []
    for query, context, table in zip(query_lens, context_lens, block_tables, strict=True):
        for position in range(context - query, context):
            positions.append(position)
            block = max(table[position // block_size], 0)
            slots.append(block * block_size + position % block_size)
    return torch.tensor(positions, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64)


def _positions(query_lens: list[int], context_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [T] of the new tokens and the sequence index [T] each belongs to."""
    spans = [torch.arange(c - q, c) for q, c in zip(query_lens, context_lens, strict=True)]
    owners = [torch.full((q,), i) for i, q in enumerate(query_lens)]
    return torch.cat(spans).to(torch.int64), torch.cat(owners).to(torch.int64)
