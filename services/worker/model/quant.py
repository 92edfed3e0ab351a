"""Weight-only int8 quantization: int8 weights with one scale per output channel, activations
and everything else in the compute dtype.

quantize_model() runs after loading and works on any model whose linear layers go through
F.linear, whether as bare 2-D parameters (our Llama and Gemma 3 fuse q/k/v and gate/up that
way) or inside nn.Linear: each such weight becomes an Int8Weight, a tensor that answers F.linear
itself, so the model code does not change. Embeddings, norms and the output head stay in the
compute dtype unless asked (see KEEP_IN_COMPUTE_DTYPE for why)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map_only

from services.worker.model.loaded import LoadedModel

QUANTIZATION_METHODS = ("none", "int8")  # --quantization
KERNELS = ("auto", "int8pack", "dequant")  # how an Int8Weight computes F.linear
# int8pack's last batch (activation rows) on the CPU with bfloat16 activations: measured switch
# point (benchmarks/quantization.py --kernel-sweep; docs/benchmarks.md, "Issue 18").
INT8PACK_MAX_ROWS = 16
# Kept in the compute dtype, matched against each dotted part of a parameter's name:
# - embeddings are read by row (F.embedding), not through F.linear;
# - the output head (SmolLM2's is the tied embedding, 21% of its weights) is where a weight
#   error turns straight into a different argmax. Measured (benchmarks/quantization.py, float32
#   activations): int8 head too takes the weights from 0.41x to 0.25x of float32, but greedy
#   tokens equal to float32's drop from 67% to 56% (bfloat16 alone: 70%).
KEEP_IN_COMPUTE_DTYPE = ("embed", "lm_head")
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


def int8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    kernel: str = "dequant",
) -> torch.Tensor:
    """x [..., in] (compute dtype) -> [..., out] = x @ (qweight * scale[:, None]).T + bias.

    "int8pack": torch._weight_int8pack_mm, which reads the int8 weight directly. "dequant": the
    weight converted to the compute dtype for this call, the dtype's own GEMM (BLAS, cuBLAS),
    then the scale applied to the [..., out] result, which is cheaper than to [out, in] and
    exact enough; float16 scales the weight instead, as x @ q.T (|q| <= 127) could overflow.
    "auto": kernel_for(x), this call's rows deciding."""
    if kernel == "auto":
        kernel = kernel_for(x)
    if kernel == "int8pack":
        flat = x.reshape(-1, x.shape[-1])
        out = torch._weight_int8pack_mm(flat.contiguous(), qweight, scale)
        out = out.reshape(*x.shape[:-1], qweight.shape[0])
    elif x.dtype == torch.float16:
        out = F.linear(x, dequantize_int8(qweight, scale))
    else:
        out = F.linear(x, qweight.to(x.dtype)) * scale
    return out if bias is None else out + bias


