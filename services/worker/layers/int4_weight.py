"""Weight-only int4, group-wise: 4-bit values 0..15 with a scale and an offset per group of 32
input columns, w = q * scale + offset (GGUF's Q4_0 and Q4_1 exactly, gguf_quant.py; or a float
weight quantized min/max per group, --quantization int4). Int4Weight is the QuantizedWeight of
this format; how it computes F.linear is an Int4Kernel chosen once, when the weight is made.

It keeps two forms of the same values (one byte a weight in all, against bfloat16's two):
- on the CPU, torch's int4 tile layout (_convert_weight_to_int4pack_for_cpu) with its
  scales_and_zeros [groups, out, 2], which computes w = (q - 8) * scale + zero: zero is
  offset + 8 * scale (Q4_0: 0; Q4_1: m + 8d), computed in float32 and rounded to the kernel's
  dtype (bfloat16 for float32 activations: 8 bits of mantissa against float16 d's 11);
- two nibbles a byte [out, in / 2] (column 2j low, 2j + 1 high), which the dequantize-then-GEMM
  kernel and embedding lookups unpack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from services.worker.layers.gguf_quant import GROUP_SIZE, GroupQuant
from services.worker.layers.quantized_weight import QuantizedWeight

# Above this many activation rows, dequantize-then-GEMM instead of int4pack on the CPU.
# Measured (one 3072 x 576 weight, 1 thread, bfloat16 activations; docs/benchmarks.md, "4-bit
# weights"): int4pack 0.14 / 3.2 / 13.4 ms at 1 / 16 / 64 rows, dequantize-then-GEMM 15-18 ms
# at all three (the unpacking dominates), float32 GEMM 1.3 / 6.1 / 17 ms: int4pack wins
# through 64 rows; dequantize pays only for prefill chunks of hundreds of tokens.
INT4PACK_MAX_ROWS = 256
_INNER_K_TILES = 2  # int4pack's tile: 2 x 16 input columns (its K must divide by 32)


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> GroupQuant:
    """weight [out, in] -> GroupQuant (asymmetric min/max per group: scale = (max - min) / 15,
    offset = min, q = round((w - min) / scale)), so each w is within scale / 2 of q * scale +
    offset. A constant group gets scale 1 and q = 0."""
    if weight.dim() != 2 or weight.shape[1] % group_size:
        raise ValueError(
            f"expected [out, in] with in divisible by {group_size}, got {weight.shape}"
        )
    w = weight.detach().float().reshape(weight.shape[0], -1, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((w - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    return GroupQuant(q.reshape(weight.shape), scale, low, bits=4)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 0..15 [out, in] -> uint8 [out, in / 2]: column 2j in the low nibble, 2j+1 high."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """pack_nibbles' inverse: uint8 [..., in / 2] -> uint8 0..15 [..., in]."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


class Int4Kernel(Protocol):
    name: str  # what quantize_model(kernel=...) and the benchmarks call it

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        """x [..., in] (compute dtype) -> [..., out] = x @ W.T."""
        ...


class Int4PackMM:
    """torch's CPU int4 group-wise matmul, which reads the 4-bit tiles directly. It has no fast
    path for float32 activations (measured 10-70x slower than bfloat16's at 1-64 rows), so
    float32 activations go through it as bfloat16 and come back as float32."""

    name = "int4pack"

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        pairs = weight.scales_and_zeros
        if x.dim() == 2 and x.is_contiguous():  # the model's [T, d]: no reshapes to dispatch
            flat = x if x.dtype == pairs.dtype else x.to(pairs.dtype)  # float32: through bf16
            out = torch._weight_int4pack_mm_for_cpu(flat, weight.tiles, GROUP_SIZE, pairs)
            return out if out.dtype == x.dtype else out.to(x.dtype)
        flat = x.reshape(-1, x.shape[-1]).to(pairs.dtype).contiguous()
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, weight.tiles, GROUP_SIZE, pairs)
        return out.to(x.dtype).reshape(*x.shape[:-1], weight.tiles.shape[0])


class DequantMM:
    """The weight dequantized to the compute dtype for this call, then the dtype's GEMM: what
    a large batch (prefill) wants, where the GEMM's arithmetic outweighs the conversion."""

    name = "dequant"

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        return F.linear(x, weight.dequantized())


class TritonMM:
    """The Triton int4 matmul (kernels/int4_matmul.py), reading the nibbles directly: CUDA."""

    name = "triton"

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        from services.worker.kernels.int4_matmul import int4_matmul  # imports triton

        flat = x.reshape(-1, x.shape[-1]).contiguous()
        out = int4_matmul(flat, weight.nibbles, weight.scale, weight.offset)
        return out.reshape(*x.shape[:-1], weight.nibbles.shape[0])


