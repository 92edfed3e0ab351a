"""The BERT encoder of sentence-embedding models (all-MiniLM-L6-v2 and its kin).

Unlike llama.py and gemma3.py it never decodes: every token of a prompt attends to every other
(bidirectional attention), so a prompt is encoded whole, in one call, and keeps no KV cache.
Sequences are batched padded, [S, L], with a key mask that hides the padding. Post-norm
residual blocks (LayerNorm after each add), biases everywhere, erf GeLU, learned absolute
positions and token-type embeddings (type 0: one segment per prompt). q/k/v are one fused
projection, as in the decoders."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.layers.weights import copy_hf_weights, empty_weight
from services.worker.model.bert_config import UNUSED_TENSORS, BertConfig


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_weight(dim, dtype=dtype, device=device)
        self.bias = empty_weight(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class Linear(nn.Module):
    def __init__(self, out: int, inp: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = empty_weight(out, inp, dtype=dtype, device=device)
        self.bias = empty_weight(out, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = Linear(3 * d, d, dtype, device)  # rows [query | key | value]
        self.attention_out = Linear(d, d, dtype, device)
        self.attention_norm = LayerNorm(d, eps, dtype, device)
        self.intermediate = Linear(config.intermediate_size, d, dtype, device)
        self.output = Linear(d, config.intermediate_size, dtype, device)
        self.output_norm = LayerNorm(d, eps, dtype, device)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x [S, L, d], key_mask [S, 1, 1, L] (True: a real token) -> [S, L, d]."""
        s, length, d = x.shape
        qkv = self.qkv(x).view(s, length, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [S, H, L, D]
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # [S, H, L, D]
        x = self.attention_norm(
            x + self.attention_out(context.transpose(1, 2).reshape(s, length, d))
        )
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))

    def hf_targets(self) -> dict[str, torch.Tensor]:
        d = self.num_heads * self.head_dim
        targets: dict[str, torch.Tensor] = {}
        for i, name in enumerate(("query", "key", "value")):
            targets[f"attention.self.{name}.weight"] = self.qkv.weight[i * d : (i + 1) * d]
            targets[f"attention.self.{name}.bias"] = self.qkv.bias[i * d : (i + 1) * d]
        modules = {
            "attention.output.dense": self.attention_out,
            "attention.output.LayerNorm": self.attention_norm,
            "intermediate.dense": self.intermediate,
            "output.dense": self.output,
            "output.LayerNorm": self.output_norm,
        }
        for prefix, module in modules.items():
            targets |= {f"{prefix}.weight": module.weight, f"{prefix}.bias": module.bias}
        return targets


class BertModel(nn.Module):
    is_encoder = True  # the worker runs it with EncoderRunner, not the decoders' ModelRunner

    def __init__(
        self,
        config: BertConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config = config
        d = config.hidden_size
        self.word_embeddings = empty_weight(config.vocab_size, d, dtype=dtype, device=device)
        self.position_embeddings = empty_weight(
            config.max_position_embeddings, d, dtype=dtype, device=device
        )
        self.token_type_embeddings = empty_weight(
            config.type_vocab_size, d, dtype=dtype, device=device
        )
        self.embeddings_norm = LayerNorm(d, config.layer_norm_eps, dtype, device)
        self.layers = nn.ModuleList(
            BertLayer(config, dtype, device) for _ in range(config.num_layers)
        )

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """input_ids [S, L] (each row a whole prompt, right-padded with anything), lengths [S]
        -> last hidden states [S, L, d]; rows past a prompt's length are meaningless."""
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)  # [L]
        real = positions[None, :] < lengths[:, None]  # [S, L]
        x = F.embedding(input_ids, self.word_embeddings) + self.position_embeddings[positions]
        x = self.embeddings_norm(x + self.token_type_embeddings[0])
        key_mask = real[:, None, None, :]  # [S, 1, 1, L]: no query reads a padding key
        for layer in self.layers:
            x = layer(x, key_mask)
        return x

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies Hugging Face-named BertModel weights in; every parameter must be covered."""
        copy_hf_weights(self.hf_weights(), tensors, "BERT", lambda n: n.startswith(UNUSED_TENSORS))

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """HF name -> the parameter, or the slice of the fused q/k/v one, holding it."""
        targets = {
            "embeddings.word_embeddings.weight": self.word_embeddings,
            "embeddings.position_embeddings.weight": self.position_embeddings,
            "embeddings.token_type_embeddings.weight": self.token_type_embeddings,
            "embeddings.LayerNorm.weight": self.embeddings_norm.weight,
            "embeddings.LayerNorm.bias": self.embeddings_norm.bias,
        }
        for i, layer in enumerate(self.layers):
            targets |= {f"encoder.layer.{i}.{n}": t for n, t in layer.hf_targets().items()}
        return targets
