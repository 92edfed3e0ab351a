"""Structured outputs and tool calls on the real stack: the grammar really runs on the worker,
so even SmolLM2-135M answers in the shape asked for, through unchanged SDKs."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.e2e.conftest import API_KEY, MODEL
from tests.e2e.helpers import chat_body, post, stream
from tests.openai_schema import validate

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": WEATHER_PARAMETERS,
    },
}
QUESTION = "What will the weather be in Paris over the next 3 days?"


class Capital(BaseModel):
    country: str
    capital: str


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY, max_retries=0)


def test_sdk_parse_returns_a_valid_object(client) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format=Capital,
        temperature=0,
        max_completion_tokens=60,
    )
    assert completion.choices[0].finish_reason == "stop"
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    jsonschema.validate(parsed.model_dump(), Capital.model_json_schema())


def test_required_tool_call_has_valid_arguments(stack, client) -> None:
    body = {
        **chat_body(QUESTION, max_tokens=60),
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
    }
    response = post(stack, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    validate(answer, "CreateChatCompletionResponse")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] == "get_weather" for c in calls)
    for call in calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_PARAMETERS)
    # Streamed: the same calls, as OpenAI streams them, every chunk in OpenAI's schema.
    chunks = [c for c in stream(stack, "/v1/chat/completions", body) if c != "[DONE]"]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    streamed = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    headers = [d for d in streamed if "id" in d]
    assert [h["function"] for h in headers] == [
        {"name": "get_weather", "arguments": ""} for _ in calls
    ]
    arguments = "".join(d["function"]["arguments"] for d in streamed if "id" not in d)
    assert arguments == "".join(c["function"]["arguments"] for c in calls)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_langchain_structured_output_and_forced_tools(stack) -> None:
    llm = ChatOpenAI(
        base_url=f"{stack.http_url}/v1",
        api_key=API_KEY,
        model=MODEL,
        temperature=0,
        max_completion_tokens=60,
        max_retries=0,
    )
    capital = llm.with_structured_output(Capital).invoke("The capital of Italy, as JSON.")
    assert isinstance(capital, Capital)

    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city."""
        return "sunny"

    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(QUESTION)
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    args = message.tool_calls[0]["args"]
    assert isinstance(args["city"], str) and isinstance(args["days"], int)


def test_vllm_guided_fields(stack) -> None:
    choice = post(
        stack,
        "/v1/chat/completions",
        {**chat_body("Is Paris in France?", max_tokens=5), "guided_choice": ["yes", "no"]},
    ).json()
    assert choice["choices"][0]["message"]["content"] in ("yes", "no")
    regex = post(
        stack,
        "/v1/completions",
        {"model": MODEL, "prompt": "The year is", "max_tokens": 8, "guided_regex": r" [12]\d{3}"},
    ).json()
    assert re.fullmatch(r" [12]\d{3}", regex["choices"][0]["text"])
