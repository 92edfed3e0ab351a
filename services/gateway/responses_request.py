"""A Responses API request body (POST /v1/responses) -> the chat completions body it means.

The Responses API is chat completions with other spellings: `input` items are messages (a
`function_call` or `custom_tool_call` item is an assistant turn's tool call, its `..._output`
item a tool turn), `instructions` a system message, `tools` are flat (responses_tools.py),
`text.format` is `response_format`,
`max_output_tokens` is `max_completion_tokens`. Translating the body lets the chat parser and
the one validator do every check and build the GenerationRequest, so sampling, tools and
structured outputs behave exactly as on /v1/chat/completions. Only the Responses API's own
JSON shapes are checked here, with its own field names in the errors.
"""

from __future__ import annotations

import re
from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.log_text import excerpt
from services.gateway.openai_fields import JsonObject
from services.gateway.responses_tools import custom_arguments, flat_name, responses_chat_tools

# Sampling fields that mean the same in both APIs (the last four are vLLM's extensions).
_SHARED_FIELDS = (
    "model",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "priority",
)
# Features of OpenAI's service this server does not have: refused rather than ignored.
_REFUSED_FIELDS = ("background", "conversation", "prompt", "top_logprobs")
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body: JsonObject, history: list[JsonObject]) -> JsonObject:
    """The chat completions body of a Responses request; `history`: the chat messages of the
    conversation so far (previous_response_id's), to which the input is appended."""
    for name in _REFUSED_FIELDS:
        if body.get(name) not in (None, False, 0):
            raise InvalidArgument(f"{name} is not supported by this server", param=name)
    chat = {name: body[name] for name in _SHARED_FIELDS if name in body}
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidArgument("instructions must be a string", param="instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat["messages"] = system + history + input_messages(body.get("input"))
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = responses_chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = _text_format(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    return chat


def input_messages(value: Any) -> list[JsonObject]:
    """`input` (a string, or a list of items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidArgument("input must be a string or a non-empty array of items", param="input")
    messages: list[JsonObject] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidArgument(f"input[{i}] must be an object", param=f"input[{i}]")
        _add_item(messages, item, f"input[{i}]")
    return messages


def _add_item(messages: list[JsonObject], item: JsonObject, param: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, param))
    elif kind in ("function_call", "custom_tool_call"):
        call = _tool_call(item, param)
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # the turn's text and its calls
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = output if isinstance(output, str) else _parts_text(output, f"{param}.output")
        call_id = _string(item, "call_id", param)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    elif kind != "reasoning":  # a reasoning model's summary: nothing this model can read
        raise InvalidArgument(
            f"{param}.type {excerpt(str(kind))} is not supported (message, function_call, "
            "function_call_output, custom_tool_call, custom_tool_call_output)",
            param=f"{param}.type",
        )


def _tool_call(item: JsonObject, param: str) -> JsonObject:
    """A function_call or custom_tool_call item as a chat tool call (a custom tool's text is
    its function's `input`; a namespaced tool's name is namespace__name)."""
    if item.get("type") == "function_call":
        arguments = _string(item, "arguments", param)
    else:
        arguments = custom_arguments(_string(item, "input", param))
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise InvalidArgument(f"{param}.namespace must be a string", param=f"{param}.namespace")
    return {
        "id": _string(item, "call_id", param),
        "type": "function",
        "function": {
            "name": flat_name(namespace, _string(item, "name", param)),
            "arguments": arguments,
        },
    }


def _message(item: JsonObject, param: str) -> JsonObject:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        roles = ", ".join(_MESSAGE_ROLES)
        raise InvalidArgument(f"{param}.role must be one of {roles}", param=f"{param}.role")
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(content, f"{param}.content")
    return {"role": role, "content": text}


def _parts_text(parts: Any, param: str) -> str:
    """Text content parts, joined as the chat API joins them."""
    if not isinstance(parts, list):
        raise InvalidArgument(f"{param} must be a string or an array of parts", param=param)
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise InvalidArgument(
                f"{param}[{i}]: content type {excerpt(str(kind))} is not supported "
                "(input_text, output_text)",
                param=f"{param}[{i}].type",
            )
        texts.append(_string(part, "text", f"{param}[{i}]"))
    return "\n".join(texts)


def _tool_choice(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": value.get("name")}}
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        raise InvalidArgument("tool_choice allowed_tools is not supported", param="tool_choice")
    raise InvalidArgument(
        'tool_choice must be none, auto, required or {"type": "function" or "custom", "name": ...}',
        param="tool_choice",
    )


def _text_format(text: Any) -> JsonObject | None:
    """`text.format` as a chat response_format (its json_schema fields sit one level up)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidArgument("text must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidArgument("text.format must be an object", param="text.format")
    if fmt.get("type") != "json_schema":
        return {"type": fmt.get("type")}
    spec = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
    return {"type": "json_schema", "json_schema": spec}


def _string(obj: JsonObject, key: str, param: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidArgument(f"{param}.{key} must be a string", param=f"{param}.{key}")
    return value


# Chat field names in errors -> the Responses API's, longest first.
CHAT_TO_RESPONSES_PARAMS = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("messages", "input"),
)


def responses_param(error: InvalidArgument, tool_params: list[str]) -> InvalidArgument:
    """The chat parser's error, naming the field as the Responses API spells it; tool_params:
    where each chat tool is in the request (responses_tools.chat_tool_params)."""
    found = re.match(r"tools\[(\d+)\]", error.param or "")
    if found and int(found[1]) < len(tool_params):
        ours = tool_params[int(found[1])]
        error.param = ours + error.param[found.end() :]
        error.message = error.message.replace(found[0], ours, 1)
    for chat, ours in CHAT_TO_RESPONSES_PARAMS:
        if error.param and error.param.startswith(chat):
            error.param = ours + error.param[len(chat) :]
            error.message = error.message.replace(chat, ours)
            break
    if error.param and ".function." in error.param and error.param.startswith("tools["):
        error.param = error.param.replace(".function.", ".")
        error.message = error.message.replace(".function.", ".")
    return error
