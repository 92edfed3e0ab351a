"""GenerationDeltas -> OpenAI response objects: text_completion, chat.completion, their stream
chunks, usage and logprobs, in the shapes of OpenAI's OpenAPI document."""

from __future__ import annotations

import math
import time
from typing import Any

from services.gateway.backend import GenerationDelta, TokenLogprob
from services.gateway.openai_protocol import ParsedRequest, RequestKind

JsonObject = dict[str, Any]

# OpenAI's stand-in for "too unlikely to say": JSON has no -Infinity, and a sampler may report
# one for a token outside top-p.
_UNLIKELY_LOGPROB = -9999.0
_CHUNK_OBJECT = {
    RequestKind.COMPLETION: "text_completion",
    RequestKind.CHAT: "chat.completion.chunk",
}


class ResponseBuilder:
    """Builds every object of one request's response. Streaming state lives here: which choices
    have announced their role, each choice's text offset, and the usage tally."""

    def __init__(self, parsed: ParsedRequest, created: int | None = None) -> None:
        self.kind = parsed.kind
        self.include_usage = parsed.include_usage
        self._id = parsed.response_id
        self._created = int(time.time()) if created is None else created
        self._model = parsed.model  # as requested: maybe an alias
        n = len(parsed.requests)
        # Per choice, the model that serves it (an alias's target), once a delta names it.
        self._served = [""] * n
        self._wants_logprobs = parsed.requests[0].sampling.logprobs is not None
        self._started = [False] * n
        self._text_offsets = [0] * n
        self._usage = UsageTally(n)

    def response(self, results: list[GenerationDelta]) -> JsonObject:
        """The non-streaming object; results[i] is choice i's whole output as one delta."""
        for index, result in enumerate(results):
            self._usage.add(index, result)
            self._served[index] = result.model
        choices = [self._full_choice(i, r) for i, r in enumerate(results)]
        return {
            **self._envelope(self.kind.value, self._response_model()),
            "choices": choices,
            "usage": self._usage.as_json(),
        }

    def chunk(self, index: int, delta: GenerationDelta) -> JsonObject | None:
        """The stream chunk for (possibly coalesced) deltas of one choice; None if it would say
        nothing (e.g. a token still waiting for the rest of its UTF-8 bytes)."""
        self._usage.add(index, delta)
        if delta.model:
            self._served[index] = delta.model
        first = not self._started[index]
        self._started[index] = True
        has_logprobs = self._wants_logprobs and bool(delta.logprobs)
        if not (first or delta.text or delta.finish_reason or has_logprobs):
            return None
        choice = (
            self._chat_chunk_choice(index, delta, first)
            if self.kind is RequestKind.CHAT
            else self._completion_choice(index, delta)
        )
        model = self._served[index] or self._model
        body = {**self._envelope(_CHUNK_OBJECT[self.kind], model), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return body

    def usage_chunk(self) -> JsonObject:
        """The last chunk when stream_options.include_usage: no choices, the whole usage."""
        envelope = self._envelope(_CHUNK_OBJECT[self.kind], self._response_model())
        return {**envelope, "choices": [], "usage": self._usage.as_json()}

    def _response_model(self) -> str:
        """The model named for the whole response: the one that served the first choice. (An
        alias routes each of n choices on its own; each stream chunk names its choice's.)"""
        return next((m for m in self._served if m), self._model)

    def _envelope(self, object_name: str, model: str) -> JsonObject:
        return {
            "id": self._id,
            "object": object_name,
            "created": self._created,
            "model": model,
        }

    def _full_choice(self, index: int, result: GenerationDelta) -> JsonObject:
        if self.kind is RequestKind.COMPLETION:
            return self._completion_choice(index, result)
        message = {"role": "assistant", "content": result.text, "refusal": None}
        return {
            "index": index,
            "message": message,
            "logprobs": self._chat_logprobs(result),
            "finish_reason": result.finish_reason,
        }

    def _completion_choice(self, index: int, delta: GenerationDelta) -> JsonObject:
        logprobs = None
        if self._wants_logprobs:
            logprobs, self._text_offsets[index] = completion_logprobs(
                delta.logprobs or [], self._text_offsets[index]
            )
        return {
            "index": index,
            "text": delta.text,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
        }

    def _chat_chunk_choice(self, index: int, delta: GenerationDelta, first: bool) -> JsonObject:
        message: JsonObject = {"role": "assistant"} if first else {}
        if first or delta.text:
            message["content"] = delta.text
        return {
            "index": index,
            "delta": message,
            "logprobs": self._chat_logprobs(delta),
            "finish_reason": delta.finish_reason,
        }

    def _chat_logprobs(self, delta: GenerationDelta) -> JsonObject | None:
        if not self._wants_logprobs:
            return None
        return {"content": [chat_token_logprob(lp) for lp in delta.logprobs or []], "refusal": None}


class UsageTally:
    """Token counts per choice. The prompt is shared, so it counts once (as OpenAI does);
    completions add up across choices."""

    def __init__(self, n: int) -> None:
        self._prompt = [0] * n
        self._cached = [0] * n
        self._completion = [0] * n
        self._tokens_seen = [0] * n

    def add(self, index: int, delta: GenerationDelta) -> None:
        """Deltas carry running totals; token ids are counted too, as a floor."""
        self._tokens_seen[index] += len(delta.token_ids)
        self._prompt[index] = max(self._prompt[index], delta.prompt_tokens)
        self._cached[index] = max(self._cached[index], delta.cached_tokens)
        self._completion[index] = max(
            self._completion[index], delta.completion_tokens, self._tokens_seen[index]
        )

    def as_json(self) -> JsonObject:
        prompt = max(self._prompt)
        completion = sum(self._completion)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # Cached for every choice, so no choice claims a hit that another did not get.
            "prompt_tokens_details": {"cached_tokens": min(self._cached)},
        }


def completion_logprobs(logprobs: list[TokenLogprob], text_offset: int) -> tuple[JsonObject, int]:
    """The legacy completions shape, and the text offset after these tokens. top_logprobs
    always holds the sampled token too, so it has up to logprobs+1 entries, as OpenAI's does."""
    offsets: list[int] = []
    tops: list[dict[str, float]] = []
    for lp in logprobs:
        offsets.append(text_offset)
        text_offset += len(lp.token)
        top = {t.token: _finite(t.logprob) for t in lp.top}
        top.setdefault(lp.token, _finite(lp.logprob))
        tops.append(top)
    body = {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, text_offset


def chat_token_logprob(lp: TokenLogprob) -> JsonObject:
    return {
        "token": lp.token,
        "logprob": _finite(lp.logprob),
        "bytes": list(lp.token_bytes),
        "top_logprobs": [
            {"token": t.token, "logprob": _finite(t.logprob), "bytes": list(t.token_bytes)}
            for t in lp.top
        ],
    }


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _UNLIKELY_LOGPROB
