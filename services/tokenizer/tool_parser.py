"""Tool calls out of a model's text, as it streams: content text and whole tool calls apart.

Two parsers, chosen per request:
* `TaggedToolCallParser` (tool_choice auto): the model's own format, JSON inside tags
  (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or a JSON array of such objects
  inside one pair of tags, as SmolLM2 was trained). Text outside the tags is content; a tag
  body that is not a tool call goes out as content, tags and all, rather than being lost.
* `JsonToolCallParser` (tool_choice required or a named function): the grammar made the whole
  output a JSON array of calls, or one call object; each call goes out as soon as it closes.

A call is emitted whole, once its JSON is complete: `ToolCallDelta(index, id, name, arguments)`;
the gateway streams it as OpenAI does (a header delta, then the arguments).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ToolCallDelta:
    index: int  # the call's position in the choice's tool_calls, from 0
    id: str  # "call_..."
    name: str
    arguments: str  # the arguments object as JSON text


@dataclass(slots=True)
class ParsedText:
    content: str
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class ToolCallParser(Protocol):
    def feed(self, text: str) -> ParsedText:
        """What the new text settles; text that may still become a call is held back."""
        ...

    def flush(self) -> ParsedText:
        """Everything still held, at the end of generation."""
        ...


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Calls:
    """Numbers the calls of one choice and turns parsed JSON into ToolCallDeltas."""

    def __init__(self) -> None:
        self.count = 0

    def from_json(self, value: Any) -> list[ToolCallDelta] | None:
        """Calls from one object or an array of them; None when value is not tool calls."""
        items = value if isinstance(value, list) else [value]
        if not all(_is_call(item) for item in items):
            return None  # an empty array is no call (SmolLM2's "no tool fits")
        calls = []
        for item in items:
            arguments = item.get("arguments", item.get("parameters", {}))
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            calls.append(ToolCallDelta(self.count, new_call_id(), item["name"], arguments))
            self.count += 1
        return calls


def _is_call(item: Any) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return False
    arguments = item.get("arguments", item.get("parameters", {}))
    return isinstance(arguments, dict | str)


class TaggedToolCallParser:
    def __init__(self, start_tag: str = "<tool_call>", end_tag: str = "</tool_call>") -> None:
        self._start = start_tag
        self._end = end_tag
        self._pending = ""  # text not yet settled: a possible start tag, or a tag's body
        self._inside = False
        self._calls = _Calls()

    def feed(self, text: str) -> ParsedText:
        self._pending += text
        out = ParsedText("")
        while True:
            if self._inside:
                end = self._pending.find(self._end)
                if end < 0:
                    return out
                self._close_tag(self._pending[:end], out)
                self._pending = self._pending[end + len(self._end) :]
                self._inside = False
                continue
            start = self._pending.find(self._start)
            if start < 0:
                keep = _partial_suffix(self._pending, self._start)
                out.content += self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep :]
                return out
            out.content += self._pending[:start]
            self._pending = self._pending[start + len(self._start) :]
            self._inside = True

    def flush(self) -> ParsedText:
        """An unclosed tag (the model stopped, or ran out of tokens, before its end tag) still
        counts when its body is a complete call."""
        out = ParsedText("")
        if self._inside:
            self._close_tag(self._pending, out, closed=False)
        else:
            out.content = self._pending
        self._pending, self._inside = "", False
        return out

    def _close_tag(self, body: str, out: ParsedText, closed: bool = True) -> None:
        calls = self._calls.from_json(_loads(body))
        if calls is None:
            out.content += self._start + body + (self._end if closed else "")
        else:
            out.tool_calls.extend(calls)


class JsonToolCallParser:
    """The output is `[call, ...]` or `call`; a call is emitted when its object closes."""

    def __init__(self) -> None:
        self._text = ""
        self._scanned = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._call_depth: int | None = None  # 1 inside a top-level array, else 0
        self._call_start = 0
        self._calls = _Calls()

    def feed(self, text: str) -> ParsedText:
        self._text += text
        out = ParsedText("")
        for i in range(self._scanned, len(self._text)):
            self._scan(self._text[i], i, out)
        self._scanned = len(self._text)
        return out

    def flush(self) -> ParsedText:
        if self._calls.count or _loads(self._text) == []:
            return ParsedText("")
        # Not a call after all (the grammar did not run, or the output was cut): keep it.
        return ParsedText(self._text)

    def _scan(self, char: str, i: int, out: ParsedText) -> None:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return
        if char == '"':
            self._in_string = True
        elif char in "[{":
            if self._call_depth is None:
                self._call_depth = 1 if char == "[" else 0
            if char == "{" and self._depth == self._call_depth:
                self._call_start = i
            self._depth += 1
        elif char in "]}":
            self._depth -= 1
            if char == "}" and self._depth == self._call_depth:
                calls = self._calls.from_json(_loads(self._text[self._call_start : i + 1]))
                out.tool_calls.extend(calls or [])


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
