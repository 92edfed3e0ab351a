"""Weight-only int4, group-wise: 4-bit values 0..15 with a scale and an offset per group of 32
input columns, w = q * scale + offset (GGUF's Q4_0 and Q4_1 exactly, gguf_quant.py; or a float
weight quantized min/max per group, --quantization int4). Int4Weight is the QuantizedWeight of
this format; how it computes F.linear is an Int4Kernel chosen once, when the weight is made.

It keeps the values in one of two pairs of forms, by how they are computed:
- a float32 weight on the CPU, when the C++ extension is built: by default (integer sums with
  AVX512-VNNI or AVX2) the layout of int8_activations.py's ops, which quantize the activations
  to int16 per 32 columns and sum in int32 (batch-invariant; "int8act" by name: int8); else, or
  asked for as "q4_linear", the nibbles block-transposed for torch.ops.layerserve.q4_linear
  (csrc/q4_matmul.cpp, pack_q4_columns) with float16 (or float32) scale/offset pairs, 0.625
  bytes a weight, summing in float32. Either op computes every row count;
- otherwise, on the CPU, torch's int4 tile layout (_convert_weight_to_int4pack_for_cpu) with
  its scales_and_zeros [groups, out, 2], which computes w = (q - 8) * scale + zero: zero is
  offset + 8 * scale (Q4_0: 0; Q4_1: m + 8d), computed in float32 and rounded to the kernel's
  dtype (bfloat16 for float32 activations: 8 bits of mantissa); beside it two nibbles a byte
  [out, in / 2] (column 2j low, 2j + 1 high), which the dequantize-then-GEMM kernel and
  embedding lookups unpack (one byte a weight in all)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from services.worker.layers import int8_activations as int_act
from services.worker.layers.gguf_quant import GROUP_SIZE, GroupQuant
from services.worker.layers.quantized_weight import QuantizedWeight

# Above this many activation rows, dequantize-then-GEMM instead of int4pack on the CPU.
# Measured (one 3072 x 576 weight, 1 thread, bfloat16 activations; docs/benchmarks.md, "4-bit
# weights"): int4pack 0.14 / 3.2 / 13.4 ms at 1 / 16 / 64 rows, dequantize-then-GEMM 15-18 ms
# at all three (the unpacking dominates), float32 GEMM 1.3 / 6.1 / 17 ms: int4pack wins
# through 64 rows; dequantize pays only for prefill chunks of hundreds of tokens.
INT4PACK_MAX_ROWS = 256
# --activations float32 (or no AVX2): the C++ op (Q4LinearOp) at every row count, float32 sums
# of the file's values as the float32 reference's GEMM (int4pack's bfloat16 activations parted
# greedy text in 3-4 of 24 prompts); 0.4-0.5x float32 F.linear's time at 16-1024 rows.
Q4_BLOCK_ROWS = 64  # output rows a block of the op's layout (csrc/q4_matmul.cpp)
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


class Q4LinearOp:
    """torch.ops.layerserve.q4_linear (csrc/q4_matmul.cpp): float32 activations in and out,
    every product and sum in float32, the weight in the op's own layout (pack_q4_columns), any
    number of rows. Only for float32 weights on the CPU when the extension is built
    (int4_kernel checks both)."""

    name = "q4_linear"

    def __call__(self, x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
        op, rows = torch.ops.layerserve.q4_linear, weight.out_features
        if x.dim() == 2 and x.is_contiguous():  # the model's [T, d]: no reshapes to dispatch
            return op(x, weight.packed, weight.pairs, rows)
        out = op(x.reshape(-1, x.shape[-1]).contiguous(), weight.packed, weight.pairs, rows)
        return out.reshape(*x.shape[:-1], rows)


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


INT4PACK, DEQUANT, TRITON, Q4_OP = Int4PackMM(), DequantMM(), TritonMM(), Q4LinearOp()
INT4_KERNELS: dict[str, Int4Kernel] = {"int4pack": INT4PACK, "dequant": DEQUANT}
# CUDA: the Triton kernel for decode-sized batches, cuBLAS on a dequantized copy above. The
# switch is a guess until the GPU check measures it (kernels/int4_matmul_check.py).
TRITON_MAX_ROWS = 16


# AUTO_FLOAT32: "auto" for float32 weights where the extension sums integers with AVX512-VNNI or
# AVX2 is int16act: greedy text and perplexity as float32 dense's, faster at every row count,
# batch-invariant (measured in docs/benchmarks.md, "int16 activations"; on AVX2 alone the
# float32 op is 5-13x slower still). int8act costs quality: asked for by name only.


def int4_kernel(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Int4Kernel:
    """The kernel `name` names; "auto" (or an int8 kernel's name): on the CPU, for float32
    weights, int16act where the extension has VNNI or AVX2 (AUTO_FLOAT32), else the float32
    op; other dtypes int4pack up to INT4PACK_MAX_ROWS rows, dequantize-then-GEMM above; on
    CUDA the Triton kernel up to TRITON_MAX_ROWS rows, dequantize-then-GEMM above."""
    if name == Q4_OP.name:  # asked for by name (--activations float32)
        if device.type != "cpu" or dtype != torch.float32 or not q4_op_available():
            raise ValueError("the q4_linear kernel needs float32 on the CPU and the C++ extension")
        return Q4_OP
    if name in int_act.INT_ACTIVATION_KERNELS:
        if device.type != "cpu" or dtype != torch.float32 or not int_act.op_available(name):
            raise ValueError(f"the {name} kernel needs float32 on the CPU and the C++ extension")
        return int_act.INT_ACTIVATION_KERNELS[name]
    if device.type != "cpu":
        return DEQUANT if name == "dequant" else ByRows(TRITON, DEQUANT, TRITON_MAX_ROWS)
    if name in INT4_KERNELS:
        return INT4_KERNELS[name]
    if dtype == torch.float32 and int_act.simd_built():
        return int_act.INT16ACT  # see AUTO_FLOAT32 above
    if dtype == torch.float32 and q4_op_available():
        return Q4_OP
    return ByRows(INT4PACK, DEQUANT, INT4PACK_MAX_ROWS)


def q4_op_available() -> bool:
    """Whether the C++ extension with torch.ops.layerserve.q4_linear is built and loaded."""
    from services.worker.layers import cpu_attention_ext

    return cpu_attention_ext.load() and hasattr(torch.ops.layerserve, "q4_linear")


class Int4Weight(QuantizedWeight):
    """A linear weight [out, in] held as 4-bit values with a scale and offset per 32 columns.

    With the C++ op (a float32 weight on the CPU, Q4LinearOp), the nibbles, scales and offsets
    are held only in the op's layout (packed, pairs: 0.625 bytes a weight for a GGUF's float16
    scales) and the properties below read them back from it; int4pack's tiles are not made, as
    int4pack never runs for it. Only dequantized() and embedding lookups pay for the transposes."""

    out_features: int
    packed: torch.Tensor  # uint8 [ceil(out / 64), in / 2, 64] (Q4LinearOp; else empty)
    pairs: torch.Tensor  # [ceil(out / 64), in / 32, 2, 64] scale, offset (Q4LinearOp; else empty)
    tiles: torch.Tensor  # the CPU int4pack layout (empty off the CPU and with the op)
    scales_and_zeros: torch.Tensor  # [in / 32, out, 2], compute dtype (as tiles)
    kernel: Int4Kernel
    op_rows: int  # linear() calls the C++ op itself up to this many rows (-1: never)
    _op: Callable[..., torch.Tensor]  # that op: q4_linear, or q4_q16_linear / q4_q8_linear
    activations: str  # what that op multiplies: "float32" (q4_linear), "int16", "int8"

    @staticmethod
    def __new__(cls, groups: GroupQuant, dtype: torch.dtype, kernel: str = "auto") -> Int4Weight:
        if groups.bits != 4 or groups.q.shape[1] % GROUP_SIZE:
            raise ValueError("expected 4-bit groups of 32 over [out, in]")
        device = groups.q.device
        nibbles = pack_nibbles(groups.q)
        chosen = int4_kernel(kernel, device, dtype)
        empty = torch.empty(0, device=device)
        integer = isinstance(chosen, int_act.IntActivationsOp)
        if chosen is Q4_OP or integer:
            if integer:
                layout = int_act.pack_q4_q8(groups.q, groups.scale, groups.offset)
            else:
                layout = pack_q4_columns(nibbles, groups.scale, groups.offset)
            weight = QuantizedWeight._wrap(cls, layout[0], dtype)
            weight.packed, weight.pairs = layout
            weight._op = chosen.op if integer else torch.ops.layerserve.q4_linear
            weight.activations = int_act.activations_of(chosen)
            weight._nibbles = weight._scale = weight._offset = None  # read back from packed
            weight.op_rows = sys.maxsize  # every row count
        else:
            weight = QuantizedWeight._wrap(cls, nibbles, dtype)
            weight.packed = weight.pairs = empty
            weight._nibbles = nibbles
            weight._scale = groups.scale.to(dtype).contiguous()
            weight._offset = groups.offset.to(dtype).contiguous()
            weight.op_rows = -1
            weight.activations = "float32"
        weight.out_features, weight.kernel = groups.q.shape[0], chosen
        weight.tiles = weight.scales_and_zeros = empty
        if device.type == "cpu" and weight.op_rows < 0:  # int4pack's layout, where it may run
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

    @property
    def nibbles(self) -> torch.Tensor:
        """uint8 [out, in / 2], two a byte (pack_nibbles)."""
        if self._nibbles is not None:
            return self._nibbles
        if isinstance(self.kernel, int_act.IntActivationsOp):
            return pack_nibbles(int_act.unpack_q4_q8(self.packed, self.pairs, self.out_features)[0])
        blocks, half, width = self.packed.shape
        return self.packed.transpose(1, 2).reshape(blocks * width, half)[: self.out_features]

    @property
    def scale(self) -> torch.Tensor:
        """[out, in / 32] in the compute dtype."""
        return self._scale if self._scale is not None else self._pair(0)

    @property
    def offset(self) -> torch.Tensor:
        """[out, in / 32] in the compute dtype."""
        return self._offset if self._offset is not None else self._pair(1)

    def _pair(self, index: int) -> torch.Tensor:
        if isinstance(self.kernel, int_act.IntActivationsOp):
            values = int_act.unpack_q4_q8(self.packed, self.pairs, self.out_features)[1 + index]
            return values.to(self.compute_dtype)
        blocks, groups, _, width = self.pairs.shape
        values = self.pairs[:, :, index].transpose(1, 2).reshape(blocks * width, groups)
        return values[: self.out_features].to(self.compute_dtype)

    def __repr__(self, **kwargs: Any) -> str:
        shape = (self.out_features, self.nibbles.shape[1] * 2)
        return f"Int4Weight(shape={shape}, kernel={self.kernel.name})"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # A decode step's 4-bit linears (120 a step for SmolLM2) call the op from here, what
        # Q4LinearOp would do, without its Python frame and checks.
        if x.dim() == 2 and x.shape[0] <= self.op_rows and bias is None and x.is_contiguous():
            return self._op(x, self.packed, self.pairs, self.out_features)
        out = self.kernel(x, self)
        return out if bias is None else out + bias

    def direct_linear(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
        # The op itself, its weight arguments bound: linear()'s first branch without its frame.
        if self.op_rows < 0:
            return super().direct_linear()
        op, packed, pairs, rows = (
            self._op,
            self.packed,
            self.pairs,
            self.out_features,
        )
        return (lambda x: op(x, packed, pairs, rows)), self.op_rows

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        nibbles, scale, offset = self.nibbles, self.scale, self.offset  # read back once
        return _dequantize(nibbles[ids], scale[ids], offset[ids])

    def dequantized(self) -> torch.Tensor:
        return _dequantize(self.nibbles, self.scale, self.offset)

    def stored_tensors(self) -> list[torch.Tensor]:
        held = [self._nibbles, self._scale, self._offset, self.packed, self.pairs]
        return [t for t in held if t is not None] + [self.tiles, self.scales_and_zeros]


def pack_q4_columns(
    nibbles: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The C++ op's layout (csrc/q4_matmul.cpp), output rows in blocks of 64 (the last padded
    with zero rows): nibbles [out, in / 2] -> packed [blocks, in / 2, 64], byte i of column
    pair p holding row i's (so a call reads the weight as one stream, a cache line a column
    pair); scale and offset [out, groups] -> pairs [blocks, groups, 2, 64], float16 where every
    value is exactly a float16 (GGUF's d and m are: 0.625 bytes a weight read, not 0.75)."""
    rows, half = nibbles.shape
    blocks = -(-rows // Q4_BLOCK_ROWS)
    pad = blocks * Q4_BLOCK_ROWS - rows
    padded = F.pad(nibbles, (0, 0, 0, pad)).view(blocks, Q4_BLOCK_ROWS, half)
    packed = padded.transpose(1, 2).contiguous()
    both = F.pad(torch.stack([scale.float(), offset.float()], dim=1), (0, 0, 0, 0, 0, pad))
    pairs = both.view(blocks, Q4_BLOCK_ROWS, 2, -1).permute(0, 3, 2, 1).contiguous()
    halves = pairs.half()
    return packed, (halves if torch.equal(halves.float(), pairs) else pairs)


def _dequantize(nibbles: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """nibbles [..., in / 2], scale and offset [..., in / 32] -> [..., in] in scale's dtype."""
    q = unpack_nibbles(nibbles).unflatten(-1, (scale.shape[-1], GROUP_SIZE))
    w = q.to(scale.dtype) * scale[..., None] + offset[..., None]
    return w.flatten(-2)
