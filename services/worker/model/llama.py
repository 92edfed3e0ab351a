"""The Llama network over a flattened variable-length batch with a paged KV cache.

Weights use Hugging Face's layout and RoPE convention (rotate_half); loaders convert to it.
q/k/v and gate/up projections are fused so each layer issues fewer, larger matmuls, which is
what matters at small batch on CPU. The norms, RoPE, SiLU-mul, KV cache writes and attention
run on the step's attention backend (attn.backend: torch ops or the Triton kernels, chosen once
at start-up; engine/attention.py)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.engine.attention import TORCH, AttentionBackend, StepAttention
from services.worker.engine.kv_cache import PagedKVCache
from services.worker.model.config import LlamaConfig, rope_inv_freq
from services.worker.model.weights import copy_hf_weights


def _weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    # Uninitialised on purpose: every weight is overwritten by a loader, and random init of
    # 135M+ parameters would cost seconds for nothing.
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _weight(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, backend: AttentionBackend = TORCH) -> torch.Tensor:
        """x: [T, d] -> [T, d]; the statistic in float32 as HF does, for low-precision dtypes."""
        return backend.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_positions, applied with rotate_half."""

    def __init__(self, config: LlamaConfig, max_positions: int, device: torch.device) -> None:
        super().__init__()
        angles = torch.outer(
            torch.arange(max_positions, dtype=torch.float32), rope_inv_freq(config)
        )
        angles = torch.cat([angles, angles], dim=-1)  # [P, D]: HF pairs dim i with i + D/2
        self.register_buffer("cos", angles.cos().to(device), persistent=False)
        self.register_buffer("sin", angles.sin().to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin [T, 1, D]; looked up once per step, shared by all layers."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(
            dtype
        )


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        d = config.hidden_size
        self.qkv_proj = _weight(self.q_size + 2 * self.kv_size, d, dtype=dtype, device=device)
        self.o_proj = _weight(d, self.q_size, dtype=dtype, device=device)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """x: [T, d] (normed) -> [T, d]. rotary: what attn.backend.rotary() made of the cos/sin
        tables (torch: [T, 1, D] of each token; Triton: the whole [P, D] tables)."""
        tokens = x.shape[0]
        qkv = F.linear(x, self.qkv_proj)  # [T, (H + 2 Hkv) * D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        backend = attn.backend
        q, k = backend.apply_rope(q, k, attn.positions, rotary)
        # New K/V go into the cache first, so every query attends only through the cache.
        group = attn.for_group(kv_cache.group_of(self.layer))
        backend.write_kv(kv_cache, self.layer, k, v, group)
        out = backend.paged_attention(q, kv_cache.layer(self.layer), group)  # [T, H, D]
        return F.linear(out.reshape(tokens, self.q_size), self.o_proj)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        d, ffn = config.hidden_size, config.intermediate_size
        self.intermediate_size = ffn
        self.gate_up_proj = _weight(2 * ffn, d, dtype=dtype, device=device)
        self.down_proj = _weight(d, ffn, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """SwiGLU: x [T, d] -> [T, d]."""
        gate_up = F.linear(x, self.gate_up_proj)  # [T, 2I]: gate | up
        return F.linear(backend.silu_mul(gate_up), self.down_proj)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.self_attn = LlamaAttention(config, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        """Pre-norm residual block: x [T, d] -> [T, d]."""
        backend = attn.backend
        x = x + self.self_attn(self.input_layernorm(x, backend), rotary, attn, cache)
        return x + self.mlp(self.post_attention_layernorm(x, backend), backend)


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: LlamaConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config = config
        self.embed_tokens = _weight(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype, device) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else _weight(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        )
        self.rope = RotaryEmbedding(config, max_positions or config.max_position_embeddings, device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: StepAttention,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """input_ids, positions: [T] (several sequences flattened) -> final-normed hidden [T, d].

        positions drive RoPE; attn (its slot mapping and block tables) drives the cache."""
        x = F.embedding(input_ids, self.embed_tokens)  # [T, d]
        rotary = attn.backend.rotary(self.rope.cos, self.rope.sin, positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rotary, attn, kv_cache)
        return self.norm(x, attn.backend)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> logits [N, V] float32 (tied embeddings unless lm_head exists)."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(hidden, head).float()

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies Hugging Face-named weights (without the "model." prefix) into this module.

        Fused projections are filled slice by slice; every parameter must be covered."""

        def skip(name: str) -> bool:  # derived from the config / a tied checkpoint's copy
            return name.endswith("rotary_emb.inv_freq") or (
                name == "lm_head.weight" and self.lm_head is None
            )

        copy_hf_weights(self.hf_weights(), tensors, "Llama", skip)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """HF name (without "model.") -> the parameter, or the slice of a fused one, holding it."""
        targets = {"embed_tokens.weight": self.embed_tokens, "norm.weight": self.norm.weight}
        if self.lm_head is not None:
            targets["lm_head.weight"] = self.lm_head
        for i, layer in enumerate(self.layers):
            targets.update(
                {f"layers.{i}.{suffix}": t for suffix, t in _layer_targets(layer).items()}
            )
        return targets


def _layer_targets(layer: LlamaDecoderLayer) -> dict[str, torch.Tensor]:
    attn, mlp = layer.self_attn, layer.mlp
    q, kv, ffn = attn.q_size, attn.kv_size, mlp.intermediate_size
    return {
        "input_layernorm.weight": layer.input_layernorm.weight,
        "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        "self_attn.q_proj.weight": attn.qkv_proj[:q],
        "self_attn.k_proj.weight": attn.qkv_proj[q : q + kv],
        "self_attn.v_proj.weight": attn.qkv_proj[q + kv :],
        "self_attn.o_proj.weight": attn.o_proj,
        "mlp.gate_proj.weight": mlp.gate_up_proj[:ffn],
        "mlp.up_proj.weight": mlp.gate_up_proj[ffn:],
        "mlp.down_proj.weight": mlp.down_proj,
    }
