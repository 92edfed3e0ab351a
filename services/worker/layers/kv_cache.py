"""The paged KV cache: fixed-size blocks of key/value vectors, addressed by block id.

The scheduler owns which block holds what; the worker only writes where a step's slot mapping
says and reads through each sequence's block table.

Layers are split into KV cache groups of equal size, each with its own block table per sequence
and all drawing from one pool of blocks (a block holds block_size tokens of one group's layers).
A model whose layers all see the same keys has one group of every layer. Gemma 3 has global
layers and sliding-window ones: a sliding group's blocks wholly before a query's window are
never read again, so the scheduler frees them while the global group's table keeps growing
(vLLM's hybrid KV cache manager does the same)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


class KVCacheShape(Protocol):
    """What the cache needs of a model's config (model/config.py's LlamaConfig has it)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def kv_size(self) -> int: ...

    def window(self, layer: int) -> int | None: ...


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    layers: tuple[int, ...]  # model layers sharing one block table, in layer order
    window: int | None = None  # their sliding window; None = they attend to every earlier key


def kv_cache_groups(config: KVCacheShape) -> list[KVCacheGroup]:
    """One group of every layer when all layers have the same window; otherwise the layers of
    each window split into groups of one common size (the gcd of the counts), full-attention
    groups first. Gemma 3 270M: 3 global + 15 sliding layers -> 1 + 5 groups of 3."""
    layers_by_window: dict[int | None, list[int]] = {}
    for layer in range(config.num_layers):
        layers_by_window.setdefault(config.window(layer), []).append(layer)
    size = math.gcd(*(len(layers) for layers in layers_by_window.values()))
    groups = []
    for window in sorted(layers_by_window, key=lambda w: -1 if w is None else w):
        layers = layers_by_window[window]
        groups.extend(
            KVCacheGroup(tuple(layers[i : i + size]), window) for i in range(0, len(layers), size)
        )
    return groups


def bytes_per_block(
    config: KVCacheShape, block_size: int, dtype: torch.dtype, layers_per_block: int | None = None
) -> int:
    """The bytes one block takes across its group's layers (all layers by default), keys and
    values."""
    element_size = torch.empty((), dtype=dtype).element_size()
    layers = config.num_layers if layers_per_block is None else layers_per_block
    return 2 * layers * block_size * config.kv_size * element_size


def num_blocks_for_bytes(
    config: KVCacheShape,
    block_size: int,
    dtype: torch.dtype,
    budget_bytes: int,
    groups: list[KVCacheGroup] | None = None,
) -> int:
    """How many whole blocks fit in budget_bytes (at least one is required)."""
    per_block = bytes_per_block(config, block_size, dtype, _group_size(config, groups))
    count = budget_bytes // per_block
    if count < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
            f"({per_block} bytes each)"
        )
    return int(count)


def _group_size(config: KVCacheShape, groups: list[KVCacheGroup] | None) -> int:
    return config.num_layers if groups is None else len(groups[0].layers)


class PagedKVCache:
    """Per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim].

    One allocation holds every layer ([layers per group, 2, ...]) so the cache is a single
    contiguous buffer; the per-layer tensors are views of it. With several groups, the i-th
    layer of every group uses the i-th slice: a block holds one group's layers, and the
    scheduler gives each block to one group of one request at a time. groups=None: one group of
    every layer."""

    def __init__(
        self,
        config: KVCacheShape,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        groups: list[KVCacheGroup] | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.groups = groups or [KVCacheGroup(tuple(range(config.num_layers)))]
        size = len(self.groups[0].layers)
        if any(len(g.layers) != size for g in self.groups):
            raise ValueError("every KV cache group must hold the same number of layers")
        self._slot_of: dict[int, int] = {}  # layer -> its slice of the buffer
        self._group_of: dict[int, int] = {}
        for index, group in enumerate(self.groups):
            for slot, layer in enumerate(group.layers):
                self._slot_of[layer], self._group_of[layer] = slot, index
        if sorted(self._slot_of) != list(range(config.num_layers)):
            raise ValueError("the KV cache groups must hold every layer exactly once")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        shape = (size, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # Zeros, not empty: padded block-table entries read block 0 and are masked out, and
        # masked garbage must not be NaN/Inf (0 * inf in a matmul would poison real rows).
        self._buffer = torch.zeros(shape, dtype=dtype, device=device)
        # Per layer, its K and V views and their flat [slots, Hkv, D] views, made once: at
        # batch 1 on the CPU each select/view costs a dispatch per layer per step.
        flat = (num_blocks * block_size, config.num_kv_heads, config.head_dim)
        self._views = {
            i: (self._buffer[s, 0], self._buffer[s, 1]) for i, s in self._slot_of.items()
        }
        self._flat = {i: (k.view(flat), v.view(flat)) for i, (k, v) in self._views.items()}

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each [num_blocks, block_size, num_kv_heads, head_dim]."""
        return self._views[layer]

    def flat_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as slots, each [num_blocks * block_size, num_kv_heads,
        head_dim] (a view: what write() stores into, slot by slot)."""
        return self._flat[layer]

    def group_of(self, layer: int) -> int:
        """The KV cache group whose block tables address this layer's blocks."""
        return self._group_of[layer]

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Stores k, v [T, Hkv, D] at flat slots [T] (block_id * block_size + offset)."""
        k_flat, v_flat = self._flat[layer]
        k_flat.index_copy_(0, slot_mapping, k if k.dtype == k_flat.dtype else k.to(k_flat.dtype))
        v_flat.index_copy_(0, slot_mapping, v if v.dtype == v_flat.dtype else v.to(v_flat.dtype))


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Contiguous keys (or values) of several sequences.

    cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks] int64.
    Returns [B, Hkv, max_blocks * block_size, D], position-major within each sequence."""
    batch, max_blocks = block_tables.shape
    _, block_size, heads, dim = cache.shape
    # index_select on the flattened table: several times faster on CPU than cache[tables].
    gathered = cache.index_select(0, block_tables.reshape(-1))  # [B * max_blocks, bs, Hkv, D]
    return gathered.view(batch, max_blocks * block_size, heads, dim).transpose(1, 2)
