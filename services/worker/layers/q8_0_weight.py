"""GGUF's Q8_0 kept as the file stores it: int8 values with one scale per 32 input columns,
w = d * q. Q8_0Weight is the QuantizedWeight (quantized_weight.py) of this format, made for a
float32 model on the CPU, where it serves a tied embedding table (lookups dequantize the rows
they read) and the output head (torch.ops.layerserve.q8_0_linear, csrc/q8_0_matmul.cpp, which
reads the 1.06 bytes a weight once per call instead of float32's 4).

The values are the file's exactly: float16 d times an int8 q is exact in float32, so a lookup
gives the float loader's rows bit for bit and the head differs from the float32 GEMM only in
summation order.

With activations "int8" or "int16" (the 4-bit weights' "int8act" and "int16act" kernels,
int8_activations.py) the head quantizes its activations to that type per 32 columns as the
linears do and sums in int32 (torch.ops.layerserve.q8_0_q8_linear, q8_0_q16_linear) at every
row count: batch-invariant; int8 is 0.15-0.6x the float32 op's time from 1 to 64 rows. It holds
that op's layout beside the int8 table the lookups read."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from services.worker.layers.gguf_quant import GROUP_SIZE, GroupQuant
from services.worker.layers.int8_activations import HEAD_OPS, UNIT_ROWS, pack_q8_0_q8
from services.worker.layers.quantized_weight import QuantizedWeight

# Above this many activation rows the op's loop (8 rows a pass over each weight row) loses to
# BLAS on dequantized slices. SmolLM2's head (49152 x 576), thread CPU time, 1 thread: op 9.8 /
# 35 / 69 / 140 ms at 16 / 32 / 64 / 128 rows, slices 21 / 32 / 51 / 90 (a 64-stream decode step
# takes the head at 64 rows).
Q8_0_OP_MAX_ROWS = 32
# Output rows dequantized at a time above it: a slice (2048 x 576 float32, 4.5 MB) is reused from
# the allocator's cache, where the whole head dequantized at once (113 MB) was a fresh mapping
# each call: ~115 ms of page faults, 150 ms at 64 rows against the slices' 51.
DEQUANTIZED_SLICE_ROWS = 2048


def q8_0_op_available() -> bool:
    """Whether the C++ extension with torch.ops.layerserve.q8_0_linear is built and loaded."""
    from services.worker.layers import cpu_attention_ext

    return cpu_attention_ext.load() and hasattr(torch.ops.layerserve, "q8_0_linear")


class Q8_0Weight(QuantizedWeight):
    """A float32 weight [out, in] held as int8 q [out, in] and float32 scales d [out, in / 32]."""

    qweight: torch.Tensor | None  # the same int8 storage as a plain tensor, for the op
    scale: torch.Tensor | None
    packed: torch.Tensor | None  # the integer ops' layout, with activations "int8" or "int16"
    packed_scales: torch.Tensor | None
    activations: str  # "float32", "int16" or "int8"
    out_features: int

    @staticmethod
    def __new__(cls, groups: GroupQuant, activations: str = "float32") -> Q8_0Weight:
        q, scale = groups.q, groups.scale
        if groups.bits != 8 or q.dtype != torch.int8 or q.shape[1] != scale.shape[1] * GROUP_SIZE:
            raise ValueError("expected Q8_0 groups: int8 [out, in] and [out, in / 32] scales")
        if activations != "float32" and activations not in HEAD_OPS:
            raise ValueError(f"activations float32, int16 or int8, got {activations!r}")
        if activations in HEAD_OPS:  # only the ops' layout: lookups read their rows from it
            packed, packed_scales = pack_q8_0_q8(q, scale)
            weight = QuantizedWeight._wrap(cls, packed, torch.float32)
            weight.packed, weight.packed_scales = packed, packed_scales
            weight.qweight = weight.scale = None
        else:
            q = q.contiguous()
            weight = QuantizedWeight._wrap(cls, q, torch.float32)
            weight.qweight, weight.scale = q, scale.float().contiguous()
            weight.packed = weight.packed_scales = None
        weight.activations, weight.out_features = activations, q.shape[0]
        return weight

    def __init__(self, groups: GroupQuant, activations: str = "float32") -> None:
        pass  # all set in __new__; torch.Tensor.__init__ takes no arguments

    def __repr__(self, **kwargs: Any) -> str:
        columns = self.packed.shape[1] * 4 if self.packed is not None else self.qweight.shape[1]
        return f"Q8_0Weight(shape={(self.out_features, columns)}, activations={self.activations})"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.packed is not None:
            op = getattr(torch.ops.layerserve, HEAD_OPS[self.activations])
            flat = flat.to(torch.float32).contiguous()
            out = op(flat, self.packed, self.packed_scales, self.out_features).to(x.dtype)
        elif flat.shape[0] <= Q8_0_OP_MAX_ROWS and x.dtype == torch.float32:
            out = torch.ops.layerserve.q8_0_linear(flat.contiguous(), self.qweight, self.scale)
        else:
            out = self._sliced_linear(flat)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias

    def _sliced_linear(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]: dequantize-then-GEMM, DEQUANTIZED_SLICE_ROWS weight rows at a
        time."""
        rows = self.qweight.shape[0]
        out = x.new_empty(x.shape[0], rows)
        for start in range(0, rows, DEQUANTIZED_SLICE_ROWS):
            end = start + DEQUANTIZED_SLICE_ROWS
            weight = _dequantize(self.qweight[start:end], self.scale[start:end]).to(x.dtype)
            out[:, start:end] = F.linear(x, weight)
        return out

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and hasattr(torch.ops.layerserve, "q8_0_rows"):
            rows = torch.ops.layerserve.q8_0_rows(
                self.packed, self.packed_scales, ids.reshape(-1).long(), self.out_features
            )  # one op (csrc/q8_0_q8_matmul.cpp), the same values as below
            return rows.view(*ids.shape, rows.shape[-1])
        return _dequantize(*self._rows(ids))

    def dequantized(self) -> torch.Tensor:
        return _dequantize(*self._rows(None))

    def _rows(self, ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [..., in], d float32 [..., in / 32]) of the rows `ids` (None: all of them),
        from the ops' layout where that is all the weight holds (pack_q8_0_q8: 32 rows a unit,
        each row's 4 columns at a time, stored q + 128)."""
        if self.packed is None:
            if ids is None:
                return self.qweight, self.scale
            return self.qweight[ids], self.scale[ids]
        if ids is None:
            ids = torch.arange(self.out_features, device=self.packed.device)
        unit, lane = ids // UNIT_ROWS, ids % UNIT_ROWS
        units, chunks, _ = self.packed.shape
        by_row = self.packed.view(units, chunks, UNIT_ROWS, 4).permute(0, 2, 1, 3)
        q = (by_row[unit, lane].to(torch.int16) - 128).to(torch.int8).flatten(-2)
        scale = self.packed_scales.permute(0, 2, 1)[unit, lane].float()
        return q, scale

    def stored_tensors(self) -> list[torch.Tensor]:
        if self.packed is not None:
            return [self.packed, self.packed_scales]
        return [self.qweight, self.scale]


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 [..., in], scales [..., in / 32] -> float32 [..., in] (exact: d * q fits float32)."""
    groups = q.float().unflatten(-1, (scale.shape[-1], GROUP_SIZE))
    return (groups * scale.unsqueeze(-1)).flatten(-2)
