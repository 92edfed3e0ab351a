"""An Anthropic Messages API body (POST /v1/messages, /v1/messages/count_tokens) -> the chat
completions request it means, parsed and validated by the chat path.

`system` becomes a system message; content blocks become chat turns: `text` blocks join into
the turn's text, an assistant's `tool_use` blocks are its tool calls, a user's `tool_result`
blocks are tool turns (ahead of the user's own text, since they answer the calls before it).
`stop_sequences` is `stop`, `tools[].input_schema` a function's parameters, `tool_choice`
`{"type": "any"}` is "required", `output_config.format` (structured outputs) is a
`response_format` JSON schema. Only Anthropic's own JSON shapes are checked here; sampling,
tools and limits are the chat path's and the one validator's, with Anthropic's field names in
the errors.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.anthropic_events import MessagesRenderer, TokenCountRenderer
from services.gateway.flat_tools import chat_tools
from services.gateway.log_text import excerpt
from services.gateway.openai_fields import JsonObject, get_bool, get_object, get_str
from services.gateway.openai_protocol import ParsedRequest, parse_chat_request
from services.gateway.request_limits import RequestLimits

_TOOLS_SERVED = "client tools (name, description, input_schema)"

_SHARED_FIELDS = ("model", "temperature", "top_p", "top_k", "stream", "max_tokens")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def parse_messages_request(
    body: JsonObject, request_id: str, trace_context: dict[str, str] | None, limits: RequestLimits
) -> tuple[ParsedRequest, MessagesRenderer]:
    if body.get("max_tokens") is None:
        raise InvalidArgument("max_tokens: Field required", param="max_tokens")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise InvalidArgument("thinking is not supported by this server", param="thinking")
    parsed = _parsed(body, _chat_body(body), request_id, trace_context, limits)
    return parsed, MessagesRenderer(parsed.response_id, parsed.model)


def parse_count_tokens(
    body: JsonObject, request_id: str, trace_context: dict[str, str] | None, limits: RequestLimits
) -> tuple[ParsedRequest, TokenCountRenderer]:
    """Counted by prefilling the prompt and generating one token (whose blocks the prefix
    cache then keeps for the real request)."""
    chat = {**_chat_body(body), "max_tokens": 1, "stream": False, "temperature": 0}
    return _parsed(body, chat, request_id, trace_context, limits), TokenCountRenderer()


def _parsed(
    body: JsonObject,
    chat: JsonObject,
    request_id: str,
    trace_context: dict[str, str] | None,
    limits: RequestLimits,
) -> ParsedRequest:
    try:
        parsed = parse_chat_request(chat, trace_context, limits, request_id=request_id)
    except InvalidArgument as err:
        raise _anthropic_param(err) from None
    parsed.response_id = f"msg_{request_id}"
    for index, request in enumerate(parsed.requests):
        request.request_id = f"{parsed.response_id}-{index}"
    return parsed


def _chat_body(body: JsonObject) -> JsonObject:
    # Sampling fields left out stay out: the serving model's recommended values apply to them
    # (README "Model defaults"), as vLLM does, rather than Anthropic's own temperature 1.
    chat = {name: body[name] for name in _SHARED_FIELDS if name in body}
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    chat["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
    if body.get("tools") is not None:
        chat["tools"] = chat_tools(
            body["tools"], "custom", "input_schema", _TOOLS_SERVED, default_kind="custom"
        )
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"], parallel = _tool_choice(choice)
        chat["parallel_tool_calls"] = parallel
    output_format = get_object(get_object(body, "output_config"), "format")
    if output_format:
        if output_format.get("type") != "json_schema":
            param = "output_config.format.type"
            raise InvalidArgument(f"{param} must be json_schema", param=param)
        spec = {"name": "output", "schema": output_format.get("schema")}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    return chat


def _system(value: Any) -> list[JsonObject]:
    if value is None:
        return []
    text = value if isinstance(value, str) else _text_blocks(value, "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(value: Any) -> list[JsonObject]:
    if not isinstance(value, list) or not value:
        raise InvalidArgument("messages must be a non-empty array", param="messages")
    turns: list[JsonObject] = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidArgument(f"{param}.role must be user or assistant", param=f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            turns.append({"role": role, "content": content})
        elif isinstance(content, list):
            turns += _block_turns(role, content, f"{param}.content")
        else:
            raise InvalidArgument(
                f"{param}.content must be a string or an array of content blocks",
                param=f"{param}.content",
            )
    if value[-1].get("role") == "assistant":
        # Anthropic continues such a turn's text; the stack's chat templates can only open a
        # new turn, which would answer something else than was asked.
        last = f"messages[{len(value) - 1}]"
        raise InvalidArgument(
            f"{last}: a final assistant message (prefill) is not supported",
            param=f"{last}.role",
        )
    return turns


def _block_turns(role: str, blocks: list[Any], param: str) -> list[JsonObject]:
    """One message's content blocks as chat turns: tool results first, then the text (and,
    from the assistant, its tool calls)."""
    texts: list[str] = []
    calls: list[JsonObject] = []
    results: list[JsonObject] = []
    for i, block in enumerate(blocks):
        where = f"{param}[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind == "tool_result" and role == "user":
            tool_use_id = _string(block, "tool_use_id", where)
            content = block.get("content", "")
            text = content if isinstance(content, str) else _text_blocks(content, where)
            results.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
        elif kind not in ("thinking", "redacted_thinking"):  # nothing this model can read
            raise InvalidArgument(
                f"{where}: content block type {excerpt(str(kind))} is not supported in a "
                f"{role} message",
                param=f"{where}.type",
            )
    turns = results
    if texts or calls or not results:
        turn: JsonObject = {"role": role, "content": "\n".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        elif turn["content"] is None:
            turn["content"] = ""
        turns.append(turn)
    return turns


def _tool_use(block: JsonObject, param: str) -> JsonObject:
    tool_input = block.get("input", {})
    if not isinstance(tool_input, dict):
        raise InvalidArgument(f"{param}.input must be an object", param=f"{param}.input")
    return {
        "id": _string(block, "id", param),
        "type": "function",
        "function": {"name": _string(block, "name", param), "arguments": json.dumps(tool_input)},
    }


def _text_blocks(value: Any, param: str) -> str:
    if not isinstance(value, list):
        raise InvalidArgument(f"{param} must be a string or an array of text blocks", param=param)
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidArgument(
                f"{param}[{i}]: only text blocks are supported here", param=f"{param}[{i}].type"
            )
        texts.append(_string(block, "text", f"{param}[{i}]"))
    return "\n".join(texts)


def _tool_choice(value: Any) -> tuple[Any, bool]:
    """(the chat tool_choice, parallel_tool_calls)."""
    if not isinstance(value, dict):
        raise InvalidArgument("tool_choice must be an object", param="tool_choice")
    parallel = not get_bool(value, "disable_parallel_tool_use", False)
    kind = value.get("type")
    if kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind], parallel
    if kind == "tool":
        name = get_str(value, "name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise InvalidArgument(
        "tool_choice.type must be auto, any, tool or none", param="tool_choice.type"
    )


def _string(block: JsonObject, key: str, param: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise InvalidArgument(f"{param}.{key} must be a string", param=f"{param}.{key}")
    return value


def _anthropic_param(error: InvalidArgument) -> InvalidArgument:
    if error.param == "stop":
        error.param = "stop_sequences"
        if not error.message.startswith("stop sequences"):  # already says what it is
            error.message = error.message.replace("stop", "stop_sequences", 1)
    if error.param and error.param.startswith("response_format.json_schema"):
        error.param = error.param.replace("response_format.json_schema", "output_config.format")
        error.message = error.message.replace("response_format.json_schema", "output_config.format")
    if error.param and ".function.parameters" in error.param:
        error.param = error.param.replace(".function.parameters", ".input_schema")
        error.message = error.message.replace(".function.parameters", ".input_schema")
    if error.param and error.param.startswith("tools[") and ".function." in error.param:
        error.param = error.param.replace(".function.", ".")
        error.message = error.message.replace(".function.", ".")
    return error
