"""A GGUF model's block-quantized weights kept as the file stores them (--quantization gguf).

The model is loaded as usual (every tensor dequantized into the compute dtype); then each 2-D
parameter whose every piece the file holds in a type layers/gguf_quant.py decodes is replaced
by a QuantizedWeight decoded straight from the file's blocks, so it computes with exactly the
file's values:
- 4-bit (Q4_0, Q4_1, Q4_K) -> Int4Weight, in any compute dtype (its scales rounded to it);
- 8-bit groups (Q8_0, and Q5_0 as q - 16) -> Q8_0Weight, where the model computes in float32
  on the CPU and the C++ op that reads them is built (layers/q8_0_weight.py): the linears
  and the embedding table / output head (tied or not; lookups dequantize the rows they read).
A fused parameter (q/k/v, gate/up) is its pieces' rows stacked in the order the model lays
them out, kept only when its pieces share a bit width; a llama file's q/k rows are un-permuted
as the float loader does (gguf_loader.gguf_to_hf_rows), Gemma's are stored unpermuted. Other
types (F32 norms, Q6_K, any 8-bit weight under bfloat16) stay as loaded, in the compute dtype."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import torch
from torch import nn

from services.common.gguf_file import GGUFFile
from services.worker.layers.gguf_quant import (
    GROUP_TYPES,
    Q4_0,
    Q4_1,
    Q4_K,
    GroupQuant,
    decode_blocks,
)
from services.worker.layers.int4_weight import Int4Weight, int4_kernel
from services.worker.layers.int8_activations import activations_of
from services.worker.layers.q8_0_weight import Q8_0Weight, q8_0_op_available
from services.worker.layers.quantized_weight import QuantizedWeight
from services.worker.model import gemma3_loader, gguf_loader
from services.worker.model.gguf_loader import gguf_to_hf_rows, read_field
from services.worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)
# general.architecture -> how its tensors are named in the model (HF names, without "model.")
HF_NAMES: dict[str, Callable[[str], str]] = {
    "llama": gguf_loader.hf_name,
    "gemma3": gemma3_loader.hf_name,
}
# general.architecture -> the stored types that make --quantization auto keep a file's weights
AUTO_KEPT = {"llama": frozenset({Q4_0, Q4_1}), "gemma3": frozenset({Q4_K})}


def stored_groups(
    reader: GGUFFile, config: Any, types: Collection[int] = GROUP_TYPES
) -> dict[str, GroupQuant]:
    """HF name -> GroupQuant for every 2-D tensor of one of `types` (of those decode_blocks
    reads), rows in the model's order ({} for an architecture not in HF_NAMES)."""
    architecture = read_field(reader, "general.architecture")
    if architecture not in HF_NAMES:
        return {}
    heads = {}  # llama.cpp permutes a llama's q/k rows for its RoPE; Gemma's are as HF's
    if architecture == "llama":
        heads = {"self_attn.q_proj.weight": config.num_heads}
        heads["self_attn.k_proj.weight"] = config.num_kv_heads
    found = {}
    for tensor in reader.tensors:
        kept = tensor.tensor_type in GROUP_TYPES and tensor.tensor_type in types
        if not kept or len(tensor.shape) != 2:
            continue
        name = HF_NAMES[architecture](tensor.name)
        groups = decode_blocks(tensor.data, int(tensor.tensor_type))
        permuted = [h for suffix, h in heads.items() if name.endswith(suffix)]
        if permuted:
            groups = groups.take_rows(gguf_to_hf_rows(np.arange(tensor.shape[0]), permuted[0]))
        found[name] = groups
    return found


def auto_kept_architecture(reader: GGUFFile) -> str | None:
    """The file's architecture where --quantization auto keeps its weights, else None: a llama
    GGUF with Q4_0/Q4_1 tensors or a Gemma 3 one with Q4_K (its Q5_0/Q8_0 kept beside them);
    both measured faster and closer to the float reference than the float load
    (docs/benchmarks.md, issue 29)."""
    architecture = str(read_field(reader, "general.architecture"))
    types = AUTO_KEPT.get(architecture, frozenset())
    return architecture if any(t.tensor_type in types for t in reader.tensors) else None


