"""A tiny Llama checkpoint directory with random weights, for tests that need a second model:
2 layers, hidden size 64, and SmolLM2's vocabulary and tokenizer, so it loads like any Hugging
Face checkpoint (config.json, *.safetensors, tokenizer.json, tokenizer_config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from services.tokenizer.loader import load_tokenizer

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 49152, 64, 112, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
    "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "eos_token_id": 2,
}  # fmt: skip
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN),
            p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
        }
    g = torch.Generator().manual_seed(seed)
    weights = {n: torch.randn(s, generator=g) * 0.1 for n, s in shapes.items()}
    for name, tensor in weights.items():
        if name.endswith("norm.weight"):
            tensor += 1.0
    return weights


def write_tiny_llama(directory: Path, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_weights(seed), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(CONFIG))
    load_tokenizer(None).tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {"chat_template": CHATML, "eos_token": "<|im_end|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory
