"""Load a llama-architecture GGUF file: metadata to LlamaConfig, tensors dequantized to torch.

llama.cpp's converter stores attn_q/attn_k with the rows of each head interleaved for its
own RoPE pairing (dims 2i, 2i+1); the model here uses Hugging Face's rotate_half pairing
(dims i, i + D/2), so those rows are permuted back while loading."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader, ReaderField, ReaderTensor, quants

from services.common.gguf_file import GGUFFile, GGUFTensor
from services.worker.model.config import LlamaConfig

# Special tokens that end a turn in common chat templates; counted as EOS when in the vocab.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def gguf_to_hf_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: rows [H * D, ...] from GGUF order to HF order.

    HF -> GGUF was w.reshape(H, 2, D/2, ...).swapaxes(1, 2); the inverse swaps back."""
    head_dim = weight.shape[0] // num_heads
    split = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def hf_to_gguf_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's permutation (HF order to GGUF order), for tests that check the fix matters."""
    head_dim = weight.shape[0] // num_heads
    split = weight.reshape(num_heads, 2, head_dim // 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


# Either reader works: GGUFFile (services/common/gguf_file.py, fast) or gguf's own GGUFReader.
Reader = GGUFFile | GGUFReader


def read_field(reader: Reader, key: str, default: object = None) -> object:
    """A metadata value (scalar, string or list), or default when the key is absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents() if isinstance(field, ReaderField) else field


def dequantize_f32(tensor: GGUFTensor | ReaderTensor) -> np.ndarray:
    """A GGUF tensor as a writable float32 array in numpy (HF) order, whatever its quant type.

    The reader's data is in numpy order already (GGUF lists dims innermost first); for a
    quantized tensor the last axis counts bytes, which dequantize turns into elements."""
    array = np.ascontiguousarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    if not array.flags.writeable:
        array = array.copy()  # F32 tensors come back as views of the read-only file map
    return array


def read_config(reader: Reader) -> LlamaConfig:
    """LlamaConfig from GGUF metadata (llama.* keys plus the tokenizer's special ids)."""
    arch = read_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, got {arch!r}")

    def meta(key: str, default: object = None) -> object:
        value = read_field(reader, f"llama.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return value

    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    tokens: list[str] = list(read_field(reader, "tokenizer.ggml.tokens", []))  # type: ignore[arg-type]
    vocab_size = int(meta("vocab_size", len(tokens) or None))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=int(meta("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=int(meta("attention.key_length", hidden // heads)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(meta("context_length")),
        tie_word_embeddings=not has_output,
        eos_token_ids=eos_ids(reader, tokens),
    )


def eos_ids(reader: Reader, tokens: list[str]) -> tuple[int, ...]:
    """The declared EOS/EOT ids plus every end-of-turn token the vocabulary has."""
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = read_field(reader, key)
        if value is not None:
            ids.append(int(value))  # type: ignore[call-overload]
    index = {token: i for i, token in enumerate(tokens)}
    ids.extend(index[name] for name in END_OF_TURN_TOKENS if name in index)
    return tuple(sorted(set(ids)))


def iter_hf_tensors(reader: Reader, config: LlamaConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name without "model.", float32 tensor) for every GGUF tensor, q/k rows un-permuted."""
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        array = dequantize_f32(tensor)
        if name.endswith("self_attn.q_proj.weight"):
            array = np.ascontiguousarray(gguf_to_hf_rows(array, config.num_heads))
        elif name.endswith("self_attn.k_proj.weight"):
            array = np.ascontiguousarray(gguf_to_hf_rows(array, config.num_kv_heads))
        yield name, torch.from_numpy(array)


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name (without "model.") of a llama GGUF tensor."""
    base, _, suffix = gguf_name.rpartition(".")  # suffix: "weight" (or "bias")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{suffix}"
    if gguf_name == "rope_freqs.weight":
        raise ValueError("GGUF rope_freqs (baked-in RoPE scaling) is not supported")
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def open_gguf(path: Path) -> tuple[GGUFFile, LlamaConfig]:
    """The memory-mapped reader and the config it describes."""
    reader = GGUFFile(path)
    return reader, read_config(reader)
