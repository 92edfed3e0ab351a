"""The HTTP front end, streaming: SSE chunks against OpenAI's schemas, errors before and after
the 200, usage, n choices, and aborting the backend when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer

from services.common.errors import InvalidArgument
from services.gateway.backend import GenerationDelta, GenerationRequest
from services.gateway.http_app import create_app
from tests.openai_schema import COMPLETION_STREAM_SCHEMA, validate
from tests.unit.gateway.echo_backend import CACHED_TOKENS, MODEL, EchoBackend
from tests.unit.gateway.sse import DONE, read_events

CHAT_CHUNK = "CreateChatCompletionStreamResponse"
MESSAGES = [{"role": "user", "content": "the quick brown fox jumps"}]


async def _stream(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    response = await client.post(path, json={"model": MODEL, "stream": True, **body})
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Request-Id"]
    return await read_events(response)


def _chunks(events: list[Any], schema: str) -> list[dict[str, Any]]:
    assert events[-1] == DONE and DONE not in events[:-1]
    for event in events[:-1]:
        validate(event, schema)
    return events[:-1]


async def test_chat_stream_matches_non_stream(client: TestClient, backend: EchoBackend) -> None:
    backend.token_delay = 0.005  # tokens arrive apart, so they go out as they come
    chunks = _chunks(
        await _stream(client, "/v1/chat/completions", {"messages": MESSAGES}), CHAT_CHUNK
    )
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    choices = [c["choices"][0] for c in chunks]
    assert len(choices) > 1
    assert choices[0]["delta"]["role"] == "assistant"
    assert all("role" not in c["delta"] for c in choices[1:])
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["stop"]
    streamed = "".join(c["delta"].get("content", "") for c in choices)
    full = await (
        await client.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
    ).json()
    assert streamed == full["choices"][0]["message"]["content"] == MESSAGES[0]["content"]


async def test_completion_stream_matches_non_stream(
    client: TestClient, backend: EchoBackend
) -> None:
    backend.token_delay = 0.001
    body = {"prompt": "alpha beta gamma delta", "max_tokens": 3, "logprobs": 1}
    chunks = _chunks(await _stream(client, "/v1/completions", body), COMPLETION_STREAM_SCHEMA)
    assert all(c["object"] == "text_completion" for c in chunks)
    choices = [c["choices"][0] for c in chunks]
    assert choices[-1]["finish_reason"] == "length"
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    assert offsets == [0, 5, 10]  # offsets run on across chunks
    full = await (await client.post("/v1/completions", json={"model": MODEL, **body})).json()
    assert "".join(c["text"] for c in choices) == full["choices"][0]["text"] == "alpha beta gamma"


async def test_include_usage_adds_a_final_usage_chunk(client: TestClient) -> None:
    for path, extra, schema in [
        ("/v1/chat/completions", {"messages": MESSAGES}, CHAT_CHUNK),
        ("/v1/completions", {"prompt": "one two"}, COMPLETION_STREAM_SCHEMA),
    ]:
        body = {**extra, "stream_options": {"include_usage": True}}
        chunks = _chunks(await _stream(client, path, body), schema)
        *content, last = chunks
        assert all(c["usage"] is None and c["choices"] for c in content)
        assert last["choices"] == []
        prompt = len(extra.get("prompt", MESSAGES[0]["content"]).split())
        assert last["usage"]["prompt_tokens"] == prompt
        assert last["usage"]["completion_tokens"] in (prompt, 16)
        assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED_TOKENS}


async def test_n_choices_stream(client: TestClient, backend: EchoBackend) -> None:
    backend.token_delay = 0.001
    body = {"messages": MESSAGES, "n": 2, "seed": 3, "stream_options": {"include_usage": True}}
    chunks = _chunks(await _stream(client, "/v1/chat/completions", body), CHAT_CHUNK)
    texts = {0: "", 1: ""}
    for index in (0, 1):
        mine = [
            c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index
        ]
        assert mine[0]["delta"]["role"] == "assistant" and mine[-1]["finish_reason"] == "stop"
        texts[index] = "".join(c["delta"].get("content", "") for c in mine)
    assert texts[0] != texts[1]
    assert sorted(texts[0].split()) == sorted(MESSAGES[0]["content"].split())
    assert chunks[-1]["usage"]["completion_tokens"] == 10


async def test_error_on_first_token_keeps_its_status(client: TestClient) -> None:
    response = await client.post(
        "/v1/completions", json={"model": "nope", "prompt": "x", "stream": True}
    )
    assert response.status == 404 and response.content_type == "application/json"
    validate(await response.json(), "ErrorResponse")
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "w " * 99}]},
    )
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "messages"


class _SecondChoiceFails(EchoBackend):
    """Choice 1 fails on its first __anext__, after choice 0 has produced tokens."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        if not request.request_id.endswith("-1"):
            return super().generate(request)
        return self._fail_late(request)

    async def _fail_late(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        await asyncio.sleep(0.05)
        raise InvalidArgument("choice 1 is refused", param="n")
        yield  # an async generator, like the real backend


async def test_every_choice_is_awaited_before_the_200() -> None:
    backend = _SecondChoiceFails()
    async with TestClient(_server(backend)) as client:
        body = {"model": MODEL, "stream": True, "n": 2, "messages": MESSAGES}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 400
        assert (await response.json())["error"]["message"] == "choice 1 is refused"
    await _wait_for(lambda: backend.finalized == [f"{backend.requests[0].request_id}"])


async def test_error_mid_stream_is_an_error_event(client: TestClient, backend: EchoBackend) -> None:
    backend.token_delay = 0.001
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b boom", "stream": True}
    )
    assert response.status == 200
    events = await read_events(response)
    assert DONE not in events
    *chunks, error = events
    for chunk in chunks:
        validate(chunk, COMPLETION_STREAM_SCHEMA)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "a b"
    validate(error, "ErrorResponse")
    assert error["error"]["message"] == "the worker went away"


async def test_disconnect_aborts_every_choice(client: TestClient, backend: EchoBackend) -> None:
    """The test server cancels the handler when the client goes (handler_cancellation)."""
    await _disconnect_midway(client.make_url("/v1/completions"), backend)


async def test_disconnect_detected_on_write_without_handler_cancellation() -> None:
    """__main__'s AppRunner leaves handler_cancellation off: a failed write must do the job."""
    backend = EchoBackend()
    runner = web.AppRunner(create_app(backend), handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        await _disconnect_midway(f"http://127.0.0.1:{port}/v1/completions", backend)
    finally:
        await runner.cleanup()


async def _disconnect_midway(url: Any, backend: EchoBackend) -> None:
    backend.token_delay = 0.01
    body = {"model": MODEL, "prompt": "a b c", "stream": True, "n": 2}
    body.update(max_tokens=10_000, ignore_eos=True)
    async with ClientSession() as session:
        response = await session.post(url, json=body)
        assert response.status == 200
        for _ in range(4):
            assert (await response.content.readline()).startswith((b"data: ", b"\n"))
        response.close()
    ids = {r.request_id for r in backend.requests}
    assert len(ids) == 2
    await _wait_for(lambda: set(backend.aborted) == ids and set(backend.finalized) == ids)


def _server(backend: EchoBackend) -> TestServer:
    return TestServer(create_app(backend))


async def _wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
