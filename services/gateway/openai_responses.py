"""GenerationDeltas -> OpenAI response objects: text_completion, chat.completion, their stream
chunks, usage, logprobs and tool calls, in the shapes of OpenAI's OpenAPI document.

A tool call arrives whole (the tokenizer parses it once its JSON is complete) and streams as
OpenAI streams one: a delta with its index, id, type and name and empty arguments, then a
delta with the arguments. A choice that called a tool and stopped finishes with "tool_calls".
"""

from __future__ import annotations

import math
import time
from typing import Any

from services.gateway.backend import GenerationDelta, TokenLogprob, ToolCall
from services.gateway.openai_protocol import ParsedRequest, RequestKind
from services.gateway.prompt_echo import echoed

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
        self._called = [False] * n  # the choice has produced a tool call
        self._text_offsets = [0] * n
        self._echo = parsed.requests[0].echo  # completions: the prompt comes first
        self._prompt = parsed.requests[0].prompt  # None for a token-id prompt
        self._echoed = [False] * n
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

    def chunks(self, index: int, delta: GenerationDelta) -> list[JsonObject]:
        """The stream chunks for (possibly coalesced) deltas of one choice: none if they would
        say nothing (e.g. a token still waiting for the rest of its UTF-8 bytes), two more per
        tool call."""
        self._usage.add(index, delta)
        if delta.model:
            self._served[index] = delta.model
        first = not self._started[index]
        self._started[index] = True
        if self.kind is RequestKind.CHAT:
            choices = self._chat_chunk_choices(index, delta, first)
        elif first or delta.text or delta.finish_reason or self._has_logprobs(delta):
            choices = [self._completion_choice(index, delta)]
        else:
            choices = []
        model = self._served[index] or self._model
        bodies = [
            {**self._envelope(_CHUNK_OBJECT[self.kind], model), "choices": [c]} for c in choices
        ]
        for body in bodies:
            if self.include_usage:
                body["usage"] = None  # OpenAI: null on every chunk but the last
        return bodies

    def _has_logprobs(self, delta: GenerationDelta) -> bool:
        return self._wants_logprobs and bool(delta.logprobs)

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
        if result.tool_calls:
            self._called[index] = True
            message["content"] = result.text or None  # OpenAI: null beside tool calls
            message["tool_calls"] = [_tool_call_json(call) for call in result.tool_calls]
        return {
            "index": index,
            "message": message,
            "logprobs": self._chat_logprobs(result),
            "finish_reason": self._finish_reason(index, result.finish_reason),
        }

    def _finish_reason(self, index: int, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self._called[index] else reason

    def _completion_choice(self, index: int, delta: GenerationDelta) -> JsonObject:
        if self._echo and not self._echoed[index]:
            self._echoed[index] = True
            delta = echoed(delta, self._prompt)
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

    def _chat_chunk_choices(
        self, index: int, delta: GenerationDelta, first: bool
    ) -> list[JsonObject]:
        """The text's delta (when there is something to say), then two per tool call; the
        last one carries the finish reason."""
        deltas: list[tuple[JsonObject, JsonObject | None]] = []
        finish_alone = delta.finish_reason and not delta.tool_calls
        if first or delta.text or finish_alone or self._has_logprobs(delta):
            message: JsonObject = {"role": "assistant"} if first else {}
            if first or delta.text:
                message["content"] = delta.text
            deltas.append((message, self._chat_logprobs(delta)))
        for call in delta.tool_calls:
            self._called[index] = True
            header = _tool_call_json(call, arguments="")
            deltas.append(({"tool_calls": [{"index": call.index, **header}]}, None))
            arguments = {"index": call.index, "function": {"arguments": call.arguments}}
            deltas.append(({"tool_calls": [arguments]}, None))
        choices = [
            {"index": index, "delta": message, "logprobs": logprobs, "finish_reason": None}
            for message, logprobs in deltas
        ]
        if choices:
            choices[-1]["finish_reason"] = self._finish_reason(index, delta.finish_reason)
        return choices

    def _chat_logprobs(self, delta: GenerationDelta) -> JsonObject | None:
        if not self._wants_logprobs:
            return None
        return {"content": [chat_token_logprob(lp) for lp in delta.logprobs or []], "refusal": None}


def _tool_call_json(call: ToolCall, arguments: str | None = None) -> JsonObject:
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": call.arguments if arguments is None else arguments,
        },
    }


class UsageTally:
    """Token counts per choice. The prompt is shared, so it counts once (as OpenAI does);
    completions add up across choices. shared_prompt False (embeddings: each choice is its own
    input): the prompts add up too."""

    def __init__(self, n: int, shared_prompt: bool = True) -> None:
        self._shared_prompt = shared_prompt
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
        prompt = max(self._prompt) if self._shared_prompt else sum(self._prompt)
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
    tops: list[dict[str, float] | None] = []
    for lp in logprobs:
        offsets.append(text_offset)
        text_offset += len(lp.token)
        if lp.logprob is None:  # an echoed prompt's first token
            tops.append(None)
            continue
        top = {t.token: _finite(t.logprob) for t in lp.top}
        top.setdefault(lp.token, _finite(lp.logprob))
        tops.append(top)
    body = {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [None if lp.logprob is None else _finite(lp.logprob) for lp in logprobs],
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
