"""The gateway's bounds on one request, set by the operator (see GatewayConfig)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 0  # 0: up to the model's context length
    max_tokens: int = 0  # most tokens one choice may generate; 0: up to the context length
    max_n: int = 16
    max_stop_sequences: int = 4

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_n", "max_stop_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_prompt_tokens", "max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (no limit) or positive")


DEFAULT_LIMITS = RequestLimits()
