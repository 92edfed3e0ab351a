"""Random paged KV caches for the attention kernel tests, laid out as the worker lays them out.

Blocks are handed out in shuffled order, so a kernel that assumed a sequence's blocks were
contiguous would read another sequence's keys. Every slot outside a sequence's context (the
rest of its last block, the spare blocks, the block that pads the tables) holds NaN: a kernel
that reads one key too many returns NaN instead of a plausible number."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")

# fp32 runs everywhere: under the interpreter on CPU, compiled on a GPU. The half types run
# only compiled (the interpreter has no bfloat16), so without a GPU they report SKIPPED.
_NEEDS_GPU = pytest.mark.skipif(not CUDA, reason="fp16/bf16 kernels need a CUDA GPU")
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16", marks=_NEEDS_GPU),
    pytest.param(torch.bfloat16, id="bf16", marks=_NEEDS_GPU),
]


def tolerance(dtype: torch.dtype) -> float:
    """atol and rtol for a kernel output against the float64 reference on the same inputs.

    In fp16/bf16 the kernels round the softmax weights to the dtype before the P @ V product
    and round the output once more: each costs at most half an ulp relative to values of size
    ~1 (unit-normal V), so 4 * eps covers both with margin. In fp32 nothing is rounded to a
    narrower type; what differs is the order of the sums over D and the keys, well under
    64 * eps at these sizes."""
    eps = torch.finfo(dtype).eps
    return 64 * eps if dtype == torch.float32 else 4 * eps


@dataclass(slots=True)
class PagedCache:
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks + 1] int64, padded with a NaN block
    context_lens: torch.Tensor  # [S] int64


def paged_cache(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> PagedCache:
    """K/V for sequences of the given lengths, in shuffled blocks, NaN wherever no key is."""
    counts = [-(-length // block_size) for length in context_lens]
    num_blocks = sum(counts) + 2  # two spare blocks, never part of a sequence
    order = torch.randperm(num_blocks, generator=generator).tolist()
    pad_block = order.pop()
    width = max(counts, default=0) + 1  # wider than any sequence needs
    tables = torch.full((len(context_lens), width), pad_block, dtype=torch.int64)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=torch.float32)
    v_cache = torch.full(shape, float("nan"), dtype=torch.float32)
    for seq, (length, count) in enumerate(zip(context_lens, counts, strict=True)):
        for index in range(count):
            block = order.pop()
            tables[seq, index] = block
            used = min(block_size, length - index * block_size)
            k_cache[block, :used] = torch.randn((used, num_kv_heads, head_dim), generator=generator)
            v_cache[block, :used] = torch.randn((used, num_kv_heads, head_dim), generator=generator)
    return PagedCache(
        k_cache=k_cache.to(DEVICE, dtype),
        v_cache=v_cache.to(DEVICE, dtype),
        block_tables=tables.to(DEVICE),
        context_lens=torch.tensor(context_lens, dtype=torch.int64, device=DEVICE),
    )


def random_queries(
    rows: int, num_heads: int, head_dim: int, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """[rows, Hq, D] unit-normal queries on the test device."""
    return torch.randn((rows, num_heads, head_dim), generator=generator).to(DEVICE, dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = tolerance(dtype)
    assert not actual.isnan().any(), "the kernel read a key outside a context (NaN)"
    torch.testing.assert_close(actual.double(), expected, atol=tol, rtol=tol)
