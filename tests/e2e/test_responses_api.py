"""The Responses API and the Anthropic Messages API on the real stack and model, through the
unchanged SDKs (openai, openai-agents, anthropic): what their users call first. Few requests,
small max tokens: the chat path behind them is tested at length elsewhere."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.conftest import API_KEY, MODEL
from tests.openai_schema import validate

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
QUESTION = "What is the weather in Paris?"


class Capital(BaseModel):
    country: str
    capital: str


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.http_url, api_key=API_KEY, max_retries=0)


def test_responses_create_stream_and_continue(client) -> None:
    body = {"model": MODEL, "input": "Say hello.", "temperature": 0, "max_output_tokens": 10}
    raw = client.responses.with_raw_response.create(**body)
    validate(raw.http_response.json(), "Response")
    first = raw.parse()
    assert first.output_text and first.usage is not None and first.usage.output_tokens > 0
    with client.responses.stream(**body) as stream:
        events = list(stream)
    for event in events:
        validate(event.model_dump(mode="json", exclude_unset=True), "ResponseStreamEvent")
    # At max_output_tokens the last event is response.incomplete (the SDK's
    # get_final_response() wants response.completed), else response.completed.
    assert events[-1].type == f"response.{first.status}"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == first.output_text
    follow = client.responses.create(
        model=MODEL, input="Again.", previous_response_id=first.id, max_output_tokens=2
    )
    assert follow.usage is not None and follow.usage.input_tokens > first.usage.input_tokens


def test_responses_parse(client) -> None:
    parsed = client.responses.parse(
        model=MODEL,
        input="What is the capital of France? Answer in JSON.",
        text_format=Capital,
        temperature=0,
        max_output_tokens=40,
    )
    assert isinstance(parsed.output_parsed, Capital)


async def test_an_agent_calls_its_function_tool(stack) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny"

    sdk = openai.AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY, max_retries=0)
    agent = agents.Agent(
        name="weather",
        instructions="Use your tool to answer.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=sdk),
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60
        ),
        tool_use_behavior="stop_on_first_tool",  # one model call: the tool's answer ends it
    )
    result = await agents.Runner.run(agent, QUESTION, max_turns=2)
    assert len(cities) >= 1 and result.final_output == "sunny"
    # The call the agent ran came through the Responses API as a valid function_call item.
    calls = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMETERS)
    await sdk.close()


def test_anthropic_messages_stream_tools_and_count(claude) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    # The anthropic SDK no longer takes temperature; the API still does.
    greedy = {"extra_body": {"temperature": 0}}
    message = claude.messages.create(
        model=MODEL, max_tokens=8, messages=messages, system="Be terse.", **greedy
    )
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(
        model=MODEL, max_tokens=8, messages=messages, system="Be terse.", **greedy
    ) as stream:
        text = "".join(stream.text_stream)
    assert text == message.content[0].text
    counted = claude.messages.count_tokens(model=MODEL, messages=messages, system="Be terse.")
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens
    tool = {"name": "get_weather", "input_schema": WEATHER_PARAMETERS}
    called = claude.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[tool],
        tool_choice={"type": "any"},
    )
    uses = [block for block in called.content if block.type == "tool_use"]
    assert called.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER_PARAMETERS)
