"""The Responses API's `tools` -> chat completions function tools.

* `function` tools are the chat API's, flat.
* `custom` tools (free-form text input, as Codex's apply_patch) become a function of one string
  argument, `input`: the model writes {"input": "..."}, and the response hands the client the
  text alone, as a `custom_tool_call` (responses_events.py). A `format` grammar (lark or regex)
  is shown to the model in the tool's description, not enforced.
* OpenAI's built-in tools (web search, file search, code interpreter, image generation, MCP,
  computer use, local shell, ...) run on OpenAI's side or need a model trained for them: this
  server has none, so they are not offered to the model, as vLLM does. A request that names one
  is served with its other tools.
* Any other type is refused, naming it.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.flat_tools import chat_tools
from services.gateway.log_text import excerpt
from services.gateway.openai_fields import JsonObject

_SERVED = "function and custom tools"
# The one argument of a custom tool's function.
CUSTOM_INPUT = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
# Tool types OpenAI's service provides itself (the API reference's built-in tools).
BUILT_IN = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
        "computer_use_preview",
        "computer_use",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
    }
)


def responses_chat_tools(value: Any) -> list[JsonObject]:
    """The chat tools of a Responses request's `tools`."""
    if not isinstance(value, list):
        raise InvalidArgument("tools must be an array", param="tools")
    tools: list[JsonObject] = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in BUILT_IN:
            continue
        if kind == "custom":
            tool = _as_function(tool, f"tools[{i}]")
        elif kind != "function":
            raise InvalidArgument(
                f"tools[{i}]: tool type {excerpt(str(kind))} is not supported (only {_SERVED}; "
                "OpenAI's built-in tools are not offered to the model)",
                param=f"tools[{i}].type",
            )
        tools += chat_tools([tool], "function", "parameters", _SERVED)
    return tools


def _as_function(tool: JsonObject, param: str) -> JsonObject:
    """A custom tool as a function of one string argument, its format told in words."""
    description = tool.get("description") or ""
    fmt = tool.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise InvalidArgument(f"{param}.format.type must be text or grammar", param=param)
    if fmt["type"] == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if not isinstance(definition, str) or syntax not in ("lark", "regex"):
            where = f"{param}.format"
            raise InvalidArgument(f"{where} must have a lark or regex definition", param=where)
        description += f"\n\nThe input follows this {syntax} grammar:\n{definition}"
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": description.strip(),
        "parameters": CUSTOM_INPUT,
    }


def custom_input(arguments: str) -> str:
    """A custom tool's text, from the arguments its function was called with."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments  # not the JSON asked for: the text as the model wrote it
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def custom_arguments(text: str) -> str:
    """The function arguments that stand for a custom tool's text in the chat history."""
    return json.dumps({"input": text})
