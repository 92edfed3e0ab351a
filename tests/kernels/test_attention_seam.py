"""The kernels take the worker's AttentionMetadata as it is and agree with its torch path.

This is the seam they will be wired into (services/worker/layers/attention.py: paged_attention): one
flattened step mixing decodes and prefill chunks, some continuing a cached prefix."""

from __future__ import annotations

import torch

from services.worker.kernels.decode_attention import decode_attention
from services.worker.kernels.prefill_attention import prefill_attention
from services.worker.layers.attention_metadata import AttentionMetadata
from services.worker.layers.torch_attention import TorchAttention
from tests.kernels.attention_cases import DEVICE, assert_close

TORCH = TorchAttention()
QUERY_LENS = [1, 18, 1, 6]
CONTEXT_LENS = [10, 18, 33, 38]  # the last chunk continues a 32-token cached prefix
BLOCK_SIZE = 16
NUM_KV_HEADS, GROUP, HEAD_DIM = 3, 3, 64  # SmolLM2-135M's attention shape


def _step() -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], AttentionMetadata]:
    gen = torch.Generator().manual_seed(11)
    num_blocks = 16
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for length in CONTEXT_LENS:
        tables.append([order.pop() for _ in range(-(-length // BLOCK_SIZE))])
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    # Finite everywhere: the torch path reads padding (masked) and 0 * NaN would poison it.
    k_cache = torch.randn(shape, generator=gen).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE)
    q = torch.randn((sum(QUERY_LENS), NUM_KV_HEADS * GROUP, HEAD_DIM), generator=gen).to(DEVICE)
    attn = TORCH.metadata(QUERY_LENS, CONTEXT_LENS, tables, BLOCK_SIZE, DEVICE)
    return q, (k_cache, v_cache), attn


def test_prefill_kernel_over_whole_step_matches_worker() -> None:
    """Every row of a mixed step (decode rows are chunks of one) in one launch."""
    q, (k_cache, v_cache), attn = _step()
    expected = TORCH.paged_attention(q, (k_cache, v_cache), attn).double()
    context_lens = torch.tensor(attn.context_lens, device=DEVICE)
    out = prefill_attention(
        q, k_cache, v_cache, attn.query_start, context_lens, attn.block_tables,
        max_query_len=max(attn.query_lens),
    )  # fmt: skip
    assert_close(out, expected, torch.float32)


def test_decode_kernel_on_decode_group_matches_worker() -> None:
    q, (k_cache, v_cache), attn = _step()
    expected = TORCH.paged_attention(q, (k_cache, v_cache), attn).double()
    group = attn.decode
    assert group is not None
    decode_seqs = [i for i, n in enumerate(attn.query_lens) if n == 1]
    context_lens = torch.tensor([attn.context_lens[i] for i in decode_seqs], device=DEVICE)
    out = decode_attention(
        q[group.token_index], k_cache, v_cache, group.block_tables, context_lens, num_splits=2
    )
    assert_close(out, expected[group.token_index], torch.float32)
