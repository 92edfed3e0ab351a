"""Argument checks the paged attention host wrappers share (decode and prefill).

The cache layout is the worker's (services/worker/layers/kv_cache.py): per layer, K and V are each
[num_blocks, block_size, num_kv_heads, head_dim]; a block table row lists a sequence's block ids
in position order, so position p lives at block table[p // block_size], slot p % block_size.
Rows may be padded with any valid block id: the kernels never read past a context length."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from services.worker.kernels.platform_tensors import (
    check_float,
    check_index,
    check_same,
    check_shape,
    check_tensor,
    check_unit_stride,
)

# The head dims the kernels are tested with; another one needs its tiles checked against
# registers and shared memory first.
HEAD_DIMS = (64, 128)
LOG2_E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class PagedKV:
    """What the kernels need to know about a layer's cache."""

    num_kv_heads: int
    head_dim: int
    page_size: int  # tokens per block

    def group(self, num_heads: int) -> int:
        """Query heads per KV head."""
        return num_heads // self.num_kv_heads


def check_paged_kv(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> PagedKV:
    """q [rows, Hq, D] and K/V caches [num_blocks, block_size, Hkv, D] fit together."""
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    check_float("q", q)
    check_same("k_cache", k_cache, q, "q")
    check_same("v_cache", v_cache, q, "q")
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_stride(name, tensor)
    _, page_size, num_kv_heads, head_dim = k_cache.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported; the kernels take {HEAD_DIMS}")
    if q.shape[2] != head_dim:
        raise ValueError(f"q has head_dim {q.shape[2]} but the cache {head_dim}")
    if num_kv_heads < 1 or q.shape[1] % num_kv_heads != 0:
        raise ValueError(
            f"q's {q.shape[1]} heads are not a multiple of the cache's {num_kv_heads} KV heads"
        )
    if page_size < 1:
        raise ValueError("the cache has a block size of 0")
    return PagedKV(num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size)


def check_sequences(
    q: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, num_seqs: int
) -> None:
    """block_tables [S, max_blocks] and context_lens [S] are index tensors on q's device."""
    check_tensor("block_tables", block_tables, 2)
    check_tensor("context_lens", context_lens, 1)
    for name, tensor in (("block_tables", block_tables), ("context_lens", context_lens)):
        check_index(name, tensor)
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device} but q on {q.device}")
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    check_shape("context_lens", context_lens, (num_seqs,))


def check_out(out: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The caller's output tensor (same shape, dtype and device as q), or a new one."""
    if out is None:
        return torch.empty_like(q)
    check_tensor("out", out, 3)
    check_same("out", out, q, "q")
    check_shape("out", out, tuple(q.shape))
    check_unit_stride("out", out)
    return out


def qk_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale (1/sqrt(D) by default) times log2(e): the kernels use exp2."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale * LOG2_E


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get true fp32 products; Triton would otherwise use tf32 on the GPU."""
    return "ieee" if dtype == torch.float32 else "tf32"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
