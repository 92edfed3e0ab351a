"""GenerationDeltas -> the Responses API's `response` object and its typed stream events.

One state machine serves both: each delta opens, fills and closes output items (a `message`
with one `output_text` part, a `function_call`, or a `custom_tool_call` for a call of a custom
tool, whose text is its function's `input` argument), and every step is an event
(`response.output_item.added`, `response.output_text.delta`, ...). A stream writes the events;
the whole object is what the same steps leave behind, so both ways answer alike. Every event
carries `sequence_number`, counted from 0 at `response.created`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.common.errors import LayerserveError, ResourceExhausted
from services.gateway.backend import GenerationDelta, ToolCall
from services.gateway.http_json import error_payload, named_sse_event
from services.gateway.openai_responses import UsageTally
from services.gateway.responses_tools import (
    ToolName,
    custom_arguments,
    custom_input,
    flat_name,
    tool_names,
)

JsonObject = dict[str, Any]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRenderer:
    """Renders one response. `fields`: what the response echoes of its request (model,
    instructions, tools, tool_choice, text, temperature, ...)."""

    def __init__(self, response_id: str, fields: JsonObject, created: int | None = None) -> None:
        self.response_id = response_id
        self._fields = fields
        self._created = int(time.time()) if created is None else created
        self._model = fields["model"]
        self._tool_names = tool_names(fields["tools"])  # the custom and namespaced ones
        self._output: list[JsonObject] = []
        self._message: JsonObject | None = None  # the message item being written, if any
        self._usage = UsageTally(1)
        self._sequence = 0
        self._started = False
        self._completed_at: int | None = None
        self.status = "in_progress"  # completed | incomplete | failed at the end

    # -- the Renderer protocol (http_generation.py) --

    def response(self, results: list[GenerationDelta]) -> JsonObject:
        self._steps(results[0])
        return self.snapshot()

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        return [named_sse_event(event) for event in self._steps(delta)]

    def closing(self) -> list[bytes]:
        return []  # response.completed already said it all; no [DONE] in this API

    def error(self, error: BaseException) -> bytes:
        self.status = "failed"
        body = error_payload(error)["error"]
        code = body["code"] if isinstance(error, LayerserveError) else "server_error"
        failed = self.snapshot()
        failed["error"] = {"code": _response_error_code(error), "message": body["message"]}
        events = [
            self._event("error", code=code, message=body["message"], param=body["param"]),
            self._event("response.failed", response=failed),
        ]
        return b"".join(named_sse_event(event) for event in events)

    # -- the state machine --

    def snapshot(self) -> JsonObject:
        """The response object as it stands."""
        finished = self.status in ("completed", "incomplete")
        # OpenAI's schema has no null usage: a response in progress has none yet.
        usage = {"usage": _usage(self._usage.as_json())} if self.status != "in_progress" else {}
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self._created,
            "completed_at": self._completed_at if finished else None,
            "status": self.status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if self.status == "incomplete" else None
            ),
            **self._fields,
            "model": self._model,
            "output": list(self._output),
            **usage,
        }

    def _steps(self, delta: GenerationDelta) -> list[JsonObject]:
        events: list[JsonObject] = []
        self._usage.add(0, delta)
        self._model = delta.model or self._model
        if not self._started:
            self._started = True
            events.append(self._event("response.created", response=self.snapshot()))
            events.append(self._event("response.in_progress", response=self.snapshot()))
        if delta.text:
            events += self._text(delta.text)
        for call in delta.tool_calls:
            events += self._close_message()
            named = self._tool_names.get(call.name, ToolName(call.name))
            events += (
                self._custom_call(call, named) if named.custom else self._function_call(call, named)
            )
        if delta.finish_reason is not None:
            if not self._output and self._message is None:
                events += self._open_message()  # nothing said: still one (empty) message
            events += self._close_message()
            self.status = "incomplete" if delta.finish_reason == "length" else "completed"
            self._completed_at = int(time.time())
            kind = f"response.{self.status}"
            events.append(self._event(kind, response=self.snapshot()))
        return events

    def _text(self, text: str) -> list[JsonObject]:
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        self._message["content"][0]["text"] += text
        events.append(
            self._event("response.output_text.delta", **self._part_place(), delta=text, logprobs=[])
        )
        return events

    def _open_message(self) -> list[JsonObject]:
        self._message = {
            "id": item_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        added = self._event(
            "response.output_item.added", output_index=len(self._output), item=_copy(self._message)
        )
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._message["content"].append(part)
        place = self._part_place()
        part_added = self._event("response.content_part.added", **place, part=dict(part))
        return [added, part_added]

    def _close_message(self) -> list[JsonObject]:
        message = self._message
        if message is None:
            return []
        place = self._part_place()
        part = message["content"][0]
        message["status"] = "completed"
        self._message = None
        self._output.append(message)
        return [
            self._event("response.output_text.done", **place, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", **place, part=_copy(part)),
            self._event(
                "response.output_item.done",
                output_index=place["output_index"],
                item=_copy(message),
            ),
        ]

    def _function_call(self, call: ToolCall, named: ToolName) -> list[JsonObject]:
        item = {
            "id": item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            **_name(named),
            "arguments": "",
        }
        index = len(self._output)
        place = {"item_id": item["id"], "output_index": index}
        added = self._event("response.output_item.added", output_index=index, item=_copy(item))
        item.update(arguments=call.arguments, status="completed")
        self._output.append(item)
        return [
            added,
            self._event("response.function_call_arguments.delta", **place, delta=call.arguments),
            self._event(
                "response.function_call_arguments.done",
                **place,
                name=named.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _custom_call(self, call: ToolCall, named: ToolName) -> list[JsonObject]:
        text = custom_input(call.arguments)
        item = {
            "id": item_id("ctc"),
            "type": "custom_tool_call",
            "status": "in_progress",
            "call_id": call.id,
            **_name(named),
            "input": "",
        }
        index = len(self._output)
        place = {"item_id": item["id"], "output_index": index}
        added = self._event("response.output_item.added", output_index=index, item=_copy(item))
        item.update(input=text, status="completed")
        self._output.append(item)
        return [
            added,
            self._event("response.custom_tool_call_input.delta", **place, delta=text),
            self._event("response.custom_tool_call_input.done", **place, input=text),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _part_place(self) -> JsonObject:
        assert self._message is not None
        index = len(self._output)  # the open message is the next output item
        return {"item_id": self._message["id"], "output_index": index, "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> JsonObject:
        event = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return event


def assistant_turn(output: list[JsonObject]) -> JsonObject:
    """A response's output items as the chat message that continues the conversation."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {
                "name": flat_name(item.get("namespace"), item["name"]),
                "arguments": _arguments(item),
            },
        }
        for item in output
        if item["type"] in ("function_call", "custom_tool_call")
    ]
    turn: JsonObject = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _name(named: ToolName) -> JsonObject:
    """A call item's name, and its namespace when it has one."""
    return {"name": named.name, **({"namespace": named.namespace} if named.namespace else {})}


def _arguments(call: JsonObject) -> str:
    if call["type"] == "custom_tool_call":
        return custom_arguments(call["input"])
    return call["arguments"]


def _usage(counts: JsonObject) -> JsonObject:
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": counts["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def _response_error_code(error: BaseException) -> str:
    return "rate_limit_exceeded" if isinstance(error, ResourceExhausted) else "server_error"


def _copy(obj: JsonObject) -> JsonObject:
    """A snapshot for an event: the item goes on changing after it is sent."""
    return {
        key: [dict(p) for p in value] if isinstance(value, list) else value
        for key, value in obj.items()
    }
