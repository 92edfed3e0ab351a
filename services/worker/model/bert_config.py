"""The shape of a BERT encoder (sentence-embedding models such as all-MiniLM-L6-v2), read from a
Hugging Face checkpoint directory: config.json plus model.safetensors.

Only what the encoder's forward needs is kept. The fields the runner and the worker's start-up
read from every model (vocab_size, hidden_size, num_layers, head_dim, max_position_embeddings,
eos_token_ids) have the names LlamaConfig gives them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from services.worker.model import hf_loader

# Tensors a BERT checkpoint holds that the encoder does not use: the [CLS] pooler head (sentence
# embeddings pool the last hidden states instead) and the position ids buffer (0..511).
UNUSED_TENSORS = ("pooler.", "embeddings.position_ids")


@dataclass(frozen=True, slots=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    eos_token_ids: tuple[int, ...] = ()  # an encoder generates nothing

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def read_config(directory: Path) -> BertConfig:
    """BertConfig from config.json; ValueError for what this encoder does not implement."""
    raw = hf_loader.read_json(directory / "config.json")
    if not raw:
        raise ValueError(f"{directory} has no config.json")
    act = raw.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"BERT hidden_act {act!r} is not supported (only gelu)")
    position = raw.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"BERT position_embedding_type {position!r} is not supported")
    return BertConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=int(raw["num_attention_heads"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
        type_vocab_size=int(raw.get("type_vocab_size", 2)),
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
    )


def iter_tensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the checkpoint, "bert." dropped (a BertFor* checkpoint's encoder)."""
    for name, tensor in hf_loader.iter_hf_tensors(directory):
        yield name.removeprefix("bert."), tensor
