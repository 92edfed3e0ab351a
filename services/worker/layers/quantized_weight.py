"""The seam for weights kept in a compact format (int8 today; GGUF's 4-bit blocks next): a
QuantizedWeight stands for a float linear weight [out, in] and computes F.linear itself, so the
model code, which calls F.linear on bare 2-D weights (fused.py), does not change.

A format is one subclass: how it stores the values (its own tensor data and fields), how it
computes a linear (linear(), with a kernel the subclass chose once, when the weight was made)
and what float weight it stands for (dequantized()). Nothing compares a format or kernel name
per call."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map_only


class QuantizedWeight(torch.Tensor):
    """A linear weight in a compact format, standing for the float weight [out, in] in
    `compute_dtype`: dtype is that dtype, and any op but F.linear and F.embedding (w.float(),
    x @ w.T, w.to(device), ...) sees dequantized(), so code that reads the values is slower but
    never wrong. Its own data is what it holds: shape, device, element_size() and storage
    describe the stored values. Subclasses build it with _wrap() in __new__."""

    compute_dtype: torch.dtype

    @staticmethod
    def _wrap(cls: type, stored: torch.Tensor, compute_dtype: torch.dtype) -> Any:
        weight = torch.Tensor._make_subclass(cls, stored, False)
        weight.compute_dtype = compute_dtype
        return weight

    @classmethod
    def quantize(cls, weight: torch.Tensor, kernel: str = "auto") -> QuantizedWeight:
        """A float weight [out, in] in this format, computing with the kernel `kernel` names
        (chosen here, once) for the weight's device and dtype."""
        raise NotImplementedError

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] (compute dtype) -> x @ W.T + bias [..., out]."""
        raise NotImplementedError

    def direct_linear(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
        """(f, rows): f(x) == self.linear(x, None) for x [T, in] contiguous in the compute dtype
        with T <= rows, with as few Python frames as the format can (model/flat_layers.py
        calls it ~120 times a batch-1 step)."""
        return functools.partial(self.linear, bias=None), sys.maxsize

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> rows [..., in] of W (a tied embedding table read by row)."""
        return F.embedding(ids, self.dequantized())

    def dequantized(self) -> torch.Tensor:
        """The float weight [out, in] in the compute dtype (a new tensor each call)."""
        raise NotImplementedError

    def stored_tensors(self) -> list[torch.Tensor]:
        """Every tensor the format keeps (values, scales, ...): what its memory is."""
        raise NotImplementedError

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = _linear_args(args, kwargs)
            if isinstance(weight, QuantizedWeight) and not isinstance(x, QuantizedWeight):
                return weight.linear(x, bias)
        plain_lookup = kwargs.get("max_norm") is None  # max_norm would rewrite the table
        if func is F.embedding and isinstance(args[1], QuantizedWeight) and plain_lookup:
            return args[1].embedding(args[0])
        if func is torch.Tensor.dtype.__get__:
            return args[0].compute_dtype
        if func is torch.Tensor.is_floating_point:
            return True
        if func not in _AS_STORED:
            args, kwargs = tree_map_only(QuantizedWeight, _dequantized, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


# Queries answered by the stored values themselves rather than the float weight they stand for.
_AS_STORED = frozenset(
    [getattr(torch.Tensor, name).__get__ for name in ("shape", "ndim", "device", "layout")]
    + [getattr(torch.Tensor, name).__get__ for name in ("requires_grad", "nbytes")]
    + [getattr(torch.Tensor, name) for name in ("dim", "size", "numel", "element_size")]
    + [getattr(torch.Tensor, name) for name in ("untyped_storage", "data_ptr", "stride")]
    + [torch.Tensor.is_contiguous]
)


def _linear_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    names = ("input", "weight", "bias")
    values = dict(zip(names, args, strict=False)) | kwargs
    return values["input"], values["weight"], values.get("bias")


def _dequantized(weight: QuantizedWeight) -> torch.Tensor:
    return weight.dequantized()
