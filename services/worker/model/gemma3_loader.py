"""Gemma 3 from a GGUF file or a Hugging Face checkpoint: config and HF-named float32 tensors.

Two differences from llama.cpp's Llama GGUFs matter here. Gemma uses rotate_half RoPE (NeoX
style) in llama.cpp too, so attn_q/attn_k rows are stored unpermuted. And the converter bakes
Gemma's `1 + weight` RMSNorm into the file (every *norm.weight is stored plus one), so one is
subtracted to return to Hugging Face's convention, which the model implements."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from services.worker.model import hf_loader
from services.worker.model.gemma3_config import (
    DEFAULT_LOCAL_ROPE_THETA,
    DEFAULT_SLIDING_PATTERN,
    SLIDING,
    Gemma3Config,
    pattern_layer_types,
)
from services.worker.model.gguf_loader import Reader, dequantize_f32, eos_ids, read_field

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
# llama.cpp scales Gemma 3 27B (62 layers) queries by hidden/heads, every other size by head_dim.
_LAYERS_27B = 62


def read_gguf_config(reader: Reader) -> Gemma3Config:
    """Gemma3Config from gemma3.* GGUF metadata."""

    def meta(key: str, default: object = None) -> Any:
        value = read_field(reader, f"gemma3.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks gemma3.{key}")
        return value

    hidden, heads, layers = (
        int(meta(k)) for k in ("embedding_length", "attention.head_count", "block_count")
    )
    head_dim = int(meta("attention.key_length", 256))
    tokens: list[str] = list(read_field(reader, "tokenizer.ggml.tokens", []))  # type: ignore[arg-type]
    factor = 1.0
    if read_field(reader, "gemma3.rope.scaling.type") == "linear":
        factor = float(meta("rope.scaling.factor"))
    softcap = read_field(reader, "gemma3.final_logit_softcapping")
    return Gemma3Config(
        vocab_size=int(meta("vocab_size", len(tokens) or None)),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(meta("rope.freq_base", 1_000_000.0)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(meta("context_length")),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        eos_token_ids=eos_ids(reader, tokens),
        layer_types=_gguf_layer_types(reader, layers),
        sliding_window=int(meta("attention.sliding_window")),
        rope_local_theta=DEFAULT_LOCAL_ROPE_THETA,
        rope_linear_factor=factor,
        query_pre_attn_scalar=float(hidden // heads if layers == _LAYERS_27B else head_dim),
        final_logit_softcapping=None if softcap is None else float(softcap),  # type: ignore[arg-type]
    )


def _gguf_layer_types(reader: Reader, layers: int) -> tuple[str, ...]:
    """Newer converters write the pattern (a number, or one bool per layer, True = sliding);
    older ones leave it to llama.cpp, which hard-codes Gemma 3's every-sixth-layer-global."""
    pattern = read_field(reader, "gemma3.attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
    if isinstance(pattern, list):
        return tuple(SLIDING if flag else "full_attention" for flag in pattern)
    return pattern_layer_types(layers, int(pattern))  # type: ignore[call-overload]


def iter_gguf_tensors(reader: Reader, config: Gemma3Config) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name without "model.", float32 tensor) for every tensor; norms shifted back by one."""
    del config  # Gemma's q/k rows need no un-permuting: the signature is the registry's
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        array = dequantize_f32(tensor)
        if tensor.name.endswith("norm.weight"):
            array -= 1.0
        yield name, torch.from_numpy(array)


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name (without "model.") of a Gemma 3 GGUF tensor."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{suffix}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in a Gemma 3 GGUF")


def read_hf_config(directory: Path) -> Gemma3Config:
    """Gemma3Config from a Gemma3ForCausalLM config.json (transformers 4.5x or 5.x keys)."""
    raw = hf_loader.read_json(directory / "config.json")
    if raw.get("attn_logit_softcapping") is not None:
        raise ValueError("Gemma attention-logit soft-capping (Gemma 2) is not supported")
    activation = raw.get("hidden_activation", "gelu_pytorch_tanh")
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma 3 activation {activation!r} is not supported")
    layers, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    global_rope, local_theta = _hf_rope(raw)
    layer_types = raw.get("layer_types") or pattern_layer_types(
        layers, int(raw.get("sliding_window_pattern", DEFAULT_SLIDING_PATTERN))
    )
    softcap = raw.get("final_logit_softcapping")
    return Gemma3Config(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim", 256)),
        rope_theta=float(global_rope.get("rope_theta", 1_000_000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        eos_token_ids=hf_loader.eos_ids(directory, raw),
        layer_types=tuple(layer_types),
        sliding_window=int(raw.get("sliding_window", 512)),
        rope_local_theta=local_theta,
        rope_linear_factor=_linear_factor(global_rope),
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=None if softcap is None else float(softcap),
    )


def _hf_rope(raw: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """(global layers' rope parameters, local rope theta): transformers 5 nests them per layer
    type under rope_parameters; 4.x had rope_theta, rope_scaling and rope_local_base_freq."""
    nested = raw.get("rope_parameters")
    if isinstance(nested, dict) and "full_attention" in nested:
        local = nested.get(SLIDING, {})
        return nested["full_attention"], float(local.get("rope_theta", DEFAULT_LOCAL_ROPE_THETA))
    scaling = dict(raw.get("rope_scaling") or {})
    scaling.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    return scaling, float(raw.get("rope_local_base_freq", DEFAULT_LOCAL_ROPE_THETA))


def _linear_factor(rope: dict[str, Any]) -> float:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return 1.0
    if kind != "linear":
        raise ValueError(f"Gemma 3 rope type {kind!r} is not supported (default or linear)")
    return float(rope["factor"])


def iter_hf_tensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors, named without "model." (norms stay in HF's convention)."""
    yield from hf_loader.iter_hf_tensors(directory)
