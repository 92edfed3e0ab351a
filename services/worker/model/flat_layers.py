"""A Llama model's decoder layers as one flat loop, for the small steps of decoding.

A batch-1 CPU step of SmolLM2 runs ~9 ms, of which the ops themselves (4-bit linears, attention,
norms) are ~8: the rest is Python. Walking the module tree costs a good part of it: per layer,
nn.Module's call wrapper for self_attn and mlp, project_qkv / project_out / fused.linear /
QuantizedWeight.linear frames around each of the four matmuls, and a Module.__getattr__ look-up
for every submodule and weight read (~300 a step). This loop issues the very ops
LlamaDecoderLayer.forward issues, in its order and with the same arguments (so the same bits:
tests/unit/worker/test_flat_layers.py), from references gathered once. For the CPU default
(float32, every linear 4-bit, the extension's attention) the loop runs in C++
(csrc/llama_layers.cpp: the same ops, called through torch's dispatcher). Batch-1 sampled, CPU
time a token (b7d56f7): module tree 11.98 ms, this loop in Python 11.18, in C++ 10.51.

The module tree stays the model: the loaders, tensor parallelism and every step too large for
the linears' direct calls go through it. A model with hooks on its layers (tensor_parallel.py's
all-reduce) is not flattened, nor anything but LlamaDecoderLayers: what a hook or another layer
class does is not in this loop (nor do global module hooks see it)."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.worker.layers.attention import StepAttention
from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.int4_weight import Int4Weight
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


@dataclass(frozen=True, slots=True)
class _Native:
    """What csrc/llama_layers.cpp takes of the weights: every linear 4-bit through one op,
    q4_linear, q4_q16_linear or q4_q8_linear (activations "float32", "int16", "int8")."""

    norms: list[torch.Tensor]  # per layer: input, post-attention
    packed: list[torch.Tensor]  # per layer: qkv, o, gate_up, down
    pairs: list[torch.Tensor]
    out_rows: list[int]
    shape: list[int]  # H, Hkv, D
    eps: float
    activations: str


class FlatLayers:
    """LlamaModel's layer loop for steps of at most max_rows tokens (run())."""

    def __init__(self, layers: list[_Layer], max_rows: int, native: _Native | None) -> None:
        self.layers = layers
        self.max_rows = max_rows
        # The whole loop in one C++ call (csrc/llama_layers.cpp) where the step allows it.
        self.native = native
        self._caches: tuple[PagedKVCache, list[list[torch.Tensor]] | None] | None = None

    @classmethod
    def of(cls, decoder_layers: nn.ModuleList, layer_class: type) -> FlatLayers | None:
        """The flat loop over a LlamaModel's layers as they are now (LlamaModel.flat_loop; it
        holds their weights: build it once they are final, as ModelRunner does); None where it
        would not do what they do: a layer not of layer_class (LlamaDecoderLayer, whose forward
        this loop is), or a hook on any module of a layer."""
        layers, max_rows = [], sys.maxsize
        for layer in decoder_layers:
            if type(layer) is not layer_class or any(_hooked(m) for m in layer.modules()):
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
        if not layers or max_rows <= 0:
            return None
        return cls(layers, max_rows, _native(decoder_layers))

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
        if self.native is not None and _native_step(backend, attn):
            views = self._native_caches(cache)
            if views is not None:
                return self._run_native(x, rotary, attn, views)
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

    def _native_caches(self, cache: PagedKVCache) -> list[list[torch.Tensor]] | None:
        """llama_layers' cache arguments, each a list over the layers (made once per cache):
        k_flat, v_flat, k_cache, v_cache, then an int8 cache's k_scale_flat, v_scale_flat,
        k_scale, v_scale (empty lists for float32); None for a bfloat16 cache."""
        if self._caches is None or self._caches[0] is not cache:
            kinds = None
            if cache.quantized or cache.dtype == torch.float32:
                flat = [cache.flat_layer(layer.index) for layer in self.layers]
                paged = [cache.layer(layer.index) for layer in self.layers]
                # a float32 cache's views are (K, V); an int8 cache's (K, V, K scales, V scales)
                kinds = [
                    [v[j] for v in views if j < len(v)]
                    for j, views in ((0, flat), (1, flat), (0, paged), (1, paged),
                                     (2, flat), (3, flat), (2, paged), (3, paged))
                ]  # fmt: skip
            self._caches = (cache, kinds)
        return self._caches[1]

    def _run_native(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attn: StepAttention,
        views: list[list[torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        native, meta = self.native, attn.groups[0]
        assert native is not None
        backend = attn.backend
        return torch.ops.layerserve.llama_layers(
            x, native.norms, native.packed, native.pairs, native.out_rows, *rotary, *views,
            meta.slot_mapping, meta.query_start,
            meta.context_lens_device, meta.block_tables, native.shape, native.eps,
            1.0 / math.sqrt(native.shape[2]), backend.avx512_bf16, native.activations,
        )  # fmt: skip


def _native(decoder_layers: nn.ModuleList) -> _Native | None:
    """The C++ loop's weight arguments, where every linear is 4-bit through one op (q4_linear,
    q4_q16_linear or q4_q8_linear) at any row count and the norms float32 with one eps; else
    None."""
    if not _library_has("llama_layers"):
        return None
    norms, packed, pairs, out_rows = [], [], [], []
    eps = {layer.eps for layer in decoder_layers}
    activations = set()
    for layer in decoder_layers:
        attn, mlp = layer.self_attn, layer.mlp
        for weight in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            if not isinstance(weight, Int4Weight) or weight.op_rows != sys.maxsize:
                return None
            activations.add(weight.activations)
            packed.append(weight.packed)
            pairs.append(weight.pairs)
            out_rows.append(weight.out_features)
        norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    if len(eps) != 1 or len(activations) != 1:
        return None
    if any(norm.dtype != torch.float32 for norm in norms):
        return None
    first = decoder_layers[0].self_attn
    shape = [first.num_heads, first.num_kv_heads, first.head_dim]
    return _Native(norms, packed, pairs, out_rows, shape, eps.pop(), activations.pop())


def _native_step(backend, attn: StepAttention) -> bool:
    """Whether this step is one the C++ loop does as the Python one would: the CPU
    extension's backend with its own metadata, one KV cache group."""
    return (
        isinstance(backend, CpuAttention)
        and len(attn.groups) == 1
        and attn.groups[0].context_lens_device is not None
    )


def _library_has(name: str) -> bool:
    try:
        getattr(torch.ops.layerserve, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _hooked(module: nn.Module) -> bool:
    hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks)
    return any(hooks) or bool(getattr(module, "_backward_pre_hooks", None))
