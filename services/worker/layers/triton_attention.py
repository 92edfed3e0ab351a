"""The Triton attention backend: attention, KV cache writes, RMSNorm, RoPE and SiLU-mul as the
kernels of services/worker/kernels/. Imported only when it is chosen (attention.py), so a
torch-only worker never loads Triton.

A step of decodes only goes to the decode kernel (it splits long contexts across programs);
any step with a prefill chunk goes to the prefill kernel, whose decode rows are chunks of one,
so a mixed step is still a single launch per layer."""

from __future__ import annotations

import torch

from services.worker.kernels.cache_write import write_kv_cache
from services.worker.kernels.decode_attention import decode_attention
from services.worker.kernels.prefill_attention import prefill_attention
from services.worker.kernels.rms_norm import add_rms_norm, rms_norm
from services.worker.kernels.rope import apply_rope
from services.worker.kernels.silu_mul import silu_mul
from services.worker.layers.attention_metadata import AttentionMetadata, lay_out
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import rope_then_write_kv


class TritonAttention:
    """The AttentionBackend (attention.py) of Triton kernels: head dims of HEAD_DIMS
    (kernels/attention_inputs.py), no sliding windows."""

    name = "triton"
    supports_sliding_window = False
    supports_decode_graphs = True  # the kernels read only device tensors a graph can freeze
    supports_int8_kv = False  # the kernels read K/V in the compute dtype, no scales

    def metadata(
        self,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        meta, _ = lay_out(query_lens, context_lens, block_tables, block_size, device)
        meta.context_lens_device = torch.tensor(context_lens, dtype=torch.int64, device=device)
        return meta

    def write_kv(
        self,
        cache: PagedKVCache,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        attn: AttentionMetadata,
    ) -> None:
        write_kv_cache(k, v, *cache.layer(layer), attn.slot_mapping)

    def paged_attention(
        self,
        q: torch.Tensor,
        layer_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        window: int | None = None,
    ) -> torch.Tensor:
        """q: [T, H, D] over K/V [num_blocks, block_size, Hkv, D] (new K/V written) -> [T, H, D]."""
        if window is not None:
            raise ValueError("sliding-window attention runs on the torch path only")
        k_cache, v_cache = layer_cache
        context_lens = attn.context_lens_device
        if context_lens is None:
            raise ValueError("AttentionMetadata was built for torch kernels, not triton")
        if attn.max_query_len == 1:
            return decode_attention(
                q, k_cache, v_cache, attn.block_tables, context_lens,
                max_context_len=attn.max_context_len,
            )  # fmt: skip
        return prefill_attention(
            q, k_cache, v_cache, attn.query_start, context_lens, attn.block_tables,
            max_query_len=attn.max_query_len,
        )  # fmt: skip

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        # One launch: the kernel rounds the sum to the dtype, then norms it as rms_norm does.
        out, _ = add_rms_norm(x, residual, weight, eps, inplace=True)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)

    def rotary(
        self, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole [P, D] float32 tables: the kernel looks up each token's row itself."""
        return cos, sin

    def apply_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope(q, k, positions, *rotary, inplace=True)  # in place in qkv, no copy

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
