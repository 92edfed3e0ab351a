"""A Llama model's decoder layers as one flat loop, for the small steps of decoding.

A batch-1 CPU step of SmolLM2 runs ~9 ms, of which the ops themselves (4-bit linears, attention,
norms) are ~8: the rest is Python. Walking the module tree costs a good part of it: per layer,
nn.Module's call wrapper for self_attn and mlp, project_qkv / project_out / fused.linear /
QuantizedWeight.linear frames around each of the four matmuls, and a Module.__getattr__ look-up
for every submodule and weight read (~300 a step). This loop issues the very ops
LlamaDecoderLayer.forward issues, in its order and with the same arguments (so the same bits:
tests/unit/worker/test_flat_layers.py), from references gathered once: a measured ~1 ms less a
batch-1 step (11%, 1 thread, 4-bit weights).

The module tree stays the model: the loaders, tensor parallelism and every step too large for
the linears' direct calls (prefill chunks) go through it. A model with hooks on its layers
(tensor_parallel.py's all-reduce) is not flattened, nor anything but LlamaDecoderLayers: what a
hook or another layer class does is not in this loop (nor do global module hooks see it)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.layers.attention import StepAttention
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.layers.quantized_weight import QuantizedWeight

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Layer:
    index: int  # the layer's number (its KV cache slice)
    eps: float
    input_norm: torch.Tensor
    qkv: Linear
    heads: list[int]  # q, k, v heads: qkv's split
    head_dim: int
    q_size: int
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


def direct_linear(weight: torch.Tensor) -> tuple[Linear, int]:
    """(f, rows): f(x) == fused.linear(x, weight) for x [T, in] contiguous, T <= rows."""
    if isinstance(weight, QuantizedWeight):
        return weight.direct_linear()
    return functools.partial(F.linear, weight=weight), sys.maxsize


class FlatLayers:
    """LlamaModel's layer loop for steps of at most max_rows tokens (run())."""

    def __init__(self, layers: list[_Layer], max_rows: int) -> None:
        self.layers = layers
        self.max_rows = max_rows

    @classmethod
    def of(cls, model: nn.Module) -> FlatLayers | None:
        """The flat loop over a LlamaModel's layers as they are now (it holds their weights:
        build it once they are final, as ModelRunner does); None where it would not do what
        they do: another model, a layer of another class, or a hook on any module of it."""
        from services.worker.model.llama import LlamaDecoderLayer, LlamaModel  # imports this

        if type(model) is not LlamaModel:
            return None
        layers, max_rows = [], sys.maxsize
        for layer in model.layers:
            if type(layer) is not LlamaDecoderLayer or any(_hooked(m) for m in layer.modules()):
                return None
            attn, mlp = layer.self_attn, layer.mlp
            linears = [direct_linear(w) for w in (attn.qkv_proj, attn.o_proj)]
            linears += [direct_linear(w) for w in (mlp.gate_up_proj, mlp.down_proj)]
            max_rows = min([max_rows] + [rows for _, rows in linears])
            (qkv, _), (o, _), (gate_up, _), (down, _) = linears
            layers.append(
                _Layer(
                    attn.layer,
                    layer.eps,
                    layer.input_layernorm.weight,
                    qkv,
                    [attn.num_heads, attn.num_kv_heads, attn.num_kv_heads],
                    attn.head_dim,
                    attn.q_size,
                    o,
                    layer.post_attention_layernorm.weight,
                    gate_up,
                    down,
                )  # fmt: skip
            )
        return cls(layers, max_rows) if layers and max_rows > 0 else None

    def run(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        cache: PagedKVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LlamaDecoderLayer.forward of each layer in turn from the embedded x [T, d]: the last
        layer's MLP output and the residual stream (the caller adds and norms them)."""
        backend = attn.backend
        tokens = x.shape[0]
        residual = x
        for n, layer in enumerate(self.layers):
            if n == 0:
                h = backend.rms_norm(x, layer.input_norm, layer.eps)
            else:
                h = backend.add_rms_norm(x, residual, layer.input_norm, layer.eps)
            qkv = layer.qkv(h).view(tokens, -1, layer.head_dim)
            q, k, v = qkv.split_with_sizes(layer.heads, 1)
            out = attn.rope_and_attend(cache, layer.index, q, k, v, rotary)
            h = layer.o(out.reshape(tokens, layer.q_size))
            h = backend.add_rms_norm(h, residual, layer.post_norm, layer.eps)
            x = layer.down(backend.silu_mul(layer.gate_up(h)))
        return x, residual


def _hooked(module: nn.Module) -> bool:
    hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks)
    return any(hooks) or bool(getattr(module, "_backward_pre_hooks", None))
