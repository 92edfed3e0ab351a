"""Triton kernels: paged decode attention, one new query per sequence, split across the context.

The host side (shapes, strides, grid, split choice) is decode_attention.py.

decode_attention_kernel runs one program per (sequence, KV head, split). The G query heads that
share a KV head are the rows of one tile, so every key and value of a sequence is read once per
KV head, not once per query head (GQA). A split covers tokens_per_split consecutive positions;
with SPLIT the program writes its partial result (normalised output and log2-sum-exp per head)
and decode_reduce_kernel merges the splits, so a long context spreads over many programs even
at batch 1. Without SPLIT (one split) the program writes the final output itself.

Scores are kept in base 2 (the scale is pre-multiplied by log2(e)) so the softmax uses exp2,
which maps to one hardware instruction; the partial log-sum-exp is base 2 as well.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_attention_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_blocks, PAGE_SIZE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE_SIZE, Hkv, D]
    block_tables_ptr,  # [B, max_blocks] int32/int64
    context_lens_ptr,  # [B] int32/int64: keys each query sees, its own included
    out_ptr,  # [B, Hq, D], written when not SPLIT
    part_out_ptr,  # [B, Hq, num_splits, D] fp32, written when SPLIT
    part_lse_ptr,  # [B, Hq, num_splits] fp32 (base 2), written when SPLIT
    qk_scale,  # softmax scale * log2(e)
    tokens_per_split,  # a multiple of BLOCK_N
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_tb, stride_tn,
    stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr,  # query heads per KV head (Hq // Hkv)
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two, >= 16: tl.dot's minimum M
    HEAD_DIM: tl.constexpr,  # power of two: tl.arange needs one, and loads vectorise over it
    PAGE_SIZE: tl.constexpr,  # cache block size: constant per cache, so / and % compile to shifts
    BLOCK_N: tl.constexpr,  # keys per loop step: >= 16 for tl.dot; need not divide a page
    SPLIT: tl.constexpr,  # several splits: write partials for decode_reduce_kernel
    DOT_PRECISION: tl.constexpr,  # "ieee": fp32 caches stay fp32 (no tf32); fp16/bf16 ignore it
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    start = split * tokens_per_split
    if SPLIT:
        if start >= context_len:
            return  # this sequence is shorter than the longest: the reduction skips this split
    end = tl.minimum(start + tokens_per_split, context_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    mask_g = offs_g < GROUP
    q_ptrs = q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_g[:, None], other=0.0)  # [GROUP_PAD, D]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table_ptr = block_tables_ptr + seq * stride_tb
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        # int64: block id * block stride exceeds 2**31 elements on a large cache.
        blocks = tl.load(table_ptr + (offs_n // PAGE_SIZE) * stride_tn, mask=mask_n, other=0)
        blocks = blocks.to(tl.int64)
        slots = offs_n % PAGE_SIZE
        k_ptrs = k_head_ptr + blocks[:, None] * stride_kb + slots[:, None] * stride_ks
        k = tl.load(k_ptrs + offs_d[None, :], mask=mask_n[:, None], other=0.0)  # [N, D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [G, N] fp32
        s = tl.where(mask_n[None, :], s, float("-inf"))
        # n0 < end, so every step has a real key and m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = v_head_ptr + blocks[:, None] * stride_vb + slots[:, None] * stride_vs
        v = tl.load(v_ptrs + offs_d[None, :], mask=mask_n[:, None], other=0.0)  # [N, D]
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if SPLIT:
        # start < context_len here, so l_i > 0.
        part_ptrs = part_out_ptr + seq * stride_pb + heads[:, None] * stride_ph
        part_ptrs += split * stride_ps + offs_d[None, :]
        tl.store(part_ptrs, acc / l_i[:, None], mask=mask_g[:, None])
        lse_ptrs = part_lse_ptr + seq * stride_lb + heads * stride_lh + split
        tl.store(lse_ptrs, m_i + tl.log2(l_i), mask=mask_g)
    else:
        # An empty context (never sent by the worker) yields zeros, not NaN.
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_g[:, None])


@triton.jit
def decode_reduce_kernel(
    part_out_ptr,  # [B, Hq, num_splits, D] fp32
    part_lse_ptr,  # [B, Hq, num_splits] fp32 (base 2)
    context_lens_ptr,  # [B]
    out_ptr,  # [B, Hq, D]
    tokens_per_split,
    num_splits,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr,  # power of two, as in decode_attention_kernel
    SPLITS_PAD: tl.constexpr,  # num_splits rounded up to a power of two (tl.arange)
):  # fmt: skip
    """One program per (sequence, query head): the splits' outputs weighted by their sums."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    # Splits past this sequence's context wrote nothing: their memory is garbage, so mask it.
    used = tl.minimum((context_len + tokens_per_split - 1) // tokens_per_split, num_splits)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_s = offs_s < used
    lse_ptrs = part_lse_ptr + seq * stride_lb + head * stride_lh + offs_s
    lse = tl.load(lse_ptrs, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    weights = tl.where(mask_s, tl.exp2(lse - m), 0.0)  # [SPLITS_PAD]
    part_ptrs = part_out_ptr + seq * stride_pb + head * stride_ph
    part_ptrs += offs_s[:, None] * stride_ps + offs_d[None, :]
    parts = tl.load(part_ptrs, mask=mask_s[:, None], other=0.0)  # [SPLITS_PAD, D]
    total = tl.sum(weights, axis=0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(parts * weights[:, None], axis=0) / total
    out_ptrs = out_ptr + seq * stride_ob + head * stride_oh + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty))
