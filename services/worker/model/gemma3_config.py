"""The shape and numerics of a Gemma 3 text model.

Gemma 3 keeps every field a Llama model has (the KV cache, the runner and the scheduler read only
those, so it subclasses LlamaConfig) and adds: sliding-window layers interleaved with global
ones, each kind with its own RoPE base; a query scale from query_pre_attn_scalar rather than
head_dim; optional final-logit soft-capping; and linear RoPE scaling on the global layers of
the larger models."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model.config import LlamaConfig

SLIDING = "sliding_attention"
FULL = "full_attention"
# Gemma 3: five sliding-window layers, then one global layer, repeated.
DEFAULT_SLIDING_PATTERN = 6
DEFAULT_LOCAL_ROPE_THETA = 10_000.0


@dataclass(frozen=True, slots=True)
class Gemma3Config(LlamaConfig):
    layer_types: tuple[str, ...] = ()  # one of SLIDING / FULL per layer
    sliding_window: int = 512  # a sliding layer's query sees itself and window - 1 keys before
    rope_local_theta: float = DEFAULT_LOCAL_ROPE_THETA  # RoPE base of the sliding layers
    rope_linear_factor: float = 1.0  # global layers' positions divided by this
    query_pre_attn_scalar: float = 256.0  # attention scores are scaled by its inverse sqrt
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        LlamaConfig.__post_init__(self)
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}; expected {SLIDING}, {FULL}")
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.rope_scaling is not None:
            raise ValueError("Gemma 3 uses linear RoPE scaling (rope_linear_factor), not llama3")

    def window(self, layer: int) -> int | None:
        """The attention window of one layer: sliding_window, or None for a global layer."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def rope_inv_freq(self, layer_type: str) -> torch.Tensor:
        """[head_dim // 2] float32 inverse frequencies for the sliding or the global layers."""
        local = layer_type == SLIDING
        theta = self.rope_local_theta if local else self.rope_theta
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
        inv_freq = 1.0 / (theta**exponents)
        if not local:
            inv_freq = inv_freq / self.rope_linear_factor
        return inv_freq.to(torch.float32)


def pattern_layer_types(num_layers: int, pattern: int) -> tuple[str, ...]:
    """Every `pattern`-th layer global, the rest sliding (HF's sliding_window_pattern)."""
    if pattern < 1:
        raise ValueError(f"the sliding-window pattern must be positive, got {pattern}")
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers))
