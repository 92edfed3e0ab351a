"""A Codex-style request on the real stack and model: built-in tools beside a function and a
custom (free-form) tool; the model, made to call the custom tool, answers with a
`custom_tool_call` whose input is its text, and the conversation goes on with its output."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import API_KEY, MODEL
from tests.openai_schema import validate

TOOLS = [
    {"type": "web_search"},
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {"type": "custom", "name": "apply_patch", "description": "Edits files with a patch."},
]


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY, max_retries=0)


def test_a_custom_tool_is_called_with_text_and_answered(client) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="Create hello.txt containing the word Hello.",
        tools=TOOLS,
        tool_choice={"type": "custom", "name": "apply_patch"},
        temperature=0,
        max_output_tokens=120,
    )
    validate(raw.http_response.json(), "Response")
    first = raw.parse()
    calls = [item for item in first.output if item.type == "custom_tool_call"]
    assert calls and calls[0].name == "apply_patch"
    # The text alone (this small model may write none), never the function's JSON around it.
    assert isinstance(calls[0].input, str) and not calls[0].input.startswith('{"input"')
    output = {"type": "custom_tool_call_output", "call_id": calls[0].call_id, "output": "Done."}
    follow = client.responses.create(
        model=MODEL,
        input=[output],
        previous_response_id=first.id,
        tools=TOOLS,
        temperature=0,
        max_output_tokens=8,
    )
    assert follow.status in ("completed", "incomplete") and follow.output
