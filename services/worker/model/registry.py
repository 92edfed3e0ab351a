"""Which network serves a checkpoint, chosen from its own metadata.

An Architecture is one model file plus its loader mapping: a model class, config builders for
GGUF and Hugging Face checkpoints, and the tensor iterators that yield Hugging Face-named,
float32 weights. Adding the next architecture (Qwen, Llama 3 variants with biases, ...) means
writing its model and loader modules and one entry in ARCHITECTURES.

An encoder (BERT: sentence embeddings) attends both ways and never decodes; its model class
says so (`is_encoder`), and the worker runs it with its own runner (engine/encoder_runner.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.worker.model import bert_config, gemma3_loader, gguf_loader, hf_loader
from services.worker.model.bert import BertModel
from services.worker.model.bert_config import BertConfig
from services.worker.model.config import LlamaConfig
from services.worker.model.gemma3 import Gemma3Model
from services.worker.model.llama import LlamaModel

TensorStream = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    gguf_names: tuple[str, ...]  # values of GGUF general.architecture (none: no GGUF loader)
    hf_names: tuple[str, ...]  # entries of config.json "architectures"
    model_class: type[nn.Module]  # (config, dtype=, device=) -> module with load_hf_weights
    gguf_config: Callable[[gguf_loader.Reader], LlamaConfig] | None
    gguf_tensors: Callable[[gguf_loader.Reader, Any], TensorStream] | None
    hf_config: Callable[[Path], LlamaConfig | BertConfig]
    hf_tensors: Callable[[Path], TensorStream]


ARCHITECTURES = (
    Architecture(
        name="llama",
        gguf_names=("llama",),
        hf_names=("LlamaForCausalLM", "MistralForCausalLM"),
        model_class=LlamaModel,
        gguf_config=gguf_loader.read_config,
        gguf_tensors=gguf_loader.iter_hf_tensors,
        hf_config=hf_loader.read_config,
        hf_tensors=hf_loader.iter_hf_tensors,
    ),
    Architecture(
        name="gemma3",
        gguf_names=("gemma3",),
        hf_names=("Gemma3ForCausalLM",),
        model_class=Gemma3Model,
        gguf_config=gemma3_loader.read_gguf_config,
        gguf_tensors=gemma3_loader.iter_gguf_tensors,
        hf_config=gemma3_loader.read_hf_config,
        hf_tensors=gemma3_loader.iter_hf_tensors,
    ),
    Architecture(
        name="bert",
        gguf_names=(),
        hf_names=("BertModel",),
        model_class=BertModel,
        gguf_config=None,
        gguf_tensors=None,
        hf_config=bert_config.read_config,
        hf_tensors=bert_config.iter_tensors,
    ),
)


def _supported() -> str:
    gguf = sorted(n for a in ARCHITECTURES for n in a.gguf_names)
    hf = sorted(n for a in ARCHITECTURES for n in a.hf_names)
    return f"supported: GGUF {', '.join(gguf)}; Hugging Face {', '.join(hf)}"


def for_gguf(reader: gguf_loader.Reader) -> Architecture:
    """The architecture named by general.architecture; ValueError listing the supported ones."""
    name = gguf_loader.read_field(reader, "general.architecture")
    for arch in ARCHITECTURES:
        if name in arch.gguf_names:
            return arch
    raise ValueError(f"GGUF architecture {name!r} is not supported ({_supported()})")


def for_hf(directory: Path) -> Architecture:
    """The architecture named by config.json "architectures" (Llama when the list is absent)."""
    raw = hf_loader.read_json(directory / "config.json")
    if not raw:
        raise ValueError(f"{directory} has no config.json")
    names = raw.get("architectures") or ["LlamaForCausalLM"]
    for arch in ARCHITECTURES:
        if set(names) & set(arch.hf_names):
            return arch
    raise ValueError(f"architecture {names} is not supported ({_supported()})")


def is_encoder(path: str | Path | None) -> bool:
    """Whether the checkpoint at `path` is an encoder (None: the default model, a decoder).
    ValueError when its architecture is not supported."""
    if path is None or not Path(path).is_dir():
        return False  # a .gguf file: only decoders have a GGUF loader here
    return bool(getattr(for_hf(Path(path)).model_class, "is_encoder", False))
