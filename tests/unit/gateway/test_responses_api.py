"""The Responses API through the official openai SDK (create, stream, parse, retrieve, delete)
and the OpenAI Agents SDK, against an in-process gateway and a scripted backend: what the
gateway asks of the stack, and what it answers, in OpenAI's published shapes."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel

from services.common.max_tokens import MaxTokens
from services.gateway.backend import ToolCall
from services.gateway.http_app import create_app
from tests.openai_schema import validate
from tests.unit.gateway.conftest import API_KEY, OTHER_KEY
from tests.unit.gateway.echo_backend import MODEL as ECHO_MODEL
from tests.unit.gateway.echo_backend import EchoBackend
from tests.unit.gateway.scripted_backend import MODEL

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


class Weather(BaseModel):
    city: str
    temperature: float


def sdk_for(http: TestClient, key: str = API_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key=key, max_retries=0)


@pytest.fixture
async def sdk(http: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_for(http) as client:
        yield client


async def post(http: TestClient, body: dict, key: str = API_KEY):
    return await http.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"})


async def test_create_answers_in_openais_response_schema(http, scripted, sdk) -> None:
    scripted.scripts = [["Paris", " is nice"]]
    response = await sdk.responses.create(model=MODEL, input="Tell me", instructions="Be brief")
    assert response.output_text == "Paris is nice" and response.status == "completed"
    assert response.usage is not None and response.usage.input_tokens == 7
    assert (
        response.usage.output_tokens == 2 and response.usage.input_tokens_details.cached_tokens == 2
    )
    messages = scripted.requests[0].messages
    assert [(m.role, m.content) for m in messages] == [("system", "Be brief"), ("user", "Tell me")]
    raw = await post(http, {"model": MODEL, "input": [{"role": "user", "content": "hi"}]})
    validate(await raw.json(), "Response")


async def test_stream_sends_the_typed_events_in_order(http, scripted, sdk) -> None:
    scripted.scripts = [["a", "b"]]
    raw = await post(http, {"model": MODEL, "input": "hi", "stream": True})
    events = [
        json.loads(block.split("data: ", 1)[1])
        for block in (await raw.text()).split("\n\n")
        if block
    ]
    # Deltas queued together go out as one: the text's deltas are one or more.
    assert [kind for kind, _ in itertools.groupby(e["type"] for e in events)] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate(event, "ResponseStreamEvent")
    scripted.scripts = [["one", " two"]]
    async with sdk.responses.stream(model=MODEL, input="hi") as stream:
        deltas = [
            event.delta async for event in stream if event.type == "response.output_text.delta"
        ]
        final = await stream.get_final_response()
    assert "".join(deltas) == "one two" and final.output_text == "one two"


async def test_function_call_then_its_output_continues_the_conversation(scripted, sdk) -> None:
    scripted.scripts = [[CALL]]
    first = await sdk.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id == "call_1"
    asked = scripted.requests[0]
    assert asked.tool_choice == "required" and [t.name for t in asked.tools] == ["get_weather"]
    output = {"type": "function_call_output", "call_id": "call_1", "output": "21 C"}
    second = await sdk.responses.create(
        model=MODEL, input=[output], previous_response_id=first.id, tools=[WEATHER_TOOL]
    )
    assert second.output_text == "ok"
    history = scripted.requests[1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[1].tool_calls[0].id == "call_1" and history[2].tool_call_id == "call_1"


async def test_function_call_streams_its_argument_events(http, scripted) -> None:
    scripted.scripts = [["Let me see.", CALL]]
    raw = await post(http, {"model": MODEL, "input": "hi", "tools": [WEATHER_TOOL], "stream": True})
    events = [
        json.loads(block.split("data: ", 1)[1])
        for block in (await raw.text()).split("\n\n")
        if block
    ]
    kinds = [e["type"] for e in events]
    assert kinds.index("response.output_item.done") < kinds.index(
        "response.function_call_arguments.delta"
    )
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == CALL.arguments and done["output_index"] == 1
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]


async def test_parse_returns_the_schemas_object(scripted, sdk) -> None:
    scripted.scripts = [['{"city": "Paris", "temperature": 21.5}']]
    response = await sdk.responses.parse(model=MODEL, input="Weather?", text_format=Weather)
    assert response.output_parsed == Weather(city="Paris", temperature=21.5)
    structured = scripted.requests[0].sampling.structured
    assert structured is not None and structured.kind == "json_schema"
    assert "temperature" in structured.value


async def test_stored_responses_belong_to_their_key_and_can_be_deleted(http, sdk) -> None:
    response = await sdk.responses.create(model=MODEL, input="hi")
    assert (await sdk.responses.retrieve(response.id)).model_dump() == response.model_dump()
    async with sdk_for(http, OTHER_KEY) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError) as info:
            await other.responses.create(model=MODEL, input="x", previous_response_id=response.id)
        assert info.value.param == "previous_response_id"
    await sdk.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(response.id)
    unstored = await sdk.responses.create(model=MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unstored.id)


async def test_max_output_tokens_ends_incomplete(scripted, sdk) -> None:
    scripted.finish = "length"
    response = await sdk.responses.create(model=MODEL, input="hi", max_output_tokens=1)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert scripted.requests[0].max_tokens == MaxTokens(1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": [{"type": "image_generation_call"}]}, "input[0].type"),
        (
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "tools": [{"type": "functoin"}]}, "tools[0].type"),
        ({"model": MODEL, "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"model": MODEL, "input": "hi", "background": True}, "background"),
        ({"model": MODEL, "input": "hi", "temperature": 9}, "temperature"),
    ],
)
async def test_bad_requests_name_the_responses_field(http, body, param) -> None:
    raw = await post(http, body)
    assert raw.status == 400
    error = await raw.json()
    validate(error, "ErrorResponse")
    assert error["error"]["param"] == param


async def test_an_agent_calls_its_function_tool(http, scripted) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return "21 C"

    scripted.scripts = [
        [ToolCall(id="call_9", name="get_weather", arguments='{"city": "Oslo"}')],
        ["It is 21 C."],
    ]
    async with sdk_for(http) as client:
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = agents.Agent(
            name="weather", instructions="Answer.", tools=[get_weather], model=model
        )
        result = await agents.Runner.run(agent, "Weather in Oslo?")
    assert calls == ["Oslo"] and result.final_output == "It is 21 C."
    tool_turn = scripted.requests[1].messages[-1]
    assert (
        tool_turn.role == "tool"
        and tool_turn.tool_call_id == "call_9"
        and "21 C" in tool_turn.content
    )


async def test_a_failure_mid_stream_ends_with_error_and_response_failed() -> None:
    app = create_app(EchoBackend(token_delay=0.01))  # "fine" goes out before "boom"
    async with TestClient(TestServer(app)) as client:
        body = {"model": ECHO_MODEL, "input": "fine then boom", "stream": True}
        raw = await client.post("/v1/responses", json=body)
        events = [
            json.loads(block.split("data: ", 1)[1])
            for block in (await raw.text()).split("\n\n")
            if block
        ]
    assert raw.status == 200 and events[0]["type"] == "response.created"
    error, failed = events[-2:]
    assert error["type"] == "error" and error["code"] == "unavailable"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    for event in events:
        validate(event, "ResponseStreamEvent")
