"""Sliding-window paged attention against a dense, explicitly windowed reference."""

from __future__ import annotations

import pytest
import torch

from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention
from services.worker.model.config import LlamaConfig

HEADS, KV_HEADS, DIM, BLOCK, WINDOW = 4, 1, 8, 4, 5
TORCH = TorchAttention()
CONFIG = LlamaConfig(
    vocab_size=10, hidden_size=HEADS * DIM, intermediate_size=8, num_layers=1, num_heads=HEADS,
    num_kv_heads=KV_HEADS, head_dim=DIM, rope_theta=10000.0, rms_norm_eps=1e-6,
    max_position_embeddings=64, tie_word_embeddings=True, eos_token_ids=(0,),
)  # fmt: skip


def _dense_windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """q [n, H, D] after `past` tokens; k, v [past + n, 1, D]; softmax over keys in the window."""
    query_pos = (past + torch.arange(q.shape[0]))[:, None]
    key_pos = torch.arange(k.shape[0])[None, :]
    visible = (key_pos <= query_pos) & (query_pos - key_pos < WINDOW)  # [n, L]
    scores = torch.einsum("nhd,ld->hnl", q, k[:, 0]) / DIM**0.5
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hnl,ld->nhd", weights, v[:, 0])


def test_windowed_mixed_batch_matches_dense() -> None:
    """Decodes far past the window, a prefill chunk after a cached prefix, and a fresh prompt
    longer than the window, in one flattened batch."""
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(CONFIG, 40, BLOCK, torch.float32, torch.device("cpu"))
    seqs = [(0, 9, [9, 3, 11]), (13, 1, [4, 17, 20, 21]), (10, 6, [1, 30, 8, 22]), (3, 1, [5])]
    full_k = [torch.randn(p + n, KV_HEADS, DIM, generator=g) for p, n, _ in seqs]
    full_v = [torch.randn(p + n, KV_HEADS, DIM, generator=g) for p, n, _ in seqs]
    for (past, _, table), k, v in zip(seqs, full_k, full_v, strict=True):
        if past:
            prior = TORCH.metadata([past], [past], [table], BLOCK, torch.device("cpu"))
            cache.write(0, k[:past], v[:past], prior.slot_mapping)
    attn = TORCH.metadata(
        [n for _, n, _ in seqs], [p + n for p, n, _ in seqs], [t for *_, t in seqs], BLOCK,
        torch.device("cpu"),
    )  # fmt: skip
    new_k = torch.cat([k[p:] for (p, _, _), k in zip(seqs, full_k, strict=True)])
    new_v = torch.cat([v[p:] for (p, _, _), v in zip(seqs, full_v, strict=True)])
    cache.write(0, new_k, new_v, attn.slot_mapping)
    q = torch.randn(attn.num_tokens, HEADS, DIM, generator=g)
    windowed = TORCH.paged_attention(q, cache.layer(0), attn, window=WINDOW)
    full = TORCH.paged_attention(q, cache.layer(0), attn)
    start = 0
    for (past, n, _), k, v in zip(seqs, full_k, full_v, strict=True):
        expected = _dense_windowed(q[start : start + n], k, v, past)
        torch.testing.assert_close(windowed[start : start + n], expected, rtol=1e-5, atol=1e-5)
        start += n
    # Queries whose context fits the window see the same keys either way; the others do not.
    torch.testing.assert_close(windowed[16], full[16])  # the last sequence: 4 keys < WINDOW
    assert not torch.allclose(windowed[9], full[9])  # decode at position 13


def test_window_is_refused_on_the_triton_path() -> None:
    from services.worker.layers.triton_attention import TritonAttention

    triton = TritonAttention()
    attn = triton.metadata([1], [1], [[0]], BLOCK, torch.device("cpu"))
    cache = PagedKVCache(CONFIG, 2, BLOCK, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="torch path"):
        triton.paged_attention(torch.zeros(1, HEADS, DIM), cache.layer(0), attn, window=WINDOW)
