"""The Anthropic Messages API through the official anthropic SDK (create, stream, tools,
count_tokens, its errors and its x-api-key header) against an in-process gateway and a scripted
backend."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import pytest
from aiohttp.test_utils import TestClient, TestServer
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter

from layerserve.common.v1 import common_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common.max_tokens import MaxTokens
from services.gateway.backend import ToolCall
from services.gateway.http_app import create_app
from services.gateway.tokenizer_client import delta_from_proto
from tests.unit.gateway.conftest import API_KEY
from tests.unit.gateway.echo_backend import MODEL as ECHO_MODEL
from tests.unit.gateway.echo_backend import EchoBackend
from tests.unit.gateway.scripted_backend import MODEL
from tests.unit.gateway.test_responses_api import Weather

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')
USER = [{"role": "user", "content": "Weather in Paris?"}]


def sdk_for(http: TestClient, key: str = API_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=str(http.make_url("")), api_key=key, max_retries=0)


@pytest.fixture
async def sdk(http: TestClient) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sdk_for(http) as client:
        yield client


async def test_create_with_system_and_stop_sequences(scripted, sdk) -> None:
    scripted.scripts = [["Paris", " is nice"]]
    message = await sdk.messages.create(
        model=MODEL,
        max_tokens=20,
        system="Be brief",
        stop_sequences=["\n\n"],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me"}]}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text == "Paris is nice"
    assert message.stop_reason == "end_turn"
    # Anthropic's split: input_tokens leaves out what the prefix cache held.
    assert message.usage.input_tokens == 5 and message.usage.cache_read_input_tokens == 2
    assert message.usage.output_tokens == 2
    asked = scripted.requests[0]
    assert [(m.role, m.content) for m in asked.messages] == [
        ("system", "Be brief"),
        ("user", "Tell me"),
    ]
    assert asked.stop == ["\n\n"] and asked.max_tokens == MaxTokens(20)


async def test_max_tokens_maps_to_its_stop_reason(scripted, sdk) -> None:
    scripted.finish = "length"
    message = await sdk.messages.create(model=MODEL, max_tokens=1, messages=USER)
    assert message.stop_reason == "max_tokens"


async def test_a_stop_sequence_is_reported_as_anthropic_does(scripted, http, sdk) -> None:
    """The stop string that ended the message, from the tokenizer (GenerateOutput.stop_sequence)
    through the gateway's backend, in the message and in its stream's message_delta."""
    out = tokenizer_pb2.GenerateOutput(
        text="Paris", finish_reason=common_pb2.FINISH_REASON_STOP, stop_sequence="\n\n"
    )
    assert delta_from_proto(out, want_logprobs=False).stop_sequence == "\n\n"
    scripted.stop_sequence = "\n\n"
    ask = {"model": MODEL, "max_tokens": 20, "messages": USER, "stop_sequences": ["\n\n"]}
    scripted.scripts = [["Paris"]]
    message = await sdk.messages.create(**ask)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "\n\n")
    scripted.scripts = [["Paris"]]
    async with sdk.messages.stream(**ask) as stream:
        events = [event async for event in stream]
    (end,) = [e for e in events if e.type == "message_delta"]
    assert (end.delta.stop_reason, end.delta.stop_sequence) == ("stop_sequence", "\n\n")
    scripted.stop_sequence = None  # ended by EOS: end_turn, as before
    scripted.scripts = [["Paris"]]
    message = await sdk.messages.create(**ask)
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)


async def test_stream_sends_anthropics_events(scripted, http, sdk) -> None:
    scripted.scripts = [["Hello", " there"]]
    async with sdk.messages.stream(model=MODEL, max_tokens=20, messages=USER) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hello there" and final.content[0].text == "Hello there"
    assert final.stop_reason == "end_turn"
    scripted.scripts = [["Hi"]]
    raw = await http.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 5, "messages": USER, "stream": True},
        headers={"x-api-key": API_KEY},
    )
    kinds = [line[7:] for line in (await raw.text()).splitlines() if line.startswith("event: ")]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_tool_use_and_its_result(scripted, sdk) -> None:
    scripted.scripts = [["Checking.", CALL]]
    message = await sdk.messages.create(
        model=MODEL,
        max_tokens=50,
        messages=USER,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any"},
    )
    assert message.stop_reason == "tool_use"
    text, tool_use = message.content
    assert text.text == "Checking." and tool_use.type == "tool_use"
    assert tool_use.name == "get_weather" and tool_use.input == {"city": "Paris"}
    asked = scripted.requests[0]
    assert asked.tool_choice == "required" and json.loads(asked.tools[0].parameters)["required"]
    await sdk.messages.create(
        model=MODEL,
        max_tokens=50,
        tools=[WEATHER_TOOL],
        messages=[
            *USER,
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_use.id, "content": "21 C"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    )
    history = scripted.requests[1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool", "user"]
    assert history[1].tool_calls[0].id == "toolu_1" and history[2].tool_call_id == "toolu_1"


async def test_streamed_tool_use_arrives_as_input_json(scripted, sdk) -> None:
    scripted.scripts = [[CALL]]
    async with sdk.messages.stream(
        model=MODEL, max_tokens=50, messages=USER, tools=[WEATHER_TOOL]
    ) as stream:
        partial = [e.partial_json async for e in stream if e.type == "input_json"]
        final = await stream.get_final_message()
    assert "".join(partial) == CALL.arguments
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"


async def test_count_tokens(sdk) -> None:
    counted = await sdk.messages.count_tokens(model=MODEL, messages=USER, system="Be brief")
    assert counted.input_tokens == 7


async def test_errors_take_anthropics_shape(http, sdk) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        await sdk.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk.messages.create(model=MODEL, max_tokens=5, messages=USER, stop_sequences=[""])
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "stop sequences must not be empty"},
    }
    raw = await http.post(
        "/v1/messages", json={"model": MODEL, "messages": USER}, headers={"x-api-key": API_KEY}
    )
    assert raw.status == 400 and "max_tokens" in (await raw.json())["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        prefill = [*USER, {"role": "assistant", "content": "It is"}]
        await sdk.messages.create(model=MODEL, max_tokens=5, messages=prefill)
    assert "prefill" in info.value.body["error"]["message"]
    async with sdk_for(http, "sk-wrong") as wrong:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await wrong.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert info.value.body["error"]["type"] == "authentication_error"


async def test_parse_returns_the_output_formats_object(scripted, sdk) -> None:
    scripted.scripts = [['{"city": "Paris", "temperature": 21.5}']]
    message = await sdk.messages.parse(
        model=MODEL, max_tokens=50, messages=USER, output_format=Weather
    )
    assert message.parsed_output == Weather(city="Paris", temperature=21.5)
    structured = scripted.requests[0].sampling.structured
    assert structured is not None and structured.kind == "json_schema"
    assert "temperature" in structured.value


async def test_a_failure_mid_stream_is_an_anthropic_error_event() -> None:
    app = create_app(EchoBackend(token_delay=0.01))  # "fine" goes out before "boom"
    async with TestClient(TestServer(app)) as client:
        body = {
            "model": ECHO_MODEL,
            "max_tokens": 10,
            "stream": True,
            "messages": [{"role": "user", "content": "fine then boom"}],
        }
        raw = await client.post("/v1/messages", json=body)
        lines = (await raw.text()).strip().splitlines()
    assert raw.status == 200 and lines[0] == "event: message_start"
    assert lines[-2] == "event: error"
    assert json.loads(lines[-1][len("data: ") :]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the worker went away"},
    }


async def test_bodies_and_events_validate_against_the_sdks_types(scripted, http) -> None:
    """Anthropic publishes no OpenAPI document; its SDK's types are the schema, validated
    strictly here (the SDK itself builds its objects without validation)."""
    body = {"model": MODEL, "max_tokens": 20, "messages": USER, "tools": [WEATHER_TOOL]}
    headers = {"x-api-key": API_KEY}
    scripted.scripts = [["Checking.", CALL], ["Checking.", CALL]]
    raw = await http.post("/v1/messages", json=body, headers=headers)
    Message.model_validate(await raw.json())
    raw = await http.post("/v1/messages", json={**body, "stream": True}, headers=headers)
    events = [
        json.loads(line[len("data: ") :])
        for line in (await raw.text()).splitlines()
        if line.startswith("data: ")
    ]
    adapter = TypeAdapter(RawMessageStreamEvent)
    assert [type(adapter.validate_python(e)).__name__ for e in events] == [
        "RawMessageStartEvent",
        *["RawContentBlockStartEvent", "RawContentBlockDeltaEvent", "RawContentBlockStopEvent"] * 2,
        "RawMessageDeltaEvent",
        "RawMessageStopEvent",
    ]
    raw = await http.post("/v1/messages/count_tokens", json=body, headers=headers)
    MessageTokensCount.model_validate(await raw.json())
