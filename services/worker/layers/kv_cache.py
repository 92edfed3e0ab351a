"""The paged KV cache: fixed-size blocks of key/value vectors, addressed by block id.

The scheduler owns which block holds what; the worker only writes where a step's slot mapping
says and reads through each sequence's block table.

Layers are split into KV cache groups of equal size, each with its own block table per sequence
and all drawing from one pool of blocks (a block holds block_size tokens of one group's layers).
A model whose layers all see the same keys has one group of every layer. Gemma 3 has global
layers and sliding-window ones: a sliding group's blocks wholly before a query's window are
never read again, so the scheduler frees them while the global group's table keeps growing
(vLLM's hybrid KV cache manager does the same).

An int8 cache (--kv-cache-dtype int8, vLLM's --kv-cache-dtype fp8 is the analogue) stores each
token's keys and values per KV head as int8 with one float32 scale (symmetric: absmax / 127,
computed when the token is written, no calibration) in a scales buffer beside the values: a
quarter of float32's bytes (plus 4 bytes a head) for attention, which is memory-bound, to read."""

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
    values (an int8 cache's scales included)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    layers = config.num_layers if layers_per_block is None else layers_per_block
    per_token = config.kv_size * element_size
    if dtype == torch.int8:
        per_token += config.num_kv_heads * SCALE_DTYPE.itemsize
    return 2 * layers * block_size * per_token


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


SCALE_DTYPE = torch.float32  # an int8 cache's scales: one per (slot, KV head)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, Hkv, D] -> int8 values [T, Hkv, D] and float32 scales [T, Hkv]: per head,
    scale = absmax / 127 and q = round(x / scale) (half to even), so each value dequantizes to
    within scale / 2 of x. A head of zeros gets scale 0 and zeros. csrc/kv_write.cpp computes
    the same bits (float32 arithmetic in this order)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.round(x32 / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return values, scale


def dequantize_int8(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., D] int8 and their scales [...] -> values * scale in dtype (via float32)."""
    return (values.float() * scale[..., None]).to(dtype)


class PagedKVCache:
    """Per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]; an int8 cache
    adds their scales, each [num_blocks, block_size, num_kv_heads] float32.

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
        self.dtype = dtype
        # Per layer, its K and V views and their flat [slots, Hkv, D] views, made once: at
        # batch 1 on the CPU each select/view costs a dispatch per layer per step. An int8
        # cache's views carry K's and V's scales after them.
        self._views = {
            i: (self._buffer[s, 0], self._buffer[s, 1]) for i, s in self._slot_of.items()
        }
        if dtype == torch.int8:
            scales = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)
            self._scales = scales  # held here too: the views below are all that reads it
            self._views = {
                i: (*kv, scales[self._slot_of[i], 0], scales[self._slot_of[i], 1])
                for i, kv in self._views.items()
            }
        slots = num_blocks * block_size
        self._flat = {
            i: tuple(t.view(slots, *t.shape[2:]) for t in views) for i, views in self._views.items()
        }

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def quantized(self) -> bool:
        """Whether K and V are int8 with scales (layer() and flat_layer() give 4 tensors)."""
        return self.dtype == torch.int8

    def layer(self, layer: int) -> tuple[torch.Tensor, ...]:
        """K and V of one layer, each [num_blocks, block_size, num_kv_heads, head_dim]; an int8
        cache's K scales and V scales follow, each [num_blocks, block_size, num_kv_heads]."""
        return self._views[layer]

    def flat_layer(self, layer: int) -> tuple[torch.Tensor, ...]:
        """layer() as slots: K and V [num_blocks * block_size, num_kv_heads, head_dim] (then
        the scales [num_blocks * block_size, num_kv_heads]): views write() stores into."""
        return self._flat[layer]

    def group_of(self, layer: int) -> int:
        """The KV cache group whose block tables address this layer's blocks."""
        return self._group_of[layer]

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Stores k, v [T, Hkv, D] at flat slots [T] (block_id * block_size + offset); an int8
        cache quantizes them (quantize_int8) and stores their scales beside them."""
        if self.quantized:
            for cache, scales, x in zip(
                self._flat[layer][:2], self._flat[layer][2:], (k, v), strict=True
            ):
                values, scale = quantize_int8(x)
                cache.index_copy_(0, slot_mapping, values)
                scales.index_copy_(0, slot_mapping, scale)
            return
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


def gather_layer(
    layer_cache: tuple[torch.Tensor, ...], block_tables: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """gather_blocks of a layer's keys and values (PagedKVCache.layer()), in dtype: an int8
    cache's are dequantized with their scales. Returns K, V [B, Hkv, max_blocks * block_size,
    D]."""
    k_cache, v_cache, *scales = layer_cache
    if not scales:
        k, v = gather_blocks(k_cache, block_tables), gather_blocks(v_cache, block_tables)
        return (k, v) if k.dtype == dtype else (k.to(dtype), v.to(dtype))
    gathered = []
    for cache, scale in zip((k_cache, v_cache), scales, strict=True):
        values = gather_blocks(cache, block_tables)  # [B, Hkv, L, D]
        scale = gather_blocks(scale[..., None], block_tables)[..., 0]  # [B, Hkv, L]
        gathered.append(dequantize_int8(values, scale, dtype))
    return gathered[0], gathered[1]
