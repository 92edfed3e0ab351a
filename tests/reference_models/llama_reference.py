"""A dense, unpaged Llama reference forward pass: batch of one, a contiguous K/V per layer.

It shares the loaded weights with the engine but none of its attention or cache code, so a
test comparing the two checks the paging, batching and chunking rather than agreeing with
itself. Slow by design; for tests and debugging only."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.worker.model.config import LlamaConfig, rope_inv_freq
from services.worker.model.llama import LlamaDecoderLayer, LlamaModel
from tests.reference_models.dense_kv import DenseKV


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, d] -> [T, d]."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, start: int, config: LlamaConfig) -> torch.Tensor:
    """x: [H, T, D] at positions start..start+T-1 -> rotated, from scratch (no cached tables)."""
    seq_len, dim = x.shape[1], x.shape[2]
    positions = torch.arange(start, start + seq_len, dtype=torch.float32)
    angles = torch.outer(positions, rope_inv_freq(config)).to(x.device)  # [T, D/2]
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    # HF rotate_half pairing: (x_i, x_{i + D/2}) rotated by angle i.
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _layer(
    x: torch.Tensor,
    index: int,
    layer: LlamaDecoderLayer,
    config: LlamaConfig,
    kv: DenseKV,
    past: int,
) -> torch.Tensor:
    """One decoder layer: x [n, d] new tokens after `past` cached ones -> [n, d]."""
    heads, kv_heads, dim = config.num_heads, config.num_kv_heads, config.head_dim
    seq_len = x.shape[0]
    h = _rms_norm(x, layer.input_layernorm.weight.float(), config.rms_norm_eps)
    qkv_weight = layer.self_attn.qkv_proj.float()
    q_w, k_w, v_w = qkv_weight.split([config.q_size, config.kv_size, config.kv_size])
    q = (h @ q_w.T).view(seq_len, heads, dim).transpose(0, 1)  # [H, n, D]
    k = (h @ k_w.T).view(seq_len, kv_heads, dim).transpose(0, 1)  # [Hkv, n, D]
    v = (h @ v_w.T).view(seq_len, kv_heads, dim).transpose(0, 1)
    q, k = _rope(q, past, config), _rope(k, past, config)
    k, v = kv.extend(index, k, v)  # [Hkv, T, D]
    # GQA the textbook way: repeat each KV head for the query heads that share it.
    k = k.repeat_interleave(heads // kv_heads, dim=0)  # [H, T, D]
    v = v.repeat_interleave(heads // kv_heads, dim=0)
    if past == 0:
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [H, n, D]
    elif seq_len == 1:
        attn = F.scaled_dot_product_attention(q, k, v)  # the newest token sees every key
    else:
        raise ValueError("the dense reference extends a sequence one token at a time")
    x = x + attn.transpose(0, 1).reshape(seq_len, -1) @ layer.self_attn.o_proj.float().T
    h = _rms_norm(x, layer.post_attention_layernorm.weight.float(), config.rms_norm_eps)
    gate_w, up_w = layer.mlp.gate_up_proj.float().split(config.intermediate_size)
    return x + (F.silu(h @ gate_w.T) * (h @ up_w.T)) @ layer.mlp.down_proj.float().T


@torch.inference_mode()
def dense_hidden(
    model: LlamaModel, token_ids: list[int], kv: DenseKV | None = None
) -> torch.Tensor:
    """Final-normed hidden states [n, d] float32 of token_ids, continuing kv if given."""
    config = model.config
    kv = kv if kv is not None else DenseKV(config.num_layers)
    device = model.embed_tokens.device
    x = model.embed_tokens[torch.tensor(token_ids, device=device)].float()  # [n, d]
    past = kv.length  # read once: layer 0 extends the cache before layer 1 runs
    for index, layer in enumerate(model.layers):
        x = _layer(x, index, layer, config, kv, past)  # type: ignore[arg-type]
    return _rms_norm(x, model.norm.weight.float(), config.rms_norm_eps)


@torch.inference_mode()
def dense_logits(model: LlamaModel, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [N, d] -> logits [N, V] float32 (tied embedding as the head if no lm_head)."""
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    return hidden @ head.float().T
