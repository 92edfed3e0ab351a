"""4-bit weights times integer activations (the Int4Weight kernels "int8act" and "int16act"):
each activation row is quantized to int8 or int16 per group of 32 columns inside the op and the
products q * xq are summed exactly in int32 by AVX512-VNNI or AVX2
(torch.ops.layerserve.q4_q8_linear and q4_q16_linear, csrc/q4_q8_matmul.cpp and
csrc/int_activations.h, which state the formula and what it changes against float32 sums); int8
as llama.cpp's Q8 blocks do. Every output row is bit-identical whatever the call's row count and
thread count, so a speculative verify step (1 + k rows) gives the same logits as k + 1
single-row steps. The price is the activations' rounding: 1/254 of a group's largest |x| for
int8 (the csrc header gives its measured perplexity cost), 1/65534 for int16.

This module holds the ops' layouts (pack_q4_q8 and its inverse, pack_q8_0_q8 for the Q8_0 head),
the kernels, and the formulas in torch (reference_q4_linear, reference_q8_0_linear) that the
tests hold the ops to. It imports nothing of int4_weight.py, which imports it."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from services.worker.layers.gguf_quant import GROUP_SIZE

UNIT_ROWS = 32  # output rows a unit of the op's layout: two vectors of 16 int32 lanes
CHUNK = 8  # input columns one 4-byte lane holds: byte j = q[c + j] | q[c + 4 + j] << 4


INT8, INT16 = 127, 32767  # the activations' largest |xq|: int8, int16


class PackedQ4Q8(Protocol):
    """What the kernels read of a weight (Int4Weight made with kernel="int8act" or "int16act")."""

    packed: torch.Tensor
    pairs: torch.Tensor
    out_features: int


class IntActivationsOp:
    """torch.ops.layerserve.q4_q8_linear (int8) or q4_q16_linear (int16): float32 activations
    in and out, integer activations and int32 sums inside, the weight in the ops' layout
    (pack_q4_q8), any number of rows. Only for float32 weights on the CPU when the extension is
    built (int4_kernel checks both). `activations` names the kind ("int8", "int16"): the C++
    layer loop and the Q8_0 head take the same kind."""

    def __init__(self, name: str, activations: str, op_name: str, head_op_name: str) -> None:
        self.name, self.activations = name, activations
        self.op_name, self.head_op_name = op_name, head_op_name

    @property
    def op(self) -> torch._ops.OpOverloadPacket:
        return getattr(torch.ops.layerserve, self.op_name)

    def __call__(self, x: torch.Tensor, weight: PackedQ4Q8) -> torch.Tensor:
        op, rows = self.op, weight.out_features
        if x.dim() == 2 and x.is_contiguous():  # the model's [T, d]: no reshapes to dispatch
            return op(x, weight.packed, weight.pairs, rows)
        out = op(x.reshape(-1, x.shape[-1]).contiguous(), weight.packed, weight.pairs, rows)
        return out.reshape(*x.shape[:-1], rows)


INT8ACT = IntActivationsOp("int8act", "int8", "q4_q8_linear", "q8_0_q8_linear")
INT16ACT = IntActivationsOp("int16act", "int16", "q4_q16_linear", "q8_0_q16_linear")
INT_ACTIVATION_KERNELS = {kernel.name: kernel for kernel in (INT8ACT, INT16ACT)}
# The Q8_0 head's op for each kind: the head takes the linears' activations.
HEAD_OPS = {kernel.activations: kernel.head_op_name for kernel in (INT8ACT, INT16ACT)}


def activations_of(kernel: object) -> str:
    """What an Int4Weight kernel multiplies: "int8" or "int16" for these, else "float32"."""
    return kernel.activations if isinstance(kernel, IntActivationsOp) else "float32"


def op_available(kernel_name: str) -> bool:
    """Whether the C++ extension with that kernel's op is built and loaded."""
    from services.worker.layers import cpu_attention_ext

    op_name = INT_ACTIVATION_KERNELS[kernel_name].op_name
    return cpu_attention_ext.load() and hasattr(torch.ops.layerserve, op_name)


def instruction_set() -> str:
    """What the extension's integer sums were compiled with: "avx512_vnni", "avx2" (the same
    results by vpmaddwd) or "plain" (the same results, slower than the float32 op); "" when
    the extension is not built."""
    from services.worker.layers import cpu_attention_ext

    if not cpu_attention_ext.load():
        return ""
    return str(torch.ops.layerserve.int_activations_isa())


def amx_tiles(use: bool | None = None) -> bool:
    """Whether the integer-activation ops multiply calls of 4 rows or more on AMX tiles (the
    same bits as the vector kernel, csrc/int_activations.h); `use` turns that off or back on.
    False where the extension was built without AMX or the OS does not grant it."""
    from services.worker.layers import cpu_attention_ext

    if not cpu_attention_ext.load():
        return False
    return bool(torch.ops.layerserve.int_activations_amx(use))


def simd_built() -> bool:
    """Whether the integer-activation ops run vector integer sums (AVX512-VNNI or AVX2)."""
    return instruction_set() in ("avx512_vnni", "avx2")


def pack_q4_q8(
    q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's layout: q uint8 0..15 [out, in] -> packed uint8 [units, in / 8, 32 * 4], unit u
    holding output rows 32u..32u+31 (the last padded with zero rows), for each 8 columns c..c+7
    row i's 4 bytes q[c + j] | q[c + 4 + j] << 4; scale and offset [out, in / 32] -> pairs
    [units, in / 32, 2, 32], float16 where every value is exactly a float16 (GGUF's are)."""
    rows, cols = q.shape
    units = -(-rows // UNIT_ROWS)
    pad = units * UNIT_ROWS - rows
    chunks = F.pad(q, (0, 0, 0, pad)).view(units, UNIT_ROWS, cols // CHUNK, 2, CHUNK // 2)
    lanes = chunks[..., 0, :] | (chunks[..., 1, :] << 4)  # [units, 32, in / 8, 4]
    packed = lanes.transpose(1, 2).reshape(units, cols // CHUNK, UNIT_ROWS * 4).contiguous()
    both = F.pad(torch.stack([scale.float(), offset.float()], dim=1), (0, 0, 0, 0, 0, pad))
    pairs = both.view(units, UNIT_ROWS, 2, -1).permute(0, 3, 2, 1).contiguous()
    halves = pairs.half()
    return packed, (halves if torch.equal(halves.float(), pairs) else pairs)


def unpack_q4_q8(
    packed: torch.Tensor, pairs: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack_q4_q8's inverse: -> q uint8 [rows, in], scale and offset float32 [rows, in / 32]."""
    units, chunks, _ = packed.shape
    lanes = packed.view(units, chunks, UNIT_ROWS, 4).transpose(1, 2)  # [units, 32, in / 8, 4]
    q = torch.stack([lanes & 0x0F, lanes >> 4], dim=-2).reshape(units * UNIT_ROWS, -1)
    values = pairs.float().permute(0, 3, 2, 1).reshape(units * UNIT_ROWS, 2, -1)
    return q[:rows], values[:rows, 0], values[:rows, 1]


def quantize_activations(
    x: torch.Tensor, limit: int = INT8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x float32 [M, K] -> (xq [M, K / 32, 32] in -limit..limit as float32, d and sx [M, K /
    32]): per group d = max|x| / limit, xq = x / d rounded half to even (0 where d == 0), sx
    the group's float32 sum in column order."""
    groups = x.view(x.shape[0], -1, GROUP_SIZE)
    d = groups.abs().amax(dim=-1) / limit
    ratio = groups / torch.where(d > 0, d, 1)[..., None]
    xq = torch.where(d[..., None] > 0, torch.round(ratio), 0).clamp(-limit, limit)
    sx = torch.zeros_like(d)
    for j in range(GROUP_SIZE):  # in column order, as the op adds them
        sx = sx + groups[..., j]
    return xq, d, sx


def reference_q4_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, limit: int
) -> torch.Tensor:
    """The ops' formula in torch (limit INT8: q4_q8_linear, INT16: q4_q16_linear): x float32
    [M, K], q [N, K] in 0..15, scale and offset float32 [N, K / 32] -> [M, N] float32. A fused
    multiply-add is computed in float64 and rounded to float32 (a*b is exact in float64; the
    sum's double rounding differs from the op's single one only when it lands on a float32 tie,
    about 2^-29 of the time)."""
    xq, d, sx = quantize_activations(x, limit)
    q_groups = q.double().view(q.shape[0], -1, GROUP_SIZE)
    isum = torch.einsum("mgj,ngj->mng", xq.double(), q_groups).float()  # exact integers
    acc = torch.zeros(x.shape[0], q.shape[0])
    for g in range(d.shape[1]):
        sd = scale[None, :, g] * d[:, None, g]  # float32, rounded as the op rounds it
        acc = _fma(sd, isum[:, :, g], acc)
        acc = _fma(offset[None, :, g].expand_as(acc), sx[:, None, g].expand_as(acc), acc)
    return acc


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double() + c.double()).float()


def pack_q8_0_q8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout of torch.ops.layerserve.q8_0_q8_linear and q8_0_q16_linear
    (csrc/q8_0_q8_matmul.cpp): Q8_0's q int8 [out, in] -> packed uint8 [units, in / 4, 32 * 4],
    unit u holding output rows 32u..32u+31 (the last padded with zero rows), for each 4 columns
    row i's 4 bytes q + 128; scale [out, in / 32] -> [units, in / 32, 32], float16 where every
    value is exactly a float16."""
    rows, cols = q.shape
    units = -(-rows // UNIT_ROWS)
    pad = units * UNIT_ROWS - rows
    biased = (F.pad(q.to(torch.int16), (0, 0, 0, pad)) + 128).to(torch.uint8)
    lanes = biased.view(units, UNIT_ROWS, cols // 4, 4).transpose(1, 2)
    packed = lanes.reshape(units, cols // 4, UNIT_ROWS * 4).contiguous()
    scales = F.pad(scale.float(), (0, 0, 0, pad)).view(units, UNIT_ROWS, -1).transpose(1, 2)
    scales = scales.contiguous()
    halves = scales.half()
    return packed, (halves if torch.equal(halves.float(), scales) else scales)


def reference_q8_0_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, limit: int
) -> torch.Tensor:
    """q8_0_q8_linear's (limit INT8) or q8_0_q16_linear's (INT16) formula in torch: x float32
    [M, K], q int8 [N, K], scale float32 [N, K / 32] -> [M, N] float32 (fused multiply-adds as
    in reference_q4_linear)."""
    xq, d, _ = quantize_activations(x, limit)
    q_groups = q.double().view(q.shape[0], -1, GROUP_SIZE)
    isum = torch.einsum("mgj,ngj->mng", xq.double(), q_groups).float()  # exact integers
    acc = torch.zeros(x.shape[0], q.shape[0])
    for g in range(d.shape[1]):
        acc = _fma(scale[None, :, g] * d[:, None, g], isum[:, :, g], acc)
    return acc
