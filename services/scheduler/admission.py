"""Checks a submitted request against the model it targets, and builds the scheduler's Request.
Everything a client can get wrong is caught here, with a message that says what to change."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.scheduler.kv_cache_manager import Windows, token_capacity
from services.scheduler.request import Request


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int
    block_size: int
    num_blocks: int
    eos_token_ids: frozenset[int]
    windows: Windows = (None,)  # the worker's KV cache groups (kv_cache_manager.group_windows)
    max_chunk: int = 0  # tokens one step computes for one request (max_num_batched_tokens)

    @property
    def kv_capacity(self) -> int:
        """The longest sequence one request can hold in the worker's KV cache."""
        return token_capacity(self.num_blocks, self.block_size, self.windows, self.max_chunk)


def admit(
    *,
    request_id: str,
    prompt_token_ids: list[int],
    max_tokens: MaxTokens,
    sampling: SamplingOptions,
    stop_token_ids: list[int],
    ignore_eos: bool,
    priority: int,
    trace_context: dict[str, str],
    limits: ModelLimits,
    tenant: str = "",
    resumed_output_tokens: int = 0,
) -> Request:
    """Raises InvalidArgument when the request can never run on this model. Resolves
    max_tokens, the one place it is: a cap is lowered to what fits, a strict one must fit."""
    if not request_id:
        raise InvalidArgument("request_id must not be empty")
    num_prompt = len(prompt_token_ids)
    if num_prompt == 0:
        raise InvalidArgument("the prompt must contain at least one token", param="prompt")
    bad = [t for t in prompt_token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise InvalidArgument(
            f"token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})", param="prompt"
        )
    if max_tokens.limit < 0:
        raise InvalidArgument(
            f"max_tokens must be positive, got {max_tokens.limit}", param="max_tokens"
        )
    if num_prompt >= limits.max_model_len:
        raise InvalidArgument(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, "
            f"your prompt has {num_prompt} tokens. Shorten the prompt.",
            param="prompt",
        )
    kv_capacity = limits.kv_capacity
    if num_prompt >= kv_capacity:
        # Checked apart: "what fits" below would be negative, and a request that can never
        # get its blocks would wait in the queue forever.
        raise InvalidArgument(
            f"your prompt has {num_prompt} tokens, but this worker's KV cache holds "
            f"{kv_capacity} tokens, prompt and completion together. Shorten the prompt.",
            param="prompt",
        )
    # What fits: in the context and in the worker's KV cache. Never below 1 here.
    resolved = max_tokens.resolve(min(limits.max_model_len, kv_capacity) - num_prompt)
    if num_prompt + resolved > limits.max_model_len:
        raise InvalidArgument(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, you "
            f"requested {num_prompt + resolved} tokens ({num_prompt} in the prompt, {resolved} "
            "for the completion). Reduce the prompt or max_tokens.",
            param="max_tokens",
        )
    if num_prompt + resolved > kv_capacity:
        raise InvalidArgument(
            f"{num_prompt + resolved} tokens exceed this worker's KV cache "
            f"({kv_capacity} tokens). Reduce the prompt or max_tokens.",
            param="max_tokens",
        )
    if not 0 <= resumed_output_tokens < num_prompt:
        raise InvalidArgument(
            f"resumed_output_tokens must be in [0, {num_prompt}), got {resumed_output_tokens}",
            param="resumed_output_tokens",
        )
    sampling.validate()
    stops = frozenset(stop_token_ids) | (frozenset() if ignore_eos else limits.eos_token_ids)
    # A migrated request's tokens already produced are its first outputs: positions (seeded
    # sampling), penalties, stops and max_tokens count them as they did before the move.
    split = num_prompt - resumed_output_tokens
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids[:split]),
        output_token_ids=list(prompt_token_ids[split:]),
        max_tokens=resolved + resumed_output_tokens,
        sampling=sampling,
        stop_token_ids=stops,
        priority=priority,
        tenant=tenant,
        trace_context=trace_context,
    )
