"""The Responses API's `tools` -> chat completions function tools.

* `function` tools are the chat API's, flat.
* `custom` tools (free-form text input, as Codex's apply_patch) become a function of one string
  argument, `input`: the model writes {"input": "..."}, and the response hands the client the
  text alone, as a `custom_tool_call` (responses_events.py). A `format` grammar (lark or regex)
  is shown to the model in the tool's description, not enforced.
* `namespace` tools (Codex's MCP servers) offer each of their function and custom tools as a
  function named namespace__name (vLLM's spelling); a call names the tool and its namespace.
* OpenAI's built-in tools (web search, file search, code interpreter, image generation, MCP,
  computer use, local shell, ...) run on OpenAI's side or need a model trained for them: this
  server has none, so they are not offered to the model, as vLLM does. A request that names one
  is served with its other tools.
* Any other type is refused, naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.flat_tools import chat_tools
from services.gateway.log_text import excerpt
from services.gateway.openai_fields import JsonObject

_SERVED = "function and custom tools"
_NAMESPACE_SEPARATOR = "__"
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


@dataclass(frozen=True, slots=True)
class ToolName:
    """A tool as the client named it, behind the flat function name the model calls."""

    name: str
    namespace: str | None = None
    custom: bool = False  # its calls are custom_tool_call items with text input


def responses_chat_tools(value: Any) -> list[JsonObject]:
    """The chat tools of a Responses request's `tools`."""
    if not isinstance(value, list):
        raise InvalidArgument("tools must be an array", param="tools")
    tools: list[JsonObject] = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in BUILT_IN:
            continue
        if kind == "namespace":
            tools += _namespace(tool, f"tools[{i}]")
        elif kind in ("function", "custom"):
            tools.append(_chat_tool(tool, f"tools[{i}]"))
        else:
            raise InvalidArgument(
                f"tools[{i}]: tool type {excerpt(str(kind))} is not supported (function, custom, "
                "namespace; "
                "OpenAI's built-in tools are not offered to the model)",
                param=f"tools[{i}].type",
            )
    return tools


def chat_tool_params(value: Any) -> list[str]:
    """Where each chat tool of responses_chat_tools(value) comes from in the request (built-in
    tools are skipped, a namespace's tools are several): to name it in the chat parser's
    errors. `value` has passed responses_chat_tools."""
    params = []
    for i, tool in enumerate(value if isinstance(value, list) else []):
        if tool["type"] == "namespace":
            params += [f"tools[{i}].tools[{j}]" for j in range(len(tool["tools"]))]
        elif tool["type"] not in BUILT_IN:
            params.append(f"tools[{i}]")
    return params


def tool_names(tools: list[JsonObject]) -> dict[str, ToolName]:
    """The flat function names the model calls (a namespaced tool's is namespace__name), for
    the tools that are not plain functions: how a call is given back to the client."""
    names: dict[str, ToolName] = {}
    for tool in tools:
        if tool.get("type") == "custom":
            names[tool["name"]] = ToolName(tool["name"], custom=True)
        elif tool.get("type") == "namespace":
            for child in tool.get("tools") or []:
                custom = child.get("type") == "custom"
                flat = flat_name(tool["name"], child["name"])
                names[flat] = ToolName(child["name"], tool["name"], custom)
    return names


def flat_name(namespace: str | None, name: str) -> str:
    """The function name a namespaced tool is offered as (vLLM's spelling)."""
    return f"{namespace}{_NAMESPACE_SEPARATOR}{name}" if namespace else name


def _namespace(tool: JsonObject, param: str) -> list[JsonObject]:
    """A namespace's function and custom tools, each named namespace__name."""
    namespace, children = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not isinstance(children, list) or not children:
        raise InvalidArgument(f"{param} must have a name and a non-empty tools array", param=param)
    tools = []
    for j, child in enumerate(children):
        where = f"{param}.tools[{j}]"
        if not isinstance(child, dict) or child.get("type") not in ("function", "custom"):
            raise InvalidArgument(f"{where}: only {_SERVED} are supported", param=f"{where}.type")
        if not isinstance(child.get("name"), str):
            raise InvalidArgument(f"{where}.name must be a string", param=f"{where}.name")
        tools.append(_chat_tool({**child, "name": flat_name(namespace, child["name"])}, where))
    return tools


def _chat_tool(tool: JsonObject, param: str) -> JsonObject:
    if tool["type"] == "custom":
        tool = _as_function(tool, param)
    (chat_tool,) = chat_tools([tool], "function", "parameters", _SERVED)
    return chat_tool


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
