"""Completions' `echo`: a choice's first delta with the prompt in front of its text and, when
logprobs were asked for, the prompt's tokens in front of its tokens (the first with a null
logprob), as OpenAI's legacy completions API and vLLM return them."""

from __future__ import annotations

from dataclasses import replace

from services.gateway.backend import GenerationDelta


def echoed(delta: GenerationDelta, prompt: str | None) -> GenerationDelta:
    """`delta`, the first of its choice, with the prompt in front. prompt: the request's own
    prompt text; None for a token-id prompt, whose text the tokenizer sent (prompt_text)."""
    text = prompt if prompt is not None else (delta.prompt_text or "")
    logprobs = delta.logprobs
    if logprobs is not None and delta.prompt_logprobs is not None:
        logprobs = delta.prompt_logprobs + logprobs
    return replace(
        delta, text=text + delta.text, logprobs=logprobs, prompt_text=None, prompt_logprobs=None
    )
