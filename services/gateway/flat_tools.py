"""Tools as the Responses and Anthropic Messages APIs write them: flat objects (a type, name,
description and a JSON schema under each API's own key), translated to the chat API's function
tools, which the chat parser then checks like any others (openai_tools.py)."""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.gateway.openai_fields import JsonObject


def chat_tools(
    value: Any, kind: str, schema_key: str, supported: str, default_kind: str | None = None
) -> list[JsonObject]:
    """value: the request's tools. kind: the one tool type served (default_kind: the type of
    a tool that names none); schema_key: where a tool keeps its parameters' schema;
    supported: the error's words for what is served."""
    if not isinstance(value, list):
        raise InvalidArgument("tools must be an array", param="tools")
    tools = []
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", default_kind) != kind:
            raise InvalidArgument(f"{param}: only {supported} are supported", param=f"{param}.type")
        function = {"name": tool.get("name"), "description": tool.get("description")}
        if tool.get(schema_key) is not None:
            function["parameters"] = tool[schema_key]
        tools.append({"type": "function", "function": function})
    return tools
