"""Chat `messages` -> ChatMessages, content flattened to text. Only JSON shapes are checked here;
roles and sizes are request_validator.py's, for the gRPC front end too. The counts of messages,
content parts and tool calls are checked before anything is built from them."""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.backend import ChatMessage, ToolCall
from services.gateway.log_text import excerpt
from services.gateway.prompt_size import check_count
from services.gateway.request_limits import RequestLimits

# Texts of a multi-part content are joined the way vLLM joins them.
_PART_SEPARATOR = "\n"


def parse_messages(value: Any, limits: RequestLimits) -> list[ChatMessage]:
    if value is None:
        raise InvalidArgument("messages is required", param="messages")
    if not isinstance(value, list):
        raise InvalidArgument("messages must be a non-empty array", param="messages")
    check_count(len(value), limits.max_messages, "messages")
    return [_parse_message(m, f"messages[{i}]", limits) for i, m in enumerate(value)]


def _parse_message(message: Any, param: str, limits: RequestLimits) -> ChatMessage:
    if not isinstance(message, dict):
        raise InvalidArgument(f"{param} must be an object", param=param)
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidArgument(f"{param}.role must be a string", param=f"{param}.role")
    tool_calls = _tool_calls(message.get("tool_calls"), f"{param}.tool_calls", limits)
    # An assistant turn that only called tools has null content, as OpenAI returns it.
    content_role = "assistant" if tool_calls else role
    content = _content_text(message.get("content"), content_role, f"{param}.content", limits)
    return ChatMessage(
        role=role,
        content=content,
        tool_calls=tool_calls,
        tool_call_id=_optional_str(message, "tool_call_id", param),
        name=_optional_str(message, "name", param),
    )


def _optional_str(message: dict, key: str, param: str) -> str:
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f"{param}.{key} must be a string", param=f"{param}.{key}")
    return value


def _tool_calls(value: Any, param: str, limits: RequestLimits) -> list[ToolCall]:
    """An assistant turn's `tool_calls`, as a response returned them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"{param} must be an array", param=param)
    check_count(len(value), limits.max_tools, param)
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            where = f"{param}[{i}].function"
            raise InvalidArgument(f"{where} must be an object", param=where)
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(arguments, str):
            where = f"{param}[{i}].function"
            raise InvalidArgument(f"{where} needs a name and arguments (strings)", param=where)
        call_id = _optional_str(call, "id", f"{param}[{i}]")
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments, index=i))
    return calls


def _content_text(content: Any, role: str, param: str, limits: RequestLimits) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        # Only an assistant turn may omit content (OpenAI allows it there, e.g. a refusal).
        if role == "assistant":
            return ""
        raise InvalidArgument(f"{param} is required", param=param)
    if not isinstance(content, list):
        raise InvalidArgument(f"{param} must be a string or an array of parts", param=param)
    check_count(len(content), limits.max_content_parts, param)
    return _PART_SEPARATOR.join(_part_text(p, f"{param}[{i}]") for i, p in enumerate(content))


def _part_text(part: Any, param: str) -> str:
    if not isinstance(part, dict):
        raise InvalidArgument(f"{param} must be an object", param=param)
    kind = part.get("type")
    if kind != "text":
        raise InvalidArgument(
            f"{param}: content part type {excerpt(str(kind))} is not supported (only 'text')",
            param=f"{param}.type",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise InvalidArgument(f"{param}.text must be a string", param=f"{param}.text")
    return text
