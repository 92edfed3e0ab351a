"""Structured outputs and tool calls through real clients (the OpenAI SDK, LangChain), an
in-process gateway and a scripted backend standing in for the model: what the gateway asks of
the stack, and what it makes of the stack's answer, in OpenAI's shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import jsonschema
import openai
import pytest
from aiohttp.test_utils import TestClient
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from services.common.errors import InvalidArgument
from services.gateway.backend import ToolCall
from services.gateway.grammar_check import check_grammars
from services.gateway.grpc_api import GatewayServicer, request_from_proto
from services.gateway.request_limits import DEFAULT_LIMITS
from tests.openai_schema import validate
from tests.unit.common.test_grammar_limits import defs_chain, lark_chain
from tests.unit.gateway.conftest import API_KEY, front_door, grpc_gateway
from tests.unit.gateway.scripted_backend import MODEL, ScriptedBackend
from tests.unit.gateway.sse import DONE, read_events

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Weather(BaseModel):
    city: str
    temperature: float


@pytest.fixture
async def sdk(http: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    base_url = str(http.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


def _call(name: str, arguments: dict, index: int = 0) -> ToolCall:
    return ToolCall(f"call_{index}abc", name, json.dumps(arguments), index)


def _constraint(scripted: ScriptedBackend) -> dict:
    structured = scripted.requests[-1].sampling.structured
    assert structured is not None and structured.kind == "json_schema"
    return json.loads(structured.value)


async def test_sdk_parse_returns_the_pydantic_object(sdk, scripted) -> None:
    scripted.script = ['{"city": "Par', 'is", "temperature"', ": 21.5}"]
    completion = await sdk.chat.completions.parse(
        model=MODEL, messages=USER, response_format=Weather
    )
    assert completion.choices[0].message.parsed == Weather(city="Paris", temperature=21.5)
    schema = _constraint(scripted)  # what the worker enforces: the SDK's strict schema
    assert schema["required"] == ["city", "temperature"] and not schema["additionalProperties"]


async def test_langchain_structured_output_and_tools(http, scripted) -> None:
    llm = ChatOpenAI(
        base_url=str(http.make_url("/v1")), api_key=API_KEY, model=MODEL, max_retries=0
    )
    scripted.script = ['{"city": "Paris", "temperature": 19}']
    for method in ("json_schema", "function_calling"):
        if method == "function_calling":
            scripted.script = [_call("Weather", {"city": "Paris", "temperature": 19})]
        answer = await llm.with_structured_output(Weather, method=method).ainvoke("Paris?")
        assert answer == Weather(city="Paris", temperature=19)
        jsonschema.validate(answer.model_dump(), Weather.model_json_schema())
    assert scripted.requests[-1].tool_choice == "required"  # the named function, forced

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    scripted.script = ["", _call("get_weather", {"city": "Paris"})]
    message = await llm.bind_tools([get_weather]).ainvoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert scripted.requests[-1].tool_choice == "auto"
    assert scripted.requests[-1].sampling.structured is None  # auto: the model's own format


async def test_tool_calls_stream_as_openai_streams_them(http, sdk, scripted) -> None:
    scripted.script = ["Checking.", _call("get_weather", {"city": "Paris"}), _call("f", {}, 1)]
    body = {"model": MODEL, "messages": USER, "tools": [WEATHER_TOOL], "stream": True}
    response = await http.post("/v1/chat/completions", json=body, headers=_auth())
    chunks = [event for event in await read_events(response) if event != DONE]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": "Checking."}
    assert deltas[1] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_0abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert deltas[2] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]
    }
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes == [None] * 4 + ["tool_calls"]
    # The SDK's own stream accumulator agrees.
    async with sdk.chat.completions.stream(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL]
    ) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("f", "{}"),
    ]


async def test_a_full_response_carries_tool_calls(http, scripted) -> None:
    scripted.script = [_call("get_weather", {"city": "Paris"})]
    body = {"model": MODEL, "messages": USER, "tools": [WEATHER_TOOL], "tool_choice": "required"}
    response = await http.post("/v1/chat/completions", json=body, headers=_auth())
    answer = await response.json()
    validate(answer, "CreateChatCompletionResponse")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }


async def test_required_and_named_calls_are_enforced_by_a_json_schema(sdk, scripted) -> None:
    scripted.script = [_call("get_weather", {"city": "Paris"})]
    other = {"type": "function", "function": {"name": "now"}}
    await sdk.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL, other], tool_choice="required"
    )
    schema = _constraint(scripted)
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Paris"}}], schema)
    jsonschema.validate(
        [{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}], schema
    )
    for wrong in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "x", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    named = {"type": "function", "function": {"name": "get_weather"}}
    await sdk.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL, other], tool_choice=named
    )
    jsonschema.validate(
        {"name": "get_weather", "arguments": {"city": "Paris"}}, _constraint(scripted)
    )
    await sdk.chat.completions.create(
        model=MODEL, messages=USER, tools=[other], tool_choice="required", parallel_tool_calls=False
    )
    jsonschema.validate({"name": "now", "arguments": {}}, _constraint(scripted))


async def test_history_with_tool_calls_reaches_the_stack(sdk, scripted) -> None:
    scripted.script = ["It is sunny."]
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    completion = await sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    assert completion.choices[0].finish_reason == "stop"
    sent = scripted.requests[-1].messages
    assert sent[1].tool_calls[0].name == "get_weather" and sent[2].tool_call_id == "call_1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (  # a keyword llguidance does not implement
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
            "response_format.json_schema.name",
        ),
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"guided_grammar": "start: ("}, "guided_grammar"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "not": {}}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools[1].function.name"),
        (  # a $defs chain that crashes llguidance (SIGSEGV) without the limits
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": json.loads(defs_chain(1000))},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": json.loads(defs_chain(1000))},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"guided_grammar": lark_chain(3000)}, "guided_grammar"),
        # A schema given as text, too deep for json.loads: a RecursionError, a 500 before.
        ({"guided_json": "[" * 5000 + "]" * 5000}, "guided_json"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "[" * 5000}}]},
            "tools[0].function.parameters",
        ),
        (  # nested 300 deep, a forced call: a RecursionError building its schema, a 500
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": json.loads(
                                '{"type":"object","properties":{"a":' * 300 + "{}" + "}}" * 300
                            ),
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
        ({"guided_regex": "(a{1000}){1000}"}, "guided_regex"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(http, fields: dict, param: str) -> None:
    body = {"model": MODEL, "messages": USER, **fields}
    response = await http.post("/v1/chat/completions", json=body, headers=_auth())
    assert response.status == 400, await response.text()
    assert (await response.json())["error"]["param"] == param


def test_grpc_requests_take_the_same_fields_and_rules() -> None:
    weather = gateway_pb2.Tool(
        name="get_weather", parameters=json.dumps(WEATHER_TOOL["function"]["parameters"])
    )
    msg = gateway_pb2.GenerateRequest(
        model=MODEL,
        chat=gateway_pb2.ChatMessages(
            messages=[gateway_pb2.ChatMessage(role="user", content="hi")]
        ),
        tools=[weather],
        tool_choice=gateway_pb2.TOOL_CHOICE_REQUIRED,
        parallel_tool_calls=False,
    )
    req = request_from_proto(msg, "gen-1", {}, DEFAULT_LIMITS)
    jsonschema.validate(
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        json.loads(req.sampling.structured.value),
    )
    msg.tools[0].parameters = '{"type": "string"}'
    with pytest.raises(Exception) as info:
        request_from_proto(msg, "gen-2", {}, DEFAULT_LIMITS)
    assert info.value.param == "tools[0].function.parameters"
    msg.tools[0].parameters = "[" * 5000 + "]" * 5000  # too deep for json.loads: was a 500
    with pytest.raises(InvalidArgument) as info:
        request_from_proto(msg, "gen-2", {}, DEFAULT_LIMITS)
    assert info.value.param == "tools[0].function.parameters"
    bad_regex = gateway_pb2.GenerateRequest(
        model=MODEL,
        prompt="hi",
        sampling=common_pb2.SamplingParams(structured=common_pb2.StructuredOutput(regex="[a-")),
    )
    # Whether a grammar compiles is checked off the event loop, once the request is admitted.
    req = request_from_proto(bad_regex, "gen-3", {}, DEFAULT_LIMITS)
    with pytest.raises(InvalidArgument) as info:
        asyncio.run(check_grammars(req))
    assert info.value.param == "sampling.structured"
    # A grammar that crashes llguidance is refused by the limits, in a grammar process.
    bad_regex.sampling.structured.json_schema = defs_chain(1000)
    req = request_from_proto(bad_regex, "gen-4", {}, DEFAULT_LIMITS)
    with pytest.raises(InvalidArgument, match="LAYERSERVE_GRAMMAR_MAX_DEPTH") as info:
        asyncio.run(check_grammars(req))
    assert info.value.param == "sampling.structured"


async def test_grpc_port_serves_reflection(scripted) -> None:
    servicer = GatewayServicer(scripted, front_door(API_KEY), DEFAULT_LIMITS)
    async with grpc_gateway(servicer) as address:
        services, generate = await asyncio.to_thread(_reflect, address)
    assert "layerserve.gateway.v1.Gateway" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services
    assert generate.input_type.full_name == "layerserve.gateway.v1.GenerateRequest"
    assert generate.server_streaming
    assert "tools" in generate.input_type.fields_by_name


def _reflect(address: str):
    from google.protobuf.descriptor_pool import DescriptorPool

    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = list(database.get_services())
        pool = DescriptorPool(database)
        service = pool.FindServiceByName("layerserve.gateway.v1.Gateway")
        return services, service.methods_by_name["Generate"]


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}
