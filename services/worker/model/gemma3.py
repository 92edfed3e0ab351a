"""The Gemma 3 text network over the same flattened batch and paged KV cache as llama.py.

What differs from Llama: RMSNorm scales by (1 + weight) in float32; q and k are RMS-normed per
head before RoPE; every sublayer's output is normed again before the residual add (pre- and
post-norms around both attention and MLP); embeddings are multiplied by sqrt(hidden); the MLP
is GeLU(tanh)-gated; query scaling comes from query_pre_attn_scalar; sliding-window layers
(own RoPE base) alternate with global ones; logits may be soft-capped; embeddings are tied.

Attention runs on the torch path only: the Triton kernels take head dims 64/128 and no window
(kernel_choice's "auto" already picks torch for Gemma's head dim 256).

Every weight is used through fused.linear / F.embedding, so a weight kept as the GGUF stores it
(model/gguf_weights.py: the embedding table and head as Q8_0, linears as Q4_K or Q5_0) computes
through its own linear() and lookup."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.layers.attention import StepAttention
from services.worker.layers.fused import FusedAttention, FusedGatedMLP, linear
from services.worker.layers.hf_names import per_layer
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.rotary import RopeTables
from services.worker.layers.torch_attention import apply_rotary
from services.worker.layers.weights import copy_hf_weights, empty_weight
from services.worker.model.gemma3_config import FULL, SLIDING, Gemma3Config


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_weight(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]; normed and scaled by (1 + weight) in float32, as HF."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(FusedAttention):
    def __init__(self, config: Gemma3Config, layer: int, dtype: torch.dtype, device: torch.device):
        d, eps = config.hidden_size, config.rms_norm_eps
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        super().__init__(layer, d, heads, kv_heads, head_dim, dtype, device)
        self.layer_type = config.layer_types[layer]
        self.window = config.window(layer)
        # SDPA divides by sqrt(head_dim); Gemma divides by sqrt(query_pre_attn_scalar).
        self.q_scale = math.sqrt(config.head_dim / config.query_pre_attn_scalar)
        self.q_norm = GemmaRMSNorm(config.head_dim, eps, dtype, device)
        self.k_norm = GemmaRMSNorm(config.head_dim, eps, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """x: [T, d] (normed), rotary: this layer type's cos/sin [T, 1, D] -> [T, d]."""
        q, k, v = self.project_qkv(x)  # [T, H, D], [T, Hkv, D], [T, Hkv, D]
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return self.project_out(attn.attend(kv_cache, self.layer, q, k, v, self.window))

    def hf_targets(self) -> dict[str, torch.Tensor]:
        norms = {"self_attn.q_norm.weight": self.q_norm.weight}
        norms["self_attn.k_norm.weight"] = self.k_norm.weight
        return super().hf_targets() | norms


class Gemma3MLP(FusedGatedMLP):
    def __init__(self, config: Gemma3Config, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """GeGLU with tanh-approximated GeLU: x [T, d] -> [T, d]."""
        gate, up = linear(x, self.gate_up_proj).split(self.intermediate_size, dim=-1)
        return linear(F.gelu(gate, approximate="tanh") * up, self.down_proj)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: Gemma3Config, layer: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(d, eps, dtype, device)
        self.self_attn = Gemma3Attention(config, layer, dtype, device)
        self.post_attention_layernorm = GemmaRMSNorm(d, eps, dtype, device)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps, dtype, device)
        self.mlp = Gemma3MLP(config, dtype, device)
        self.post_feedforward_layernorm = GemmaRMSNorm(d, eps, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        """Sandwich-norm residual block: x [T, d] -> [T, d]."""
        h = self.self_attn(self.input_layernorm(x), rotary, attn, cache)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3Model(nn.Module):
    def __init__(
        self,
        config: Gemma3Config,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        if not config.tie_word_embeddings:
            raise ValueError("Gemma 3 ties its output head to the embeddings; got an lm_head")
        if dtype == torch.float16:
            # Its residual stream outgrows float16's range: every token comes out as <pad>.
            raise ValueError("Gemma 3 overflows float16; use --dtype bfloat16 or float32")
        device = torch.device(device)
        self.config = config
        d = config.hidden_size
        self.embed_tokens = empty_weight(config.vocab_size, d, dtype=dtype, device=device)
        # HF rounds sqrt(hidden) to the weights' dtype before multiplying; so do we.
        self.embed_scale = float(torch.tensor(math.sqrt(d)).to(dtype))
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, i, dtype, device) for i in range(config.num_layers)
        )
        self.norm = GemmaRMSNorm(d, config.rms_norm_eps, dtype, device)
        positions = max_positions or config.max_position_embeddings
        self.rope = nn.ModuleDict(
            {
                kind: RopeTables(config.rope_inv_freq(kind), positions, device)
                for kind in (SLIDING, FULL)
            }
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: StepAttention,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """input_ids, positions: [T] (several sequences flattened) -> final-normed hidden [T, d]."""
        if not attn.backend.supports_sliding_window:
            raise ValueError("Gemma 3 runs on the torch attention path only (head_dim 256)")
        x = F.embedding(input_ids, self.embed_tokens) * self.embed_scale  # [T, d]
        rotary = {kind: tables(positions, x.dtype) for kind, tables in self.rope.items()}
        for layer in self.layers:
            x = layer(x, rotary[layer.self_attn.layer_type], attn, kv_cache)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> logits [N, V] float32, soft-capped when the config says so."""
        logits = linear(hidden, self.embed_tokens).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies Hugging Face-named weights (without "model.") in; every parameter must be
        covered. A tied checkpoint's lm_head copy is skipped."""
        copy_hf_weights(self.hf_weights(), tensors, "Gemma 3", lambda n: n == "lm_head.weight")

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """HF name (without "model.") -> the parameter, or the view of a fused one, holding it."""
        targets = {"embed_tokens.weight": self.embed_tokens, "norm.weight": self.norm.weight}
        targets.update(per_layer(map(_layer_targets, self.layers)))
        return targets


def _layer_targets(layer: Gemma3DecoderLayer) -> dict[str, torch.Tensor]:
    norms = (
        "input_layernorm", "post_attention_layernorm",
        "pre_feedforward_layernorm", "post_feedforward_layernorm",
    )  # fmt: skip
    targets = {f"{n}.weight": getattr(layer, n).weight for n in norms}
    return targets | layer.self_attn.hf_targets() | layer.mlp.hf_targets()
