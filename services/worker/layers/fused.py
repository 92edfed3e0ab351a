"""The fused projections every model's layers are built on: q/k/v as one [(H + 2 Hkv) D, d]
matrix and gate/up as one [2I, d], so that each layer issues fewer, larger matmuls (what matters
at small batch on the CPU). The subclass (LlamaAttention, Gemma3MLP, ...) adds what differs:
norms, activation, scaling. The weights are bare 2-D parameters used through F.linear, which is
what a quantized weight (quantized_weight.py) answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.layers.hf_names import attention_targets, mlp_targets
from services.worker.layers.quantized_weight import QuantizedWeight
from services.worker.layers.weights import empty_weight


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) with no bias. A QuantizedWeight answers F.linear through torch's
    __torch_function__, a Python round trip of several µs per call (at batch 1 on the CPU,
    SmolLM2 makes 120 such calls a step); its linear() is called here directly instead."""
    if isinstance(weight, QuantizedWeight):
        return weight.linear(x, None)
    return F.linear(x, weight)


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """F.embedding(ids, table), a QuantizedWeight's rows read without the __torch_function__
    round trip (once a step, as the output head's linear())."""
    if isinstance(table, QuantizedWeight):
        return table.embedding(ids)
    return F.embedding(ids, table)


class FusedAttention(nn.Module):
    """qkv_proj [(H + 2 Hkv) D, d] and o_proj [d, H D] of one layer, and its head layout."""

    def __init__(
        self,
        layer: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        qkv_rows = self.q_size + 2 * self.kv_size
        self.qkv_proj = empty_weight(qkv_rows, hidden_size, dtype=dtype, device=device)
        self.o_proj = empty_weight(hidden_size, self.q_size, dtype=dtype, device=device)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, d] -> q [T, H, D], k and v [T, Hkv, D]."""
        heads = self.num_heads + 2 * self.num_kv_heads
        qkv = linear(x, self.qkv_proj).view(x.shape[0], heads, self.head_dim)
        # One view and one split (two dispatches), not a split and three views; split_with_sizes
        # is Tensor.split without its Python wrapper (half of split's cost at batch 1).
        sizes = [self.num_heads, self.num_kv_heads, self.num_kv_heads]  # tensor_parallel shards
        q, k, v = qkv.split_with_sizes(sizes, 1)
        return q, k, v

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output [T, H, D] -> [T, d]."""
        return linear(out.reshape(out.shape[0], self.q_size), self.o_proj)

    def hf_targets(self) -> dict[str, torch.Tensor]:
        """HF names (within a layer) -> the slices of the fused weights holding them."""
        return attention_targets(self.qkv_proj, self.o_proj, self.q_size, self.kv_size)


class FusedGatedMLP(nn.Module):
    """gate_up_proj [2I, d] (gate | up) and down_proj [d, I]; the subclass picks the gate's
    activation."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        d, ffn = hidden_size, intermediate_size
        self.intermediate_size = ffn
        self.gate_up_proj = empty_weight(2 * ffn, d, dtype=dtype, device=device)
        self.down_proj = empty_weight(d, ffn, dtype=dtype, device=device)

    def hf_targets(self) -> dict[str, torch.Tensor]:
        """HF names (within a layer) -> the slices of the fused weights holding them."""
        return mlp_targets(self.gate_up_proj, self.down_proj, self.intermediate_size)
