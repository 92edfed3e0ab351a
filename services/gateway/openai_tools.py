"""OpenAI `tools`, `tool_choice` and `parallel_tool_calls` -> the request's Tools and choice.

Only JSON shapes are checked here; names, schemas and the grammar that enforces `required` are
request_validator's (tool_calling.py), for the gRPC front end too.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.backend import GenerationRequest, Tool
from services.gateway.openai_fields import JsonObject, get_bool
from services.gateway.openai_structured import schema_text
from services.gateway.prompt_size import check_count
from services.gateway.request_limits import RequestLimits

_CHOICES = ("none", "auto", "required")


def parse_tools(body: JsonObject, request: GenerationRequest, limits: RequestLimits) -> None:
    """Fills request.tools, tool_choice, tool_choice_function and parallel_tool_calls."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidArgument("tools must be an array", param="tools")
        check_count(len(tools), limits.max_tools, "tools")
        request.tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    request.tool_choice, request.tool_choice_function = _tool_choice(body.get("tool_choice"))
    request.parallel_tool_calls = get_bool(body, "parallel_tool_calls", True)


def _tool(value: Any, param: str) -> Tool:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{param} must be an object", param=param)
    if value.get("type", "function") != "function":
        raise InvalidArgument(f"{param}.type must be 'function'", param=f"{param}.type")
    function = value.get("function")
    if not isinstance(function, dict):
        raise InvalidArgument(f"{param}.function must be an object", param=f"{param}.function")
    name = function.get("name")
    if not isinstance(name, str):
        raise InvalidArgument(
            f"{param}.function.name must be a string", param=f"{param}.function.name"
        )
    description = function.get("description") or ""
    if not isinstance(description, str):
        param = f"{param}.function.description"
        raise InvalidArgument(f"{param} must be a string", param=param)
    parameters = function.get("parameters")
    text = "" if parameters is None else schema_text(parameters, f"{param}.function.parameters")
    return Tool(name=name, description=description, parameters=text)


def _tool_choice(value: Any) -> tuple[str, str]:
    """("none" | "auto" | "required" | "" for the default, the named function or "")."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        if value not in _CHOICES:
            raise InvalidArgument(
                "tool_choice must be none, auto, required or a function", param="tool_choice"
            )
        return value, ""
    value = value if isinstance(value, dict) else {}
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if value.get("type") != "function" or not isinstance(name, str):
        raise InvalidArgument(
            'tool_choice must be a string or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    return "required", name