@dataclass(frozen=True, slots=True)
class ByRows:
    """`small` for calls of up to max_rows activation rows, `large` above."""

    small: Int4Kernel
    large: Int4Kernel
    max_rows: int
    name: str = "auto"

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        return (self.small if rows <= self.max_rows else self.large)(x, weight)


INT4PACK, DEQUANT, TRITON = Int4PackMM(), DequantMM(), TritonMM()
INT4_KERNELS: dict[str, Int4Kernel] = {"int4pack": INT4PACK, "dequant": DEQUANT}
# CUDA: the Triton kernel for decode-sized batches, cuBLAS on a dequantized copy above. The
# switch is a guess until the GPU check measures it (kernels/int4_matmul_check.py).
TRITON_MAX_ROWS = 16


def int4_kernel(name: str, device: torch.device) -> Int4Kernel:
    """The kernel `name` names ("int4pack" or "dequant" on the CPU); "auto" (or the int8
    kernel names quantize_model also accepts): int4pack up to INT4PACK_MAX_ROWS rows on the
    CPU, where a small batch is bound by reading weights, and dequantize-then-GEMM above it; on
    CUDA the Triton kernel up to TRITON_MAX_ROWS rows, dequantize-then-GEMM above."""
    if device.type != "cpu":
        return DEQUANT if name == "dequant" else ByRows(TRITON, DEQUANT, TRITON_MAX_ROWS)
    if name in INT4_KERNELS:
        return INT4_KERNELS[name]
    return ByRows(INT4PACK, DEQUANT, INT4PACK_MAX_ROWS)


class Int4Weight(QuantizedWeight):
    """A linear weight [out, in] held as 4-bit values with a scale and offset per 32 columns."""

    nibbles: torch.Tensor  # uint8 [out, in / 2]
    scale: torch.Tensor  # [out, in / 32], compute dtype
    offset: torch.Tensor  # [out, in / 32], compute dtype
    tiles: torch.Tensor  # the CPU int4pack layout (empty off the CPU)
    scales_and_zeros: torch.Tensor  # [in / 32, out, 2], compute dtype (empty off the CPU)
    kernel: Int4Kernel

    @staticmethod
    def __new__(cls, groups: GroupQuant, dtype: torch.dtype, kernel: str = "auto") -> Int4Weight:
        if groups.bits != 4 or groups.q.shape[1] % GROUP_SIZE:
            raise ValueError("expected 4-bit groups of 32 over [out, in]")
        device = groups.q.device
        nibbles = pack_nibbles(groups.q)
        weight = QuantizedWeight._wrap(cls, nibbles, dtype)
        weight.nibbles = nibbles
        weight.scale, weight.offset = groups.scale.to(dtype), groups.offset.to(dtype)
        weight.kernel = int4_kernel(kernel, device)
        weight.tiles = weight.scales_and_zeros = torch.empty(0, device=device)
        if device.type == "cpu":
            weight.tiles = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                groups.q.to(torch.int32), _INNER_K_TILES
            )
            zero = groups.offset + 8 * groups.scale  # float32: exact for GGUF's float16 d, m
            pairs = torch.stack([groups.scale.t(), zero.t()], dim=-1)  # [in / 32, out, 2]
            pair_dtype = torch.bfloat16 if dtype == torch.float32 else dtype  # see Int4PackMM
            weight.scales_and_zeros = pairs.to(pair_dtype).contiguous()
        return weight

    def __init__(self, groups: GroupQuant, dtype: torch.dtype, kernel: str = "auto") -> None:
        pass  # all set in __new__; torch.Tensor.__init__ takes no arguments

    @classmethod
    def quantize(cls, weight: torch.Tensor, kernel: str = "auto") -> Int4Weight:
        """A float weight [out, in] quantized min/max per group of 32 (quantize_int4)."""
        return cls(quantize_int4(weight), weight.dtype, kernel)

    def __repr__(self, **kwargs: Any) -> str:
        shape = (self.nibbles.shape[0], self.nibbles.shape[1] * 2)
        return f"Int4Weight(shape={shape}, kernel={self.kernel.name})"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.kernel(x, self)
        return out if bias is None else out + bias

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return _dequantize(self.nibbles[ids], self.scale[ids], self.offset[ids])

    def dequantized(self) -> torch.Tensor:
        return _dequantize(self.nibbles, self.scale, self.offset)

    def stored_tensors(self) -> list[torch.Tensor]:
        return [self.nibbles, self.scale, self.offset, self.tiles, self.scales_and_zeros]


def _dequantize(nibbles: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """nibbles [..., in / 2], scale and offset [..., in / 32] -> [..., in] in scale's dtype."""
    q = unpack_nibbles(nibbles).unflatten(-1, (scale.shape[-1], GROUP_SIZE))
    w = q.to(scale.dtype) * scale[..., None] + offset[..., None]
    return w.flatten(-2)
