"""Tools and tool_choice, checked, and `required` (or a named function) turned into a grammar.

Part of the one validator (request_validator.py): both front ends get the same rules and the
same errors. A forced call is a JSON schema the worker enforces, so even a small model returns
a call to a known function with arguments that match its parameters: one call object
`{"name": ..., "arguments": {...}}`, or with parallel_tool_calls an array of at least one. The
tokenizer then reads the calls out of that JSON (TOOL_CALL_PARSING_JSON).
"""

from __future__ import annotations

import json
from typing import Any

from services.common.errors import InvalidArgument
from services.common.grammar_pool import grammar_pool
from services.common.sampling import StructuredOutput
from services.common.schema_graph import nesting_depth
from services.gateway.backend import GenerationRequest, Tool
from services.gateway.openai_structured import NAME_PATTERN

_NO_PARAMETERS = {"type": "object", "properties": {}}


def check_tools(request: GenerationRequest) -> None:
    """Checks the tools and the choice; settles tool_choice ("none", "auto" or "required");
    for "required" sets sampling.structured to the calls' grammar. How many tools: the
    operator's max_tools (prompt_size.check_counts)."""
    if request.tools and request.messages is None:
        raise InvalidArgument("tools need chat messages, not a prompt", param="tools")
    names: set[str] = set()
    for i, tool in enumerate(request.tools):
        _check_tool(tool, f"tools[{i}].function", names)
    _settle_choice(request, names)
    if request.tool_choice != "required":
        return
    if request.sampling.structured is not None:
        raise InvalidArgument(
            f"{request.structured_param} cannot be combined with a required tool call",
            param="tool_choice",
        )
    schema = forced_call_schema(request.tools, request.tool_choice_function, _parallel(request))
    request.sampling.structured = StructuredOutput("json_schema", schema)
    request.structured_param = "tool_choice"


def _check_tool(tool: Tool, param: str, names: set[str]) -> None:
    if not NAME_PATTERN.fullmatch(tool.name):
        raise InvalidArgument(
            f"{param}.name must be 1-64 of a-z, A-Z, 0-9, '_' and '-'", param=f"{param}.name"
        )
    if tool.name in names:
        raise InvalidArgument(f"{param}.name {tool.name!r} is given twice", param=f"{param}.name")
    names.add(tool.name)
    if not tool.parameters:
        return
    param = f"{param}.parameters"
    schema = _parameters(tool)
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidArgument(f"{param} must be a JSON schema of an object", param=param)
    # Before forced_call_schema walks it (recursively): a schema nested a few hundred deep was
    # a RecursionError there, a 500. The rest of the limits and whether it compiles:
    # grammar_check.py, off the event loop.
    limit = grammar_pool().settings.max_depth
    if nesting_depth(schema) > limit:
        raise InvalidArgument(
            f"{param} nests deeper than this server's limit of {limit} "
            "(LAYERSERVE_GRAMMAR_MAX_DEPTH)",
            param=param,
        )


def _settle_choice(request: GenerationRequest, names: set[str]) -> None:
    if request.tool_choice_function:
        if request.tool_choice_function not in names:
            raise InvalidArgument(
                f"tool_choice names {request.tool_choice_function!r}, which is not in tools"[:200],
                param="tool_choice",
            )
        request.tool_choice = "required"
    if not request.tool_choice:
        request.tool_choice = "auto" if request.tools else "none"
    if request.tool_choice in ("auto", "required") and not request.tools:
        raise InvalidArgument(f"tool_choice {request.tool_choice} needs tools", param="tool_choice")


def _parallel(request: GenerationRequest) -> bool:
    return request.parallel_tool_calls and not request.tool_choice_function


def forced_call_schema(tools: list[Tool], name: str, parallel: bool) -> str:
    """The JSON schema of the output for a forced call: one call of `name` (or any tool when
    name is ""), or an array of at least one call when `parallel`. Each tool's `$defs` move to
    the root, renamed per tool, so its `$ref`s still resolve inside the combined schema."""
    defs: dict[str, Any] = {}
    calls = [_call_schema(t, defs) for t in tools if not name or t.name == name]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {"type": "array", "items": call, "minItems": 1} if parallel else call
    if defs:
        schema = {**schema, "$defs": defs}
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _call_schema(tool: Tool, defs: dict[str, Any]) -> dict[str, Any]:
    arguments = _parameters(tool) if tool.parameters else dict(_NO_PARAMETERS)
    for key in ("$defs", "definitions"):
        for def_name, definition in (arguments.pop(key, None) or {}).items():
            defs[f"{tool.name}.{def_name}"] = _renamed_refs(definition, tool.name)
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            "arguments": _renamed_refs(arguments, tool.name),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _renamed_refs(node: Any, tool_name: str) -> Any:
    if isinstance(node, list):
        return [_renamed_refs(item, tool_name) for item in node]
    if not isinstance(node, dict):
        return node
    renamed = {key: _renamed_refs(value, tool_name) for key, value in node.items()}
    ref = renamed.get("$ref")
    if isinstance(ref, str):
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                renamed["$ref"] = f"#/$defs/{tool_name}.{ref[len(prefix) :]}"
    return renamed


def _parameters(tool: Tool) -> Any:
    """The parameters schema; text a front end has not already checked is checked here."""
    try:
        return json.loads(tool.parameters)
    except (ValueError, RecursionError):
        return None
