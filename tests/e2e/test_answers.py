"""A real question gets a real answer, through every front door."""

from __future__ import annotations

import openai

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from tests.e2e.conftest import API_KEY, MODEL
from tests.e2e.helpers import chat_body, grpc_generate, post, stream
from tests.openai_schema import validate

QUESTION = "What is the capital of France?"


def test_chat_answers_paris_over_http(stack):
    response = post(stack, "/v1/chat/completions", chat_body(QUESTION, max_tokens=30))
    assert response.status_code == 200, response.text
    body = response.json()
    validate(body, "CreateChatCompletionResponse")
    assert "Paris" in body["choices"][0]["message"]["content"]
    usage = body["usage"]
    assert usage["prompt_tokens"] > 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_answers_paris_through_the_openai_sdk(stack):
    client = openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY)
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_completion_tokens=30,
    )
    assert "Paris" in completion.choices[0].message.content
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_completion_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == completion.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_answers_paris_over_grpc(stack):
    request = gateway_pb2.GenerateRequest(
        model=MODEL,
        chat=gateway_pb2.ChatMessages(
            messages=[gateway_pb2.ChatMessage(role="user", content=QUESTION)]
        ),
        max_tokens=30,
        # Greedy: without a sampling message the model's defaults would sample (temperature 0.2).
        sampling=common_pb2.SamplingParams(),
    )
    responses = grpc_generate(stack, request)
    text = "".join(r.text for r in responses)
    assert "Paris" in text
    assert responses[-1].finish_reason in (
        common_pb2.FINISH_REASON_STOP,
        common_pb2.FINISH_REASON_LENGTH,
    )
    assert sum(len(r.token_ids) for r in responses) == responses[-1].completion_tokens


def test_streamed_chunks_validate_and_end_with_usage(stack):
    events = stream(
        stack,
        "/v1/chat/completions",
        chat_body(QUESTION, max_tokens=20, stream_options={"include_usage": True}),
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
