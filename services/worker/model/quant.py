"""Weight-only quantization of a loaded model, chosen once at load: --quantization names a
QuantizedWeight format (layers/quantized_weight.py: int8_weight.py, int4_weight.py), and every
linear weight becomes one, which answers F.linear itself, so the model code does not change.

quantize_model() runs after loading and works on any model whose linear layers go through
F.linear, whether as bare 2-D parameters (our Llama and Gemma 3 fuse q/k/v and gate/up that
way) or inside nn.Linear. Embeddings, norms and the output head stay in the compute dtype
unless asked (see KEEP_IN_COMPUTE_DTYPE for why)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging

import torch
from torch import nn

from services.worker.layers import int8_activations as int_act
from services.worker.layers.int4_weight import Int4Weight
from services.worker.layers.int8_weight import KERNEL_CHOICES, Int8Weight
from services.worker.layers.quantized_weight import QuantizedWeight
from services.worker.model.loaded import LoadedModel
from services.worker.model.quant_choice import ACTIVATION_KERNELS, resolve_quantization

logger = logging.getLogger(__name__)

# --quantization: the format each method makes ("none": the weights stay as loaded; "gguf":
# a GGUF file's 4-bit tensors kept as it stores them, model/gguf_weights.py).
QUANTIZED_FORMATS: dict[str, type[QuantizedWeight]] = {"int8": Int8Weight, "int4": Int4Weight}
QUANTIZATION_METHODS = ("none", *QUANTIZED_FORMATS, "gguf")  # "auto": quant_choice.py
# Kept in the compute dtype, matched against each dotted part of a parameter's name:
# - embeddings are read by row (F.embedding), not through F.linear;
# - the output head (SmolLM2's is the tied embedding, 21% of its weights) is where a weight
#   error turns straight into a different argmax. Measured (benchmarks/quantization.py, float32
#   activations): int8 head too takes the weights from 0.41x to 0.25x of float32, but greedy
#   tokens equal to float32's drop from 67% to 56% (bfloat16 alone: 70%).
KEEP_IN_COMPUTE_DTYPE = ("embed", "lm_head")


def quantize_model(
    model: nn.Module, method: str = "int8", kernel: str = "auto", embeddings: bool = False
) -> int:
    """Replaces, in place, every 2-D floating-point parameter with a `method` weight (an
    Int8Weight for "int8", computing with `kernel`, int8_weight.int8_kernel) buffer and
    drops the float original; those named in KEEP_IN_COMPUTE_DTYPE or owned by an
    nn.Embedding only when `embeddings` (the embedding rows then share the head's per-row
    scales). Returns how many weights were quantized; "none" changes nothing.

    For models that use those parameters through F.linear (nn.Linear does) or F.embedding."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"unknown quantization method {method!r}; expected one of {QUANTIZATION_METHODS}"
        )
    if method == "int8" and kernel not in KERNEL_CHOICES:
        raise ValueError(f"unknown int8 kernel {kernel!r}; expected one of {KERNEL_CHOICES}")
    if method in ("none", "gguf"):  # gguf: quantize_loaded, which knows the file
        return 0
    weight_format = QUANTIZED_FORMATS[method]
    tables = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    kept = set() if embeddings else {id(weight) for weight in tables}
    done: dict[int, QuantizedWeight] = {}  # a weight tied between modules is quantized once
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            full_name = f"{module_name}.{name}" if module_name else name
            if param is None or id(param) in kept or not _is_weight(full_name, param, embeddings):
                continue
            if id(param) not in done:
                done[id(param)] = weight_format.quantize(param, kernel)
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
    and prefix-cache hashes must not match the float model's KV). "auto" is resolved here
    for the loaded file and device (quant_choice.py) and the choice logged."""
    if method == "auto":
        first = next(loaded.model.parameters())
        dtype = str(first.dtype).removeprefix("torch.")
        choice = resolve_quantization(method, loaded.path, first.device.type, dtype)
        logger.info("weights: quantization %s (%s)", choice.method, choice.reason)
        method = choice.method
    if method not in ("gguf", "int4") and kernel in ACTIVATION_KERNELS.values():
        kernel = "auto"  # --activations: the 4-bit kernels' (and Q8_0's beside them) only
    if method == "gguf":
        from services.worker.model.gguf_weights import keep_gguf_quantized  # reads the file

        replaced = keep_gguf_quantized(loaded, kernel)
    else:
        replaced = quantize_model(loaded.model, method, kernel, embeddings)
    if replaced == 0:
        return loaded
    four_bit = {b.kernel.name for b in loaded.model.buffers() if isinstance(b, Int4Weight)}
    if four_bit:
        isa = int_act.instruction_set()
        how = f" (integer sums: {isa})" if four_bit & set(int_act.INT_ACTIVATION_KERNELS) else ""
        logger.info("weights: 4-bit linears through %s%s", ", ".join(sorted(four_bit)), how)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the float weights' memory, so the KV cache can size into it
    recipe = f"{loaded.fingerprint}\0{method}" + ("\0embeddings" if embeddings else "")
    fingerprint = hashlib.sha256(recipe.encode()).hexdigest()
    return dataclasses.replace(loaded, fingerprint=fingerprint)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and persistent buffers (a QuantizedWeight: what it stores),
    each storage counted once; non-persistent buffers (RoPE tables) are derived, not weights."""
    seen: set[int] = set()
    total = 0
    tensors: list[torch.Tensor] = list(model.parameters())
    for module in model.modules():
        skip = module._non_persistent_buffers_set
        tensors += [b for n, b in module._buffers.items() if b is not None and n not in skip]
    for tensor in tensors:
        quantized = isinstance(tensor, QuantizedWeight)
        parts = tensor.stored_tensors() if quantized else [tensor]
        for part in parts:
            key = part.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += part.untyped_storage().nbytes()
    return total
