"""A llama GGUF model's 4-bit linear weights kept as the file stores them (--quantization gguf).

The model is loaded as usual (every tensor dequantized into the compute dtype); then each 2-D
parameter whose every piece the file holds as Q4_0 or Q4_1 is replaced by an Int4Weight
decoded straight from the file's blocks (layers/gguf_quant.py), so it computes with exactly the
file's values (rounded to the compute dtype's scales). A fused parameter (q/k/v, gate/up) is
its pieces' rows stacked in the order the model lays them out; q/k rows are un-permuted as the
float loader does (gguf_loader.gguf_to_hf_rows). A Q8_0 embedding table / output head (tied or
not) in a float32 model on the CPU becomes a Q8_0Weight of the file's blocks when the C++ op
that reads them is built (layers/q8_0_weight.py). Other types (F32, K-quants, Q8_0 elsewhere)
stay as loaded, in the compute dtype."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from services.common.gguf_file import GGUFFile
from services.worker.layers.gguf_quant import FOUR_BIT_TYPES, Q8_0, GroupQuant, decode_blocks
from services.worker.layers.int4_weight import Int4Weight
from services.worker.layers.q8_0_weight import Q8_0Weight, q8_0_op_available
from services.worker.model.gguf_loader import gguf_to_hf_rows, hf_name, read_field
from services.worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)
_TABLES = ("embed_tokens", "lm_head")  # the model's attributes a Q8_0 table can replace


def four_bit_tensors(reader: GGUFFile, num_heads: int, num_kv_heads: int) -> dict[str, GroupQuant]:
    """HF name -> GroupQuant for every Q4_0/Q4_1 2-D tensor of a llama GGUF, rows in HF order."""
    heads = {"self_attn.q_proj.weight": num_heads, "self_attn.k_proj.weight": num_kv_heads}
    found = {}
    for tensor in reader.tensors:
        if tensor.tensor_type not in FOUR_BIT_TYPES or len(tensor.shape) != 2:
            continue
        name = hf_name(tensor.name)
        groups = decode_blocks(tensor.data, int(tensor.tensor_type))
        permuted = [h for suffix, h in heads.items() if name.endswith(suffix)]
        if permuted:
            groups = groups.take_rows(gguf_to_hf_rows(np.arange(tensor.shape[0]), permuted[0]))
        found[name] = groups
    return found


def has_four_bit(reader: GGUFFile) -> bool:
    """Whether a llama GGUF holds any Q4_0/Q4_1 tensor (what --quantization gguf keeps)."""
    llama = read_field(reader, "general.architecture") == "llama"
    return llama and any(t.tensor_type in FOUR_BIT_TYPES for t in reader.tensors)


def keep_gguf_quantized(loaded: LoadedModel, kernel: str = "auto") -> int:
    """Replaces, in place, each parameter of `loaded` (a llama GGUF) that the file holds in
    4-bit with an Int4Weight of the file's values, and its Q8_0 embedding / head with a
    Q8_0Weight where that can compute (keep_q8_0_tables). Returns how many were replaced (0 for
    any other file)."""
    path = loaded.path
    if path is None or path.suffix != ".gguf":
        return 0
    reader = GGUFFile(path)
    if not has_four_bit(reader):
        return 0
    config = loaded.config
    stored = four_bit_tensors(reader, config.num_heads, config.num_kv_heads)
    pieces = _pieces_by_storage(loaded.model.hf_weights())
    replaced = 0
    for module in loaded.model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.dim() != 2:
                continue
            names = pieces.get(param.untyped_storage().data_ptr(), [])
            if not names or any(n not in stored for n in names):
                continue
            groups = GroupQuant.cat([stored[n] for n in names])
            if groups.q.shape != param.shape:
                continue  # the pieces do not cover it (a shard): leave it as loaded
            device_groups = GroupQuant(*(t.to(param.device) for t in _fields(groups)), bits=4)
            del module._parameters[name]
            module.register_buffer(name, Int4Weight(device_groups, param.dtype, kernel))
            replaced += 1
    return replaced + keep_q8_0_tables(loaded, reader)


def keep_q8_0_tables(loaded: LoadedModel, reader: GGUFFile) -> int:
    """Replaces the model's embedding table and output head (one tensor when tied) with a
    Q8_0Weight where the file stores them as Q8_0, the model computes in float32 on the CPU and
    the op is built; otherwise they stay as loaded (float), said once in the log."""
    model = loaded.model
    stored = {hf_name(t.name): t for t in reader.tensors if t.tensor_type == Q8_0}
    wanted = [a for a in _TABLES if isinstance(getattr(model, a, None), nn.Parameter)]
    wanted = [a for a in wanted if f"{a}.weight" in stored]
    if not wanted:
        return 0
    table = getattr(model, wanted[0])
    if table.device.type != "cpu" or table.dtype != torch.float32:
        return 0
    if not q8_0_op_available():
        log.info("Q8_0 embedding/head kept as float32: the C++ extension is not built")
        return 0
    for attr in wanted:
        groups = decode_blocks(stored[f"{attr}.weight"].data, Q8_0)
        del model._parameters[attr]
        model.register_buffer(attr, Q8_0Weight(groups))
    return len(wanted)


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