def kernel_for(x: torch.Tensor) -> str:
    """The "auto" kernel for activations x [..., in]: default_kernel for its rows."""
    return default_kernel(x.device, x.dtype, x.numel() // max(x.shape[-1], 1))


def default_kernel(device: torch.device, dtype: torch.dtype, rows: int = 1) -> str:
    """The faster int8_linear kernel for `rows` activation rows of `dtype` on `device`, as
    benchmarks/quantization.py measured both (docs/benchmarks.md, "Issue 18" and "Weight-only
    int8").

    On the CPU with bfloat16/float16 activations, int8pack up to INT8PACK_MAX_ROWS rows: a small
    batch is bound by reading the weights, and int8pack reads half of bfloat16's bytes; above
    it the dtype's own GEMM on a dequantized copy wins. Never with float32 activations, where
    int8pack has no fast path (2-20x slower than float32 BLAS). On CUDA, cuBLAS on a
    dequantized copy; torch's CUDA int8pack kernel is unmeasured here."""
    half = dtype in (torch.bfloat16, torch.float16)
    small = rows <= INT8PACK_MAX_ROWS
    return "int8pack" if device.type == "cpu" and half and small else "dequant"


class Int8Weight(torch.Tensor):
    """A linear weight held as int8 [out, in] plus `scale` [out] in the compute dtype.

    It stands for the float weight: dtype is the compute dtype, and any op but F.linear and
    F.embedding (w.float(), x @ w.T, w.to(device), ...) sees the dequantized weight, so code
    that reads the values is slower but never wrong. Its own data is the int8 values: shape,
    device, element_size() and storage describe what it holds."""

    qweight: torch.Tensor  # the same int8 storage as a plain tensor, for the kernels
    scale: torch.Tensor
    kernel: str

    @staticmethod
    def __new__(cls, qweight: torch.Tensor, scale: torch.Tensor, kernel: str) -> Int8Weight:
        if qweight.dtype != torch.int8 or scale.shape != qweight.shape[:1]:
            raise ValueError("expected int8 [out, in] values and a [out] scale")
        weight = torch.Tensor._make_subclass(cls, qweight, False)
        weight.qweight, weight.scale, weight.kernel = qweight, scale, kernel
        return weight

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, kernel: str) -> None:
        pass  # all set in __new__; torch.Tensor.__init__ takes no arguments

    def __repr__(self, **kwargs: Any) -> str:
        return f"Int8Weight(shape={tuple(self.qweight.shape)}, kernel={self.kernel})"

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
            if isinstance(weight, Int8Weight) and not isinstance(x, Int8Weight):
                return int8_linear(x, weight.qweight, weight.scale, bias, weight.kernel)
        plain_lookup = kwargs.get("max_norm") is None  # max_norm would rewrite the table
        if func is F.embedding and isinstance(args[1], Int8Weight) and plain_lookup:
            ids, weight = args  # rows [..., d]: each row scaled by its own channel's scale
            return weight.qweight[ids].to(weight.scale.dtype) * weight.scale[ids].unsqueeze(-1)
        if func is torch.Tensor.dtype.__get__:
            return args[0].scale.dtype
        if func is torch.Tensor.is_floating_point:
            return True
        if func not in _AS_STORED:
            args, kwargs = tree_map_only(Int8Weight, Int8Weight.dequantized, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def dequantized(self) -> torch.Tensor:
        """The float weight [out, in] in the compute dtype (a new tensor each call)."""
        return dequantize_int8(self.qweight, self.scale)


# Queries answered by the int8 values themselves rather than the float weight they stand for.
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


def quantize_model(
    model: nn.Module, method: str = "int8", kernel: str = "auto", embeddings: bool = False
) -> int:
    """Replaces, in place, every 2-D floating-point parameter with an Int8Weight buffer and
    drops the float original; those named in KEEP_IN_COMPUTE_DTYPE or owned by an
    nn.Embedding only when `embeddings` (the embedding rows then share the head's per-row
    scales). Returns how many weights were quantized; "none" changes nothing.

    For models that use those parameters through F.linear (nn.Linear does) or F.embedding."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"unknown quantization method {method!r}; expected one of {QUANTIZATION_METHODS}"
        )
    if kernel not in KERNELS:
        raise ValueError(f"unknown int8 kernel {kernel!r}; expected one of {KERNELS}")
    if method == "none":
        return 0
    tables = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    kept = set() if embeddings else {id(weight) for weight in tables}
    done: dict[int, Int8Weight] = {}  # a weight tied between modules is quantized once
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            full_name = f"{module_name}.{name}" if module_name else name
            if param is None or id(param) in kept or not _is_weight(full_name, param, embeddings):
                continue
            if id(param) not in done:  # "auto": each call picks by its rows (kernel_for)
                done[id(param)] = Int8Weight(*quantize_int8(param, param.dtype), kernel)
            del module._parameters[name]  # the float weight is freed with its last reference
            module.register_buffer(name, done[id(param)])
    return len(done)


def _is_weight(full_name: str, param: torch.Tensor, embeddings: bool) -> bool:
    parts = full_name.split(".")
    kept = KEEP_IN_COMPUTE_DTYPE if not embeddings else ()
    if any(part.startswith(keep) for part in parts for keep in kept):
        return False
    return param.dim() == 2 and param.is_floating_point()


def quantize_loaded(
    loaded: LoadedModel, method: str, kernel: str = "auto", embeddings: bool = False
) -> LoadedModel:
    """quantize_model on a loaded model; quantized weights get their own fingerprint, since
    the fingerprint names the weights (a scheduler refuses to mix them under one model name,
    and prefix-cache hashes must not match the float model's KV)."""
    if quantize_model(loaded.model, method, kernel, embeddings) == 0:
        return loaded
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the float weights' memory, so the KV cache can size into it
    recipe = f"{loaded.fingerprint}\0{method}" + ("\0embeddings" if embeddings else "")
    fingerprint = hashlib.sha256(recipe.encode()).hexdigest()
    return dataclasses.replace(loaded, fingerprint=fingerprint)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and persistent buffers (Int8Weight: values + scale),
    each storage counted once; non-persistent buffers (RoPE tables) are derived, not weights."""
    seen: set[int] = set()
    total = 0
    tensors: list[torch.Tensor] = list(model.parameters())
    for module in model.modules():
        skip = module._non_persistent_buffers_set
        tensors += [b for n, b in module._buffers.items() if b is not None and n not in skip]
    for tensor in tensors:
        parts = [tensor.qweight, tensor.scale] if isinstance(tensor, Int8Weight) else [tensor]
        for part in parts:
            key = part.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += part.untyped_storage().nbytes()
    return total
