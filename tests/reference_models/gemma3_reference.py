"""A dense, unpaged Gemma 3 reference forward pass: batch of one, contiguous K/V per layer.

Written from Hugging Face's Gemma 3 semantics with explicit float32 math (softmax over a
causal, optionally windowed mask) and none of the engine's attention, cache or RoPE code, so
that comparing the two checks paging, batching, chunking and the sliding window. Slow by
design; for tests only."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from services.worker.model.gemma3 import Gemma3DecoderLayer, Gemma3Model
from services.worker.model.gemma3_config import Gemma3Config
from tests.reference_models.dense_kv import DenseKV


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm, x [..., d] -> [..., d]: scaled by (1 + weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())


def _rope(x: torch.Tensor, start: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [H, T, D] at positions start.. -> rotated with HF's rotate_half pairing (i, i + D/2)."""
    positions = torch.arange(start, start + x.shape[1], dtype=torch.float32)
    angles = torch.outer(positions, inv_freq).to(x.device)  # [T, D/2]
    cos, sin = angles.cos(), angles.sin()
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int, window: int | None, scale: float
) -> torch.Tensor:
    """q [H, n, D] at positions past.., k/v [H, T, D] at 0..T-1 -> [H, n, D], explicit softmax."""
    query_pos = torch.arange(past, past + q.shape[1])[:, None]
    key_pos = torch.arange(k.shape[1])[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= query_pos - key_pos < window
    scores = (q @ k.transpose(1, 2)) * scale  # [H, n, T]
    scores = scores.masked_fill(~allowed.to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _layer(
    x: torch.Tensor,
    index: int,
    layer: Gemma3DecoderLayer,
    config: Gemma3Config,
    kv: DenseKV,
    past: int,
) -> torch.Tensor:
    """One decoder layer on x [n, d], the new tokens after `past` cached ones -> [n, d]."""
    heads, kv_heads, dim, eps = (
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.rms_norm_eps,
    )
    n = x.shape[0]
    attn = layer.self_attn
    h = _norm(x, layer.input_layernorm.weight, eps)
    q_w, k_w, v_w = attn.qkv_proj.float().split([config.q_size, config.kv_size, config.kv_size])
    q = _norm((h @ q_w.T).view(n, heads, dim), attn.q_norm.weight, eps).transpose(0, 1)
    k = _norm((h @ k_w.T).view(n, kv_heads, dim), attn.k_norm.weight, eps).transpose(0, 1)
    v = (h @ v_w.T).view(n, kv_heads, dim).transpose(0, 1)  # [Hkv, n, D]
    inv_freq = config.rope_inv_freq(config.layer_types[index])
    q, k = _rope(q, past, inv_freq), _rope(k, past, inv_freq)
    k, v = kv.extend(index, k, v)
    k = k.repeat_interleave(heads // kv_heads, dim=0)  # [H, T, D]
    v = v.repeat_interleave(heads // kv_heads, dim=0)
    scale = 1.0 / math.sqrt(config.query_pre_attn_scalar)
    out = _attend(q, k, v, past, config.window(index), scale).transpose(0, 1).reshape(n, -1)
    x = x + _norm(out @ attn.o_proj.float().T, layer.post_attention_layernorm.weight, eps)
    h = _norm(x, layer.pre_feedforward_layernorm.weight, eps)
    gate_w, up_w = layer.mlp.gate_up_proj.float().split(config.intermediate_size)
    h = (F.gelu(h @ gate_w.T, approximate="tanh") * (h @ up_w.T)) @ layer.mlp.down_proj.float().T
    return x + _norm(h, layer.post_feedforward_layernorm.weight, eps)


@torch.inference_mode()
def dense_hidden(model: Gemma3Model, token_ids: list[int], kv: DenseKV) -> torch.Tensor:
    """Final-normed hidden states [n, d] float32 of token_ids, continuing kv."""
    config = model.config
    ids = torch.tensor(token_ids, device=model.embed_tokens.device)
    x = model.embed_tokens[ids].float() * model.embed_scale  # [n, d]
    past = kv.length  # layer 0 extends the cache before layer 1 runs
    for index, layer in enumerate(model.layers):
        x = _layer(x, index, layer, config, kv, past)  # type: ignore[arg-type]
    return _norm(x, model.norm.weight, config.rms_norm_eps)


@torch.inference_mode()
def dense_logits(model: Gemma3Model, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [N, d] -> logits [N, V] float32 (tied head; soft-capped if configured)."""
    logits = hidden @ model.embed_tokens.float().T
    cap = model.config.final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap
