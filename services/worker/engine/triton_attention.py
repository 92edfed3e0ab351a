"""paged_attention with the Triton kernels: one launch covers a whole step.

A step of decodes only goes to the decode kernel (it splits long contexts across programs);
any step with a prefill chunk goes to the prefill kernel, whose decode rows are chunks of one,
so a mixed step is still a single launch per layer."""

from __future__ import annotations

import torch

from services.worker.engine.attention import AttentionMetadata
from services.worker.kernels.decode_attention_host import decode_attention
from services.worker.kernels.prefill_attention_host import prefill_attention


def triton_paged_attention(
    q: torch.Tensor, layer_cache: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata
) -> torch.Tensor:
    """q: [T, H, D] over K/V [num_blocks, block_size, Hkv, D] (new K/V written) -> [T, H, D]."""
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
