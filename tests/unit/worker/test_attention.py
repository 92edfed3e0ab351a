"""paged_attention against plain dense attention on random tensors (the kernel seam's contract)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.worker.layers import attention
from services.worker.layers.attention import StepAttention
from services.worker.layers.attention_backends import attention_backend
from services.worker.layers.kv_cache import PagedKVCache, num_blocks_for_bytes
from services.worker.layers.torch_attention import TorchAttention
from services.worker.model.config import LlamaConfig
from services.worker.model.gemma3 import Gemma3Model
from services.worker.model.gemma3_config import Gemma3Config, pattern_layer_types

HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 8, 4
TORCH = TorchAttention()
CPU = torch.device("cpu")
CONFIG = LlamaConfig(
    vocab_size=10, hidden_size=HEADS * DIM, intermediate_size=8, num_layers=1, num_heads=HEADS,
    num_kv_heads=KV_HEADS, head_dim=DIM, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=64, tie_word_embeddings=True, eos_token_ids=(0,),
)  # fmt: skip


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """q [n, H, D] after `past` tokens; k, v [past + n, Hkv, D] -> [n, H, D]."""
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(0, 1)  # [H, L, D]
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(0, 1)
    n, total = q.shape[0], k.shape[1]
    mask = torch.arange(total)[None, :] <= (past + torch.arange(n))[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)


def test_mixed_batch_matches_dense() -> None:
    """Decodes and prefill chunks (one with a cached prefix) in one flattened batch."""
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(CONFIG, num_blocks=32, block_size=BLOCK, dtype=torch.float32,
                         device=torch.device("cpu"))  # fmt: skip
    # (cached tokens, new tokens, shuffled block table) per sequence
    seqs = [(0, 7, [9, 3]), (5, 1, [4, 17]), (10, 6, [1, 30, 8, 22]), (12, 1, [5, 6, 7, 2])]
    full_k = [torch.randn(p + n, KV_HEADS, DIM, generator=g) for p, n, _ in seqs]
    full_v = [torch.randn(p + n, KV_HEADS, DIM, generator=g) for p, n, _ in seqs]
    for (past, _, table), k, v in zip(seqs, full_k, full_v, strict=True):
        if past:  # an earlier step stored the prefix
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
    out = TORCH.paged_attention(q, cache.layer(0), attn)
    start = 0
    for (past, n, _), k, v in zip(seqs, full_k, full_v, strict=True):
        expected = _dense(q[start : start + n], k, v, past)
        torch.testing.assert_close(out[start : start + n], expected, rtol=1e-5, atol=1e-5)
        start += n
    assert attn.decode is not None and attn.decode.token_index.tolist() == [7, 14]


def test_slot_mapping_follows_block_table() -> None:
    attn = TORCH.metadata([3], [6], [[7, 2]], BLOCK, torch.device("cpu"))
    assert attn.positions.tolist() == [3, 4, 5]
    assert attn.slot_mapping.tolist() == [7 * BLOCK + 3, 2 * BLOCK + 0, 2 * BLOCK + 1]


def test_num_blocks_for_bytes() -> None:
    per_block = 2 * 1 * BLOCK * KV_HEADS * DIM * 4
    assert num_blocks_for_bytes(CONFIG, BLOCK, torch.float32, per_block * 10 + 5) == 10


def test_the_backend_is_chosen_by_its_resolved_name_and_builds_every_groups_layout() -> None:
    # torch: the torch ops, with the C++ CPU attention when built (test_cpu_attention.py)
    assert attention_backend("torch").name == "torch"
    with pytest.raises(ValueError, match="no attention backend 'auto'"):
        attention_backend("auto")  # kernel_choice.py resolves auto before a backend is built
    step = StepAttention.build([2, 1], [2, 5], [[[3], [4, 5]], [[6], [-1, 7]]], BLOCK, CPU)
    assert step.backend is attention.TORCH
    assert [g.slot_mapping.tolist() for g in step.groups] == [
        [3 * BLOCK, 3 * BLOCK + 1, 5 * BLOCK],
        [6 * BLOCK, 6 * BLOCK + 1, 7 * BLOCK],
    ]
    assert step.for_group(1) is step.groups[1] and step.positions.tolist() == [0, 1, 4]


def test_gemma3_refuses_a_backend_without_sliding_windows() -> None:
    class NoWindows(TorchAttention):
        supports_sliding_window = False

    config = Gemma3Config(
        vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2,
        num_kv_heads=1, head_dim=4, rope_theta=1e4, rms_norm_eps=1e-6, max_position_embeddings=16,
        tie_word_embeddings=True, eos_token_ids=(1,), layer_types=pattern_layer_types(2, 2),
        sliding_window=4,
    )  # fmt: skip
    model = Gemma3Model(config)
    cache = PagedKVCache(config, 4, BLOCK, torch.float32, CPU)
    step = StepAttention.build([1], [1], [[[0]]], BLOCK, CPU, backend=NoWindows())
    with pytest.raises(ValueError, match="torch attention path only"):
        model(torch.tensor([1]), step.positions, step, cache)
