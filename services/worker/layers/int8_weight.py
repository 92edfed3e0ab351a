"""Weight-only int8: int8 values with one scale per output channel (symmetric absmax per row),
activations in the compute dtype. Int8Weight is the QuantizedWeight (quantized_weight.py) of
this format; how it computes F.linear is an Int8Kernel chosen once, when the weight is made:
int8_kernel() turns a kernel's name into the object ("auto", what the worker uses, into the one
measured faster on that device and dtype, per batch size where that differs: ByRows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from services.worker.layers.quantized_weight import QuantizedWeight

# int8pack's last batch (activation rows) on the CPU with bfloat16 activations: measured switch
# point (benchmarks/quantization.py --kernel-sweep; docs/benchmarks.md, "Issue 18").
INT8PACK_MAX_ROWS = 16
_INT8_MAX = 127  # symmetric: -127..127, so that -q is always representable


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 [out, in], scale [out] in `dtype`), symmetric absmax per row.

    The scale is rounded to `dtype` before the values are, so that q * scale (what the matmul
    uses) is within scale / 2 of weight element by element. An all-zero row gets q = 0."""
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1)
    scale = (absmax / _INT8_MAX).to(dtype).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # zero rows: any scale works
    q = torch.round(w / scale[:, None]).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return q, scale.to(dtype)


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 [out, in], scale [out] -> [out, in] in scale's dtype (one pass: int8 * float)."""
    return qweight * scale[:, None]


class Int8Kernel(Protocol):
    name: str  # what quantize_model(kernel=...) and the benchmarks call it

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x [..., in] (compute dtype) -> [..., out] = x @ (qweight * scale[:, None]).T."""
        ...


class Int8PackMM:
    """torch._weight_int8pack_mm, which reads the int8 weight directly."""

    name = "int8pack"

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.is_contiguous():  # the model's [T, d]: no reshapes to dispatch
            return torch._weight_int8pack_mm(x, qweight, scale)
        flat = x.reshape(-1, x.shape[-1])
        out = torch._weight_int8pack_mm(flat.contiguous(), qweight, scale)
        return out.reshape(*x.shape[:-1], qweight.shape[0])


class DequantMM:
    """The weight converted to the compute dtype for this call, the dtype's own GEMM (BLAS,
    cuBLAS), then the scale applied to the [..., out] result, which is cheaper than to
    [out, in] and exact enough; float16 scales the weight instead, as x @ q.T (|q| <= 127)
    could overflow."""

    name = "dequant"

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float16:
            return F.linear(x, dequantize_int8(qweight, scale))
        return F.linear(x, qweight.to(x.dtype)) * scale


@dataclass(frozen=True, slots=True)
class ByRows:
    """`small` for calls of up to max_rows activation rows, `large` above."""

    small: Int8Kernel
    large: Int8Kernel
    max_rows: int
    name: str = "auto"

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        kernel = self.small if rows <= self.max_rows else self.large
        return kernel(x, qweight, scale)


INT8PACK, DEQUANT = Int8PackMM(), DequantMM()
INT8_KERNELS: dict[str, Int8Kernel] = {"int8pack": INT8PACK, "dequant": DEQUANT}
KERNEL_CHOICES = ("auto", *INT8_KERNELS)  # how an Int8Weight computes F.linear


def int8_kernel(name: str, device: torch.device, dtype: torch.dtype) -> Int8Kernel:
    """The kernel `name` names; "auto": the faster one for activations of `dtype` on `device`,
    as benchmarks/quantization.py measured both (docs/benchmarks.md, "Issue 18" and
    "Weight-only int8").

    On the CPU with bfloat16/float16 activations, int8pack up to INT8PACK_MAX_ROWS rows: a small
    batch is bound by reading the weights, and int8pack reads half of bfloat16's bytes; above
    it the dtype's own GEMM on a dequantized copy wins. Never with float32 activations, where
    int8pack has no fast path (2-20x slower than float32 BLAS). On CUDA, cuBLAS on a
    dequantized copy; torch's CUDA int8pack kernel is unmeasured here."""
    if name in INT8_KERNELS:
        return INT8_KERNELS[name]
    if name != "auto":
        raise ValueError(f"unknown int8 kernel {name!r}; expected one of {KERNEL_CHOICES}")
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return ByRows(INT8PACK, DEQUANT, INT8PACK_MAX_ROWS)
    return DEQUANT


def int8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    kernel: Int8Kernel = DEQUANT,
) -> torch.Tensor:
    """x [..., in] (compute dtype) -> [..., out] = x @ (qweight * scale[:, None]).T + bias."""
    out = kernel(x, qweight, scale)
    return out if bias is None else out + bias


class Int8Weight(QuantizedWeight):
    """A linear weight held as int8 [out, in] plus `scale` [out] in the compute dtype."""

    qweight: torch.Tensor  # the same int8 storage as a plain tensor, for the kernels
    scale: torch.Tensor
    kernel: Int8Kernel

    @staticmethod
    def __new__(cls, qweight: torch.Tensor, scale: torch.Tensor, kernel: Int8Kernel) -> Int8Weight:
        if qweight.dtype != torch.int8 or scale.shape != qweight.shape[:1]:
            raise ValueError("expected int8 [out, in] values and a [out] scale")
        weight = QuantizedWeight._wrap(cls, qweight, scale.dtype)
        weight.qweight, weight.scale, weight.kernel = qweight, scale, kernel
        return weight

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, kernel: Int8Kernel) -> None:
        pass  # all set in __new__; torch.Tensor.__init__ takes no arguments

    @classmethod
    def quantize(cls, weight: torch.Tensor, kernel: str = "auto") -> Int8Weight:
        """A float weight [out, in] quantized, computing with the kernel `kernel` names for its
        device and dtype."""
        chosen = int8_kernel(kernel, weight.device, weight.dtype)
        return cls(*quantize_int8(weight, weight.dtype), chosen)

    def __repr__(self, **kwargs: Any) -> str:
        return f"Int8Weight(shape={tuple(self.qweight.shape)}, kernel={self.kernel.name})"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, bias, self.kernel)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        # rows [..., d]: each row scaled by its own channel's scale
        return self.qweight[ids].to(self.scale.dtype) * self.scale[ids].unsqueeze(-1)

    def dequantized(self) -> torch.Tensor:
        return dequantize_int8(self.qweight, self.scale)

    def stored_tensors(self) -> list[torch.Tensor]:
        return [self.qweight, self.scale]
