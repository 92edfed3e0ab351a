"""The gateway's bounds on one request, set by the operator (see GatewayConfig)."""

from __future__ import annotations

from dataclasses import dataclass

# Why 128: a prompt of B UTF-8 bytes needs at least B / L tokens, where L is the longest token
# of the vocabulary in bytes (byte-level BPE and byte-fallback vocabularies cover every byte, so
# no token covers less than one). SmolLM2's longest token is 81 bytes, Gemma 3's 48 (runs of
# spaces and punctuation); 128 leaves room for other Llama-family vocabularies. A prompt of more
# than max_prompt_tokens * L bytes can therefore never fit, and is refused before tokenizing.
DEFAULT_MAX_BYTES_PER_TOKEN = 128


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 0  # 0: up to the model's context length
    max_tokens: int = 0  # most tokens one choice may generate; 0: up to the context length
    max_n: int = 16
    max_stop_sequences: int = 4
    # n x max_tokens of one request: what it may make the stack generate, and what it reserves
    # against its key's token bucket. A request over it is a 400, not a truncation.
    max_request_tokens: int = 32768
    # For a request that sets no max_tokens (chat and gRPC; completions keep OpenAI's 16).
    default_max_tokens: int = 1024
    max_stop_length: int = 256  # characters of one stop string
    max_stop_token_ids: int = 64
    max_bytes_per_token: int = DEFAULT_MAX_BYTES_PER_TOKEN
    # A stream whose client has not taken a chunk for this long is cut off and aborted.
    stalled_client_seconds: float = 30.0
    # Counts of a chat request's parts, bounded before anything is built from them: each one
    # costs the gateway objects and the template tokens even when it holds no text.
    max_messages: int = 2048
    max_tools: int = 128  # also the tool calls of one assistant turn (OpenAI caps tools at 128)
    max_content_parts: int = 256  # parts of one message's content array
    # The HTTP door: a connection that has not sent a whole request head this long after it
    # opened (or after its previous response) is closed, an idle keep-alive one as a slow one;
    # a body not received whole within body_timeout_s of its head is a 408.
    http_idle_timeout_s: float = 5.0
    http_body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_n",
            "max_stop_sequences",
            "max_request_tokens",
            "default_max_tokens",
            "max_stop_length",
            "max_stop_token_ids",
            "max_bytes_per_token",
            "max_messages",
            "max_tools",
            "max_content_parts",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_prompt_tokens", "max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (no limit) or positive")
        for name in ("stalled_client_seconds", "http_idle_timeout_s", "http_body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


DEFAULT_LIMITS = RequestLimits()