def keep_gguf_quantized(
    loaded: LoadedModel, kernel: str = "auto", types: Collection[int] = GROUP_TYPES
) -> int:
    """Replaces, in place, each 2-D parameter of `loaded` (a llama or Gemma 3 GGUF) that the
    file holds block-quantized with a QuantizedWeight of the file's values where that format
    computes here (see the module docstring). Returns how many were replaced (0 for any other
    file); `kernel` picks Int4Weight's kernel; `types` limits it to weights the file stores
    in those ggml types (benchmarks/default_choice.py measures one format at a time)."""
    path = loaded.path
    if path is None or path.suffix != ".gguf":
        return 0
    stored = stored_groups(GGUFFile(path), loaded.config, types)
    if not stored:
        return 0
    pieces = _pieces_by_storage(loaded.model.hf_weights())
    eight_bit = _EightBitCheck()
    replaced = 0
    for module in loaded.model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.dim() != 2:
                continue
            groups = _stored_for(param, pieces.get(param.untyped_storage().data_ptr(), []), stored)
            if groups is None:
                continue
            if groups.bits == 4:
                moved = GroupQuant(*(t.to(param.device) for t in _fields(groups)), bits=4)
                weight: QuantizedWeight = Int4Weight(moved, param.dtype, kernel)
            elif eight_bit.computes(param):
                # the 4-bit linears' activations: integer ones for the head too (int4_weight.py)
                chosen = int4_kernel(kernel, param.device, param.dtype)
                weight = Q8_0Weight(groups, activations=activations_of(chosen))
            else:
                continue
            del module._parameters[name]
            module.register_buffer(name, weight)
            replaced += 1
    return replaced


def _stored_for(
    param: torch.Tensor, names: list[str], stored: dict[str, GroupQuant]
) -> GroupQuant | None:
    """The file's groups for the whole of `param` (its pieces `names` stacked), or None where a
    piece is not stored in groups, the pieces mix bit widths or do not cover it (a shard)."""
    if not names or any(n not in stored for n in names):
        return None
    parts = [stored[n] for n in names]
    if len({p.bits for p in parts}) != 1:
        return None
    groups = GroupQuant.cat(parts)
    return groups if groups.q.shape == param.shape else None


class _EightBitCheck:
    """Whether a parameter can become a Q8_0Weight: float32 on the CPU, with the op built
    (looked up once; its absence said once in the log)."""

    def __init__(self) -> None:
        self._op: bool | None = None

    def computes(self, param: torch.Tensor) -> bool:
        if param.device.type != "cpu" or param.dtype != torch.float32:
            return False
        if self._op is None:
            self._op = q8_0_op_available()
            if not self._op:
                log.info("Q8_0/Q5_0 weights kept as float32: the C++ extension is not built")
        return self._op


def _pieces_by_storage(targets: dict[str, torch.Tensor]) -> dict[int, list[str]]:
    """Storage pointer -> the HF names stored in it, in row order (their storage offsets)."""
    by_storage: dict[int, list[tuple[int, str]]] = {}
    for name, tensor in targets.items():
        key = tensor.untyped_storage().data_ptr()
        by_storage.setdefault(key, []).append((tensor.storage_offset(), name))
    return {key: [n for _, n in sorted(items)] for key, items in by_storage.items()}


def _fields(groups: GroupQuant) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return groups.q, groups.scale, groups.offset


def linear_weights(model: nn.Module) -> list[Int4Weight]:
    """The model's Int4Weight buffers (tests and the quality benchmark count them)."""
    return [b for m in model.modules() for b in m.buffers(False) if isinstance(b, Int4Weight)]
