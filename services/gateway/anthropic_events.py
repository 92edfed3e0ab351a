"""GenerationDeltas -> the Anthropic Messages API's `message` object and its stream events.

As for the Responses API (responses_events.py), one state machine serves both ways: deltas
open, fill and close content blocks (`text`, or a `tool_use` whose input streams as
`input_json_delta`), each step an event, between `message_start` and `message_delta` (the
stop reason and the output tokens) + `message_stop`. A non-streaming answer is what the same
steps leave behind.

Usage follows Anthropic's split: `input_tokens` are the prompt tokens not read from the prefix
cache, `cache_read_input_tokens` those that were.
"""

from __future__ import annotations

import json
from typing import Any

from services.gateway.anthropic_errors import anthropic_error_body
from services.gateway.backend import GenerationDelta, ToolCall
from services.gateway.http_json import error_payload, named_sse_event
from services.gateway.openai_responses import UsageTally

JsonObject = dict[str, Any]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _stop_reason(finish_reason: str, stop_sequence: str | None, called: bool) -> str:
    if called:
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason, "end_turn")


class MessagesRenderer:
    def __init__(self, message_id: str, model: str) -> None:
        self._id = message_id
        self._model = model
        self._content: list[JsonObject] = []
        self._text_open = False  # the last content block is a text block still being written
        self._called = False
        self._usage = UsageTally(1)
        self._started = False
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None  # the stop string that ended the message

    # -- the Renderer protocol (http_generation.py) --

    def response(self, results: list[GenerationDelta]) -> JsonObject:
        self._steps(results[0])
        return self.message()

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        return [named_sse_event(event) for event in self._steps(delta)]

    def closing(self) -> list[bytes]:
        return []  # message_stop ended it

    def error(self, error: BaseException) -> bytes:
        status = getattr(error, "http_status", 500)
        message = error_payload(error)["error"]["message"]
        return named_sse_event(anthropic_error_body(status, message))

    # -- the state machine --

    def message(self) -> JsonObject:
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [dict(block) for block in self._content],
            "stop_reason": self._stop_reason,
            "stop_sequence": self._stop_sequence,
            "usage": self._usage_json(),
        }

    def _steps(self, delta: GenerationDelta) -> list[JsonObject]:
        events: list[JsonObject] = []
        self._usage.add(0, delta)
        self._model = delta.model or self._model
        if not self._started:
            self._started = True
            start = {**self.message(), "content": []}
            events.append({"type": "message_start", "message": start})
        if delta.text:
            events += self._text(delta.text)
        for call in delta.tool_calls:
            events += self._close_text()
            events += self._tool_use(call)
        if delta.finish_reason is not None:
            events += self._close_text()
            self._stop_sequence = delta.stop_sequence
            self._stop_reason = _stop_reason(delta.finish_reason, delta.stop_sequence, self._called)
            output_tokens = self._usage_json()["output_tokens"]
            events.append(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": self._stop_reason,
                        "stop_sequence": self._stop_sequence,
                    },
                    "usage": {"output_tokens": output_tokens},
                }
            )
            events.append({"type": "message_stop"})
        return events

    def _text(self, text: str) -> list[JsonObject]:
        events = []
        index = len(self._content) - 1
        if not self._text_open:
            self._content.append({"type": "text", "text": ""})
            self._text_open = True
            index += 1
            block = {"type": "text", "text": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        self._content[index]["text"] += text
        delta = {"type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": index, "delta": delta})
        return events

    def _close_text(self) -> list[JsonObject]:
        if not self._text_open:
            return []
        self._text_open = False
        return [{"type": "content_block_stop", "index": len(self._content) - 1}]

    def _tool_use(self, call: ToolCall) -> list[JsonObject]:
        self._called = True
        index = len(self._content)
        try:
            tool_input = json.loads(call.arguments or "{}")
        except ValueError:  # the stack sends complete JSON; an object either way
            tool_input = {}
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input}
        self._content.append(block)
        partial = {"type": "input_json_delta", "partial_json": call.arguments}
        return [
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {**block, "input": {}},
            },
            {"type": "content_block_delta", "index": index, "delta": partial},
            {"type": "content_block_stop", "index": index},
        ]

    def _usage_json(self) -> JsonObject:
        counts = self._usage.as_json()
        cached = counts["prompt_tokens_details"]["cached_tokens"]
        return {
            "input_tokens": counts["prompt_tokens"] - cached,
            "output_tokens": counts["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }


class TokenCountRenderer:
    """POST /v1/messages/count_tokens: the prompt's token count (never streamed)."""

    def response(self, results: list[GenerationDelta]) -> JsonObject:
        return {"input_tokens": results[0].prompt_tokens}

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        raise AssertionError("count_tokens does not stream")

    def closing(self) -> list[bytes]:
        raise AssertionError("count_tokens does not stream")

    def error(self, error: BaseException) -> bytes:
        raise AssertionError("count_tokens does not stream")
