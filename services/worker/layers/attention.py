"""Who runs attention and the ops around it (KV cache writes, RMSNorm, RoPE, SiLU-mul): an
AttentionBackend, built once at start-up (attention_backends.py, from --kernels) and handed to
the ModelRunner, and StepAttention: one step's layout in every KV cache group, built by that
backend and handed to the model with the step. The model calls attn.backend; nothing checks a
string at run time.

Two backends: torch ops (torch_attention.py, everywhere; on the CPU its paged attention runs in
a C++ extension that reads the cache in place when `make install` has built it:
cpu_attention.py) and the Triton kernels (triton_attention.py, imported only when chosen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from services.worker.layers.attention_metadata import AttentionMetadata
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention


class AttentionBackend(Protocol):
    name: str  # "torch" or "triton": WorkerInfo.kernels
    supports_sliding_window: bool  # paged_attention takes a window
    supports_decode_graphs: bool  # its decode steps can be captured as CUDA graphs
    supports_int8_kv: bool  # writes and reads an int8 PagedKVCache (with its scales)

    def metadata(
        self,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        """One KV cache group's layout of S sequences; each table covers its context."""
        ...

    def write_kv(
        self,
        cache: PagedKVCache,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        attn: AttentionMetadata,
    ) -> None:
        """Stores the step's new k, v [T, Hkv, D] of one layer at attn.slot_mapping."""
        ...

    def paged_attention(
        self,
        q: torch.Tensor,
        layer_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        window: int | None = None,
    ) -> torch.Tensor:
        """q [T, H, D] over K/V [num_blocks, block_size, Hkv, D], the new K/V already written
        -> [T, H, D]. layer_cache: PagedKVCache.layer() (an int8 cache's scales follow K and
        V). window: the query at p sees keys in (p - window, p] only."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [T, d] -> [T, d]."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x in place, then rms_norm(residual): a pre-norm block's residual add and
        the next norm as one call. x, residual [T, d] -> [T, d]; x may be overwritten."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
        ...

    def rotary(
        self, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From the [P, D] cos/sin tables and positions [T], what apply_rope takes."""
        ...

    def apply_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] rotated (HF rotate_half) at their positions."""
        ...

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
        """apply_rope at attn.positions, then write_kv of the rotated k and v: returns q
        rotated (the CPU backend does both in one op)."""
        ...


TORCH: AttentionBackend = TorchAttention()  # the reference: models' default, tests' baseline


@dataclass(frozen=True, slots=True)
class StepAttention:
    """One step's layout as every KV cache group (kv_cache.py) sees it: the same sequences and
    tokens, each group through its own block tables. A layer of group g reads groups[g]; every
    layer runs on `backend`, which built the groups."""

    groups: tuple[AttentionMetadata, ...]
    backend: AttentionBackend = TORCH

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[list[int]]],
        block_size: int,
        device: torch.device,
        backend: AttentionBackend = TORCH,
    ) -> StepAttention:
        """block_tables: per KV cache group, the S block tables of that group."""
        groups = tuple(
            backend.metadata(query_lens, context_lens, tables, block_size, device)
            for tables in block_tables
        )
        return cls(groups, backend)

    def attend(
        self,
        kv_cache: PagedKVCache,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        window: int | None = None,
    ) -> torch.Tensor:
        """One layer's attention: its new k, v [T, Hkv, D] go into the cache first, so every
        query attends only through the cache; q [T, H, D] -> [T, H, D]. window: as
        AttentionBackend.paged_attention."""
        group = self.for_group(kv_cache.group_of(layer))
        self.backend.write_kv(kv_cache, layer, k, v, group)
        return self.backend.paged_attention(q, kv_cache.layer(layer), group, window)

    def rope_and_attend(
        self,
        kv_cache: PagedKVCache,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        window: int | None = None,
    ) -> torch.Tensor:
        """attend() of q and k rotated first (rotary: what backend.rotary() made): the backend's
        rope_write_kv rotates them and stores k, v, one call of the extension on the CPU."""
        group = self.for_group(kv_cache.group_of(layer))
        q = self.backend.rope_write_kv(kv_cache, layer, q, k, v, rotary, group)
        return self.backend.paged_attention(q, kv_cache.layer(layer), group, window)

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
