"""The Llama network over a flattened variable-length batch with a paged KV cache.

Weights use Hugging Face's layout and RoPE convention (rotate_half); loaders convert to it.
q/k/v and gate/up projections are fused so each layer issues fewer, larger matmuls, which is
what matters at small batch on CPU. The norms, RoPE, SiLU-mul, KV cache writes and attention
run on the step's attention backend (attn.backend: torch ops or the Triton kernels, chosen once
at start-up; layers/attention.py)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from services.worker.layers.attention import TORCH, AttentionBackend, StepAttention
from services.worker.layers.fused import FusedAttention, FusedGatedMLP, embedding, linear
from services.worker.layers.hf_names import per_layer
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.rotary import RopeTables
from services.worker.layers.weights import copy_hf_weights, empty_weight
from services.worker.model.config import LlamaConfig, rope_inv_freq
from services.worker.model.flat_layers import FlatLayers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_weight(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, backend: AttentionBackend = TORCH) -> torch.Tensor:
        """x: [T, d] -> [T, d]; the statistic in float32 as HF does, for low-precision dtypes."""
        return backend.rms_norm(x, self.weight, self.eps)


class LlamaAttention(FusedAttention):
    def __init__(self, config: LlamaConfig, layer: int, dtype: torch.dtype, device: torch.device):
        super().__init__(
            layer,
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            dtype,
            device,
        )

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """x: [T, d] (normed) -> [T, d]. rotary: what attn.backend.rotary() made of the cos/sin
        tables (torch: [T, 1, D] of each token; Triton: the whole [P, D] tables)."""
        q, k, v = self.project_qkv(x)  # [T, H, D], [T, Hkv, D], [T, Hkv, D]
        return self.project_out(attn.rope_and_attend(kv_cache, self.layer, q, k, v, rotary))


class LlamaMLP(FusedGatedMLP):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, dtype, device)

    def forward(self, x: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """SwiGLU: x [T, d] -> [T, d]."""
        gate_up = linear(x, self.gate_up_proj)  # [T, 2I]: gate | up
        return linear(backend.silu_mul(gate_up), self.down_proj)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, self.eps, dtype, device)
        self.self_attn = LlamaAttention(config, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, self.eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        cache: PagedKVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm residual block, its adds fused into the norms after them (as vLLM's
        fused_add_rms_norm): x [T, d] is the previous layer's MLP output, not yet added to the
        residual stream [T, d] (None at the first layer, whose x is the stream). Returns this
        layer's MLP output and the stream, updated in place: the caller adds the two."""
        backend = attn.backend
        if residual is None:
            residual, h = x, backend.rms_norm(x, self.input_layernorm.weight, self.eps)
        else:
            h = backend.add_rms_norm(x, residual, self.input_layernorm.weight, self.eps)
        h = self.self_attn(h, rotary, attn, cache)
        h = backend.add_rms_norm(h, residual, self.post_attention_layernorm.weight, self.eps)
        return self.mlp(h, backend), residual


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
        self.embed_tokens = empty_weight(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype, device) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else empty_weight(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        )
        positions = max_positions or config.max_position_embeddings
        self.rope = RopeTables(rope_inv_freq(config), positions, device)

    def flat_loop(self) -> FlatLayers | None:
        """These layers as one flat loop (flat_layers.py) for forward()'s `flat`, built from the
        weights as they are now; None where hooks on the layers forbid it."""
        return FlatLayers.of(self.layers, LlamaDecoderLayer)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: StepAttention,
        kv_cache: PagedKVCache,
        flat: FlatLayers | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] (several sequences flattened) -> final-normed hidden [T, d].

        positions drive RoPE; attn (its slot mapping and block tables) drives the cache. flat:
        these layers' flat loop (flat_loop()), taken for steps within its max_rows."""
        x = embedding(input_ids, self.embed_tokens)  # [T, d], the residual stream's start
        rotary = attn.backend.rotary(self.rope.cos, self.rope.sin, positions, x.dtype)
        if flat is not None and x.shape[0] <= flat.max_rows:
            x, residual = flat.run(x, rotary, attn, kv_cache)
            return attn.backend.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)
        residual = None
        # forward, not __call__: nn.Module's call wrapper costs two Python frames and its hook
        # checks per layer (a few % of a batch-1 CPU step), and nothing hooks a decoder layer
        # (tensor_parallel.py hooks self_attn and mlp, which are still called through it).
        for layer in self.layers:
            x, residual = layer.forward(x, residual, rotary, attn, kv_cache)
        assert residual is not None  # a model has layers
        return attn.backend.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> logits [N, V] float32 (tied embeddings unless lm_head exists)."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return linear(hidden, head).float()

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
        targets.update(per_layer(map(_layer_targets, self.layers)))
        return targets


def _layer_targets(layer: LlamaDecoderLayer) -> dict[str, torch.Tensor]:
    norms = ("input_layernorm", "post_attention_layernorm")
    targets = {f"{n}.weight": getattr(layer, n).weight for n in norms}
    return targets | layer.self_attn.hf_targets() | layer.mlp.hf_targets()
