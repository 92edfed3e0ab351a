"""Triton kernel: causal prefill attention over the paged KV cache (FlashAttention-2 style).

The host side (shapes, strides, grid, tiles) is prefill_attention.py.

The batch is packed: sequence s owns query rows cu_seqlens[s]:cu_seqlens[s+1] and has
context_lens[s] keys in the cache, its new tokens' keys included (the worker writes new K/V into
the cache before attention). Its first context_lens[s] - q_len keys are a cached prefix every new
query sees; new query i sits at position prefix + i and sees keys 0..prefix + i.

One program per (query tile, query head, sequence) walks the keys in BLOCK_N steps with an
online softmax (running max m_i, running sum l_i, unnormalised accumulator). The keys split in
two phases: those below the tile's first position are visible to every row, so they need no
causal mask; the diagonal steps after them do. Scores are base 2 (scale * log2(e)) for exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend_keys(
    acc, l_i, m_i,  # running state: [M, D] fp32, [M] fp32, [M] fp32
    q,  # [BLOCK_M, D]
    q_pos,  # [BLOCK_M] position of each query row
    lo, hi,  # key positions [lo, hi) to visit; lo is a multiple of BLOCK_N
    table_ptr, stride_tn,  # this sequence's block table row
    k_head_ptr, stride_kb, stride_ks,  # K cache at this KV head
    v_head_ptr, stride_vb, stride_vs,
    qk_scale,
    CAUSAL: tl.constexpr,  # mask keys after each query's position (the diagonal phase)
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        # int64: block id * block stride exceeds 2**31 elements on a large cache.
        blocks = tl.load(table_ptr + (offs_n // PAGE_SIZE) * stride_tn, mask=mask_n, other=0)
        blocks = blocks.to(tl.int64)
        slots = offs_n % PAGE_SIZE
        k_ptrs = k_head_ptr + blocks[:, None] * stride_kb + slots[:, None] * stride_ks
        k = tl.load(k_ptrs + offs_d[None, :], mask=mask_n[:, None], other=0.0)  # [N, D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, N] fp32
        visible = mask_n[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        # A row can see no key of a diagonal step (keys after it); its max must stay finite
        # there, and it does: every row saw key lo <= its position in an earlier step.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = v_head_ptr + blocks[:, None] * stride_vb + slots[:, None] * stride_vs
        v = tl.load(v_ptrs + offs_d[None, :], mask=mask_n[:, None], other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def prefill_attention_kernel(
    q_ptr,  # [T, Hq, D] packed new tokens
    k_cache_ptr,  # [num_blocks, PAGE_SIZE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE_SIZE, Hkv, D]
    out_ptr,  # [T, Hq, D]
    cu_seqlens_ptr,  # [S + 1] int32/int64: row offsets of each sequence's new tokens
    context_lens_ptr,  # [S] int32/int64: cached + new tokens per sequence
    block_tables_ptr,  # [S, max_blocks] int32/int64
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_tb, stride_tn,
    GROUP: tl.constexpr,  # query heads per KV head (Hq // Hkv)
    HEAD_DIM: tl.constexpr,  # power of two: tl.arange needs one, and loads vectorise over it
    PAGE_SIZE: tl.constexpr,  # cache block size: constant per cache, so / and % compile to shifts
    BLOCK_M: tl.constexpr,  # query rows per program: >= 16 for tl.dot
    BLOCK_N: tl.constexpr,  # keys per loop step: >= 16 for tl.dot
    DOT_PRECISION: tl.constexpr,  # "ieee": fp32 caches stay fp32 (no tf32); fp16/bf16 ignore it
):  # fmt: skip
    # Tiles in reverse: the last tiles of a sequence see the most keys, and starting the
    # longest programs first keeps the tail of the grid short.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq).to(tl.int32)
    q_len = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int32) - q_start
    m_start = tile * BLOCK_M
    if m_start >= q_len:
        return  # the grid covers the longest chunk; this one is shorter
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    prefix = context_len - q_len
    kv_head = head // GROUP

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_m = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    q_ptrs = q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_m[:, None], other=0.0)  # [BLOCK_M, D]
    q_pos = prefix + offs_m

    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    table_ptr = block_tables_ptr + seq * stride_tb
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    # Keys below the tile's first position (rounded down to a step) are seen by every row.
    shared_end = ((prefix + m_start) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_keys(
        acc, l_i, m_i, q, q_pos, 0, shared_end, table_ptr, stride_tn,
        k_head_ptr, stride_kb, stride_ks, v_head_ptr, stride_vb, stride_vs, qk_scale,
        False, HEAD_DIM, PAGE_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    diagonal_end = tl.minimum(context_len, prefix + m_start + BLOCK_M)
    acc, l_i, m_i = _attend_keys(
        acc, l_i, m_i, q, q_pos, shared_end, diagonal_end, table_ptr, stride_tn,
        k_head_ptr, stride_kb, stride_ks, v_head_ptr, stride_vb, stride_vs, qk_scale,
        True, HEAD_DIM, PAGE_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # an empty context yields zeros, not NaN
    out = acc / l_safe[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])
