"""Load a Hugging Face Llama checkpoint directory: config.json plus *.safetensors (sharded too)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from services.worker.model.config import Llama3RopeScaling, LlamaConfig
from services.worker.model.gguf_loader import END_OF_TURN_TOKENS

_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM"}


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def read_config(directory: Path) -> LlamaConfig:
    """LlamaConfig from config.json; EOS ids also from generation_config.json, tokenizer.json."""
    raw = read_json(directory / "config.json")
    if not raw:
        raise ValueError(f"{directory} has no config.json")
    archs = set(raw.get("architectures") or ["LlamaForCausalLM"])
    if not archs & _ARCHITECTURES:
        raise ValueError(f"unsupported architecture {sorted(archs)}; expected a Llama model")
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise ValueError("Llama checkpoints with attention/MLP biases are not supported")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return LlamaConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=eos_ids(directory, raw),
        rope_scaling=_rope_scaling(raw.get("rope_scaling")),
    )


def _rope_scaling(raw: dict[str, Any] | None) -> Llama3RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (only llama3)")
    return Llama3RopeScaling(
        factor=float(raw["factor"]),
        low_freq_factor=float(raw["low_freq_factor"]),
        high_freq_factor=float(raw["high_freq_factor"]),
        original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
    )


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def eos_ids(directory: Path, config: dict[str, Any]) -> tuple[int, ...]:
    ids = _as_ids(config.get("eos_token_id"))
    ids += _as_ids(read_json(directory / "generation_config.json").get("eos_token_id"))
    # End-of-turn specials: chat models stop on these even when the config names only one.
    added = read_json(directory / "tokenizer.json").get("added_tokens", [])
    ids += [int(t["id"]) for t in added if t.get("content") in END_OF_TURN_TOKENS]
    return tuple(sorted(set(ids)))


def weight_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files, in a stable order.

    With a shard index, only the files it names: some repos also ship a differently named
    consolidated copy of the same weights next to the shards."""
    index = read_json(directory / "model.safetensors.index.json").get("weight_map")
    if index:
        files = [directory / name for name in sorted(set(index.values()))]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} has no *.safetensors files")
    return files


def iter_hf_tensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name without the "model." prefix, tensor) for every tensor of every shard."""
    for file in weight_files(directory):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                short = name.removeprefix("model.")
                yield short, handle.get_tensor(name)
