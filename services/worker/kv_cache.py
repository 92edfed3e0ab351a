"""The paged KV cache: fixed-size blocks of key/value vectors, addressed by block id.

The scheduler owns which block holds what; the worker only writes where a step's slot mapping
says and reads through each sequence's block table."""

from __future__ import annotations

import torch

from services.worker.model.config import LlamaConfig


def bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """The bytes one block takes across all layers, keys and values."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.kv_size * element_size


def num_blocks_for_bytes(
    config: LlamaConfig, block_size: int, dtype: torch.dtype, budget_bytes: int
) -> int:
    """How many whole blocks fit in budget_bytes (at least one is required)."""
    count = budget_bytes // bytes_per_block(config, block_size, dtype)
    if count < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
            f"({bytes_per_block(config, block_size, dtype)} bytes each)"
        )
    return int(count)


class PagedKVCache:
    """Per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim].

    One allocation holds every layer ([num_layers, 2, ...]) so the cache is a single contiguous
    buffer; the per-layer tensors are views of it."""

    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # Zeros, not empty: padded block-table entries read block 0 and are masked out, and
        # masked garbage must not be NaN/Inf (0 * inf in a matmul would poison real rows).
        self._buffer = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each [num_blocks, block_size, num_kv_heads, head_dim]."""
        return self._buffer[layer, 0], self._buffer[layer, 1]

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Stores k, v [T, Hkv, D] at flat slots [T] (block_id * block_size + offset)."""
        k_cache, v_cache = self.layer(layer)
        flat_shape = (self.num_slots, self.num_kv_heads, self.head_dim)
        k_cache.view(flat_shape).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(flat_shape).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Contiguous keys (or values) of several sequences.

    cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks] int64.
    Returns [B, Hkv, max_blocks * block_size, D], position-major within each sequence."""
    batch, max_blocks = block_tables.shape
    _, block_size, heads, dim = cache.shape
    # index_select on the flattened table: several times faster on CPU than cache[tables].
    gathered = cache.index_select(0, block_tables.reshape(-1))  # [B * max_blocks, bs, Hkv, D]
    return gathered.view(batch, max_blocks * block_size, heads, dim).transpose(1, 2)
