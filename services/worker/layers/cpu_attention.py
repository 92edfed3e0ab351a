"""The torch backend with the CPU's paged attention in C++ (csrc/cpu_attention.cpp): each query
reads its keys and values in place through the block table, where the torch path copies every
block of every sequence into a padded tensor, every layer, every step. Decodes and prefill
chunks of the whole batch go in one call per layer; no mask is built.

RoPE runs in the extension too (csrc/rope.cpp: q and k in place, one call instead of 12
torch ops, the same bits), and so does SiLU-mul (csrc/small_ops.cpp: torch_ops.py's ATen calls
made from C++, one dispatch from Python), and so do the norms (the residual add before a
norm in the same call, bit for bit), and so does a layer's KV cache write (csrc/kv_write.cpp:
k and v copied to their slots in one call, not two index_copy_; a Llama layer's RoPE and KV
write are one call, rope_write_kv_). All of it is the torch path's
on any other device (--kernels torch on CUDA): the torch path stays the
reference this one is tested against (tests/unit/worker/test_cpu_attention.py).

An int8 KV cache (kv_cache.py) is quantized by the write ops as they store each token and read
by paged_attention with its scales, each row widened to float32 times its scale: a quarter of
float32's bytes to read (tests/unit/worker/test_int8_kv.py)."""

from __future__ import annotations

import math

import torch

from services.worker.layers.attention_metadata import AttentionMetadata, lay_out
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.torch_attention import TorchAttention


class CpuAttention(TorchAttention):
    """The AttentionBackend (attention.py) of torch ops plus the extension's paged attention on
    the CPU. Build it only once cpu_attention_ext.load() has returned True."""

    name = "torch"  # WorkerInfo.kernels: the torch path, with a native attention op on the CPU

    def __init__(self, avx512_bf16: bool = True) -> None:
        # False: bf16 K/V widened to float32 copies as in issue 18 (the benchmark compares both).
        self.avx512_bf16 = avx512_bf16

    def metadata(
        self,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        if device.type != "cpu":
            return super().metadata(query_lens, context_lens, block_tables, block_size, device)
        meta, _ = lay_out(query_lens, context_lens, block_tables, block_size, device)
        meta.context_lens_device = torch.tensor(context_lens, dtype=torch.int64)
        return meta

    def write_kv(
        self,
        cache: PagedKVCache,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        attn: AttentionMetadata,
    ) -> None:
        """PagedKVCache.write's bits in one call of the extension (csrc/kv_write.cpp) when k
        and v are already in the cache's dtype (or it is int8: quantized in the op); the torch
        path otherwise."""
        flat = cache.flat_layer(layer)
        if k.device.type != "cpu" or not _writes_directly(cache, k, v):
            return super().write_kv(cache, layer, k, v, attn)
        k_flat, v_flat, *scales = flat
        torch.ops.layerserve.write_kv_(k_flat, v_flat, k, v, attn.slot_mapping, *scales)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """torch_ops.silu_mul's ATen calls from C++ (csrc/small_ops.cpp): one dispatch, not 3."""
        if gate_up.device.type != "cpu":
            return super().silu_mul(gate_up)
        return torch.ops.layerserve.silu_mul(gate_up)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """torch_ops.rms_norm's bits in one call of the extension (csrc/small_ops.cpp)."""
        if x.device.type != "cpu":
            return super().rms_norm(x, weight, eps)
        return torch.ops.layerserve.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x, then rms_norm: one call of the extension, not an add and a norm."""
        if x.device.type != "cpu":
            return super().add_rms_norm(x, residual, weight, eps)
        return torch.ops.layerserve.add_rms_norm_(residual, x, weight, eps)

    def apply_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """torch_ops.apply_rope's values bit for bit, q and k rotated in place in one call of
        the extension (csrc/rope.cpp) instead of 12 torch ops; the torch path off the CPU."""
        if q.device.type != "cpu":
            return super().apply_rope(q, k, positions, rotary)
        torch.ops.layerserve.rope_(q, k, *rotary)
        return q, k

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
        """apply_rope and write_kv above as one op (csrc/rope.cpp: rope_write_kv_), the same
        bits: one dispatch a layer, not two; the two calls where either would not take it. A
        slot out of range is refused after q and k are rotated, before the cache is written."""
        if q.device.type != "cpu" or not _writes_directly(cache, k, v):
            return super().rope_write_kv(cache, layer, q, k, v, rotary, attn)
        k_flat, v_flat, *scales = cache.flat_layer(layer)
        op = torch.ops.layerserve.rope_write_kv_
        op(q, k, v, *rotary, k_flat, v_flat, attn.slot_mapping, *scales)
        return q

    def paged_attention(
        self,
        q: torch.Tensor,
        layer_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        window: int | None = None,
    ) -> torch.Tensor:
        """q [T, H, D] over K/V [num_blocks, block_size, Hkv, D] (new K/V written; an int8
        cache's scales after them) -> [T, H, D]."""
        if attn.context_lens_device is None:  # laid out for another device: the torch path
            return super().paged_attention(q, layer_cache, attn, window)
        k_cache, v_cache, *scales = layer_cache
        return native_paged_attention(
            q, k_cache, v_cache, attn.query_start, attn.context_lens_device, attn.block_tables,
            window, self.avx512_bf16, *scales,
        )  # fmt: skip


def _writes_directly(cache: PagedKVCache, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the extension's write ops take k and v as they are: in the cache's dtype, or
    into an int8 cache (they quantize)."""
    return cache.quantized or k.dtype == v.dtype == cache.dtype


def native_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    window: int | None = None,
    avx512_bf16: bool = True,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The extension's op (loaded by cpu_attention_ext.load()) with SDPA's 1/sqrt(D) scale.

    q [T, H, D]; caches [num_blocks, block_size, Hkv, D]; query_start [S + 1], context_lens
    [S], block_tables [S, max_blocks] int64 -> [T, H, D] in q's dtype, computed in float32.
    bf16 caches are read as they are, scores by AVX512-BF16 dot products, where the build has
    them (has_avx512_bf16) unless avx512_bf16 is False (K/V rows widened to float32 copies
    first, as in issue 18): the same exact products, the score sums in another order. int8
    caches come with their scales [num_blocks, block_size, Hkv]; a decode over them runs in
    int16 steps where the build has VNNI or AVX2 (has_int16_queries) unless avx512_bf16 is False."""
    dtype = q.dtype  # a no-op .to() still costs a dispatch per layer: skipped when equal
    same = dtype == k_cache.dtype or k_scale is not None
    out = torch.ops.layerserve.paged_attention(
        q if same else q.to(k_cache.dtype), k_cache, v_cache, query_start, context_lens,
        block_tables, window or 0, 1.0 / math.sqrt(q.shape[-1]), avx512_bf16, k_scale, v_scale,
    )  # fmt: skip
    return out if out.dtype == dtype else out.to(dtype)


def has_avx512_bf16() -> bool:
    """Whether the loaded extension has the AVX512-BF16 passes (built on a CPU with them)."""
    return bool(torch.ops.layerserve.has_avx512_bf16())


def has_int16_queries() -> bool:
    """Whether the loaded extension runs a decode over an int8 cache in int16 steps
    (AVX512-VNNI, or AVX2's VPMADDWD with the same bits): each query head's row rounded to
    steps of max|q| / 32767 against the int8 keys, and each chunk of 16 keys' weights (p x the
    value's scale) to steps of the chunk's largest / 32767 against the int8 values, the
    products summed exactly in int32; unless avx512_bf16 is False (float32 arithmetic on the
    widened rows)."""
    return bool(torch.ops.layerserve.has_int16_queries())
