"""Codex-style tools on the Responses API: a `custom` tool (free-form text input) is offered to
the model as a function of one string, `input`, and its call comes back as a
`custom_tool_call` carrying the text alone (streamed as custom_tool_call_input events), which a
`custom_tool_call_output` answers; OpenAI's built-in tools are not offered to the model, and
an unknown tool type is refused, named."""

from __future__ import annotations

import json

import openai
import pytest

from services.gateway.backend import ToolCall
from tests.openai_schema import validate
from tests.unit.gateway.conftest import API_KEY
from tests.unit.gateway.scripted_backend import MODEL

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch\n"
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
BUILT_INS = [{"type": "web_search"}, {"type": "local_shell"}, {"type": "image_generation"}]
CALL = ToolCall(id="call_7", name="apply_patch", arguments=json.dumps({"input": PATCH}))
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
async def sdk(http):
    client = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key=API_KEY)
    async with client:
        yield client


async def test_a_custom_tool_call_carries_its_text_and_continues(scripted, sdk) -> None:
    scripted.scripts = [[CALL]]
    tools = [*BUILT_INS, SHELL, APPLY_PATCH]
    first = await sdk.responses.create(model=MODEL, input="Add hello.txt", tools=tools)
    (call,) = first.output
    assert call.type == "custom_tool_call" and call.input == PATCH and call.call_id == "call_7"
    asked = scripted.requests[0]
    assert [t.name for t in asked.tools] == ["shell", "apply_patch"]  # built-ins not offered
    schema = json.loads(asked.tools[1].parameters)
    assert schema["properties"] == {"input": {"type": "string"}}
    assert "lark grammar" in asked.tools[1].description
    output = {"type": "custom_tool_call_output", "call_id": "call_7", "output": "Done!"}
    second = await sdk.responses.create(
        model=MODEL, input=[output], previous_response_id=first.id, tools=tools
    )
    assert second.output_text == "ok"
    history = scripted.requests[1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert json.loads(history[1].tool_calls[0].arguments) == {"input": PATCH}
    assert history[2].tool_call_id == "call_7" and history[2].content == "Done!"


async def test_a_custom_tool_call_streams_its_input_events(http, scripted) -> None:
    scripted.scripts = [[CALL]]
    body = {"model": MODEL, "input": "hi", "tools": [APPLY_PATCH], "stream": True}
    raw = await http.post("/v1/responses", json=body, headers=AUTH)
    events = [json.loads(b.split("data: ", 1)[1]) for b in (await raw.text()).split("\n\n") if b]
    for event in events:
        validate(event, "ResponseStreamEvent")
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == PATCH
    final = events[-1]["response"]
    validate(final, "Response")
    assert [item["type"] for item in final["output"]] == ["custom_tool_call"]


async def test_a_history_custom_call_and_a_named_custom_choice(scripted, sdk) -> None:
    history = [
        {"type": "message", "role": "user", "content": "Add hello.txt"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
    ]
    await sdk.responses.create(
        model=MODEL,
        input=history,
        tools=[APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    asked = scripted.requests[0]
    assert (asked.tool_choice, asked.tool_choice_function) == ("required", "apply_patch")
    assert json.loads(asked.messages[1].tool_calls[0].arguments) == {"input": PATCH}


async def test_an_unknown_tool_type_is_refused_by_name(http) -> None:
    body = {"model": MODEL, "input": "hi", "tools": [SHELL, {"type": "teleport"}]}
    raw = await http.post("/v1/responses", json=body, headers=AUTH)
    assert raw.status == 400
    error = (await raw.json())["error"]
    assert error["param"] == "tools[1].type" and "'teleport'" in error["message"]


async def test_a_namespaced_tool_is_called_by_its_name_and_namespace(scripted, sdk) -> None:
    """Codex sends an MCP server's tools as a namespace: each is offered as namespace__name,
    and its call names the tool and its namespace, as OpenAI's API does."""
    docs = {
        "type": "namespace",
        "name": "docs",
        "description": "The project's documentation server.",
        "tools": [{**SHELL, "name": "search"}, {**APPLY_PATCH, "name": "edit"}],
    }
    search = ToolCall(id="call_3", name="docs__search", arguments='{"command": "ls"}')
    edit = ToolCall(id="call_4", name="docs__edit", arguments=json.dumps({"input": PATCH}))
    scripted.scripts = [[search, edit]]
    raw = await sdk.responses.with_raw_response.create(model=MODEL, input="hi", tools=[docs])
    validate(raw.http_response.json(), "Response")
    first = raw.parse()
    assert [t.name for t in scripted.requests[0].tools] == ["docs__search", "docs__edit"]
    called = [(item.type, item.namespace, item.name) for item in first.output]
    assert called == [("function_call", "docs", "search"), ("custom_tool_call", "docs", "edit")]
    outputs = [
        {"type": "function_call_output", "call_id": "call_3", "output": "README.md"},
        {"type": "custom_tool_call_output", "call_id": "call_4", "output": "Done!"},
    ]
    await sdk.responses.create(model=MODEL, input=outputs, previous_response_id=first.id)
    (turn,) = [m for m in scripted.requests[1].messages if m.tool_calls]
    assert [c.name for c in turn.tool_calls] == ["docs__search", "docs__edit"]


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "web_search"}, {**SHELL, "parameters": 5}], "tools[1].parameters"),
        (
            [{"type": "namespace", "name": "ns", "tools": [SHELL, {**SHELL, "parameters": 5}]}],
            "tools[0].tools[1].parameters",
        ),
    ],
)
async def test_a_bad_tool_is_named_where_the_request_has_it(http, tools, param) -> None:
    body = {"model": MODEL, "input": "hi", "tools": tools}
    raw = await http.post("/v1/responses", json=body, headers=AUTH)
    assert raw.status == 400
    error = (await raw.json())["error"]
    assert error["param"] == param and param in error["message"]
