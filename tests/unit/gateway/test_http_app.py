"""The HTTP front end, non-streaming: responses, errors, auth, routes, against OpenAI's schemas."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.openai_schema import validate
from tests.unit.gateway.conftest import API_KEY
from tests.unit.gateway.echo_backend import CACHED_TOKENS, MODEL, EchoBackend


async def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    validate(body, "ErrorResponse")
    return body["error"]


async def test_completion(client: TestClient, backend: EchoBackend) -> None:
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "one two three", "max_tokens": 2}
    )
    assert response.status == 200
    body = await response.json()
    validate(body, "CreateCompletionResponse")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == MODEL
    assert body["choices"] == [
        {"index": 0, "text": "one two", "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }
    assert backend.requests[0].request_id == body["id"] + "-0"


async def test_completion_logprobs(client: TestClient) -> None:
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a bb", "logprobs": 2}
    )
    body = await response.json()
    validate(body, "CreateCompletionResponse")
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["a", " bb"]
    assert logprobs["token_logprobs"] == [-0.25, -0.25]
    assert logprobs["text_offset"] == [0, 1]
    assert logprobs["top_logprobs"][1] == {" bb": -0.25, "alt1": -2.0}


async def test_chat_completion(client: TestClient) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi there"}]},
    )
    body = await response.json()
    validate(body, "CreateChatCompletionResponse")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "hi there", "refusal": None}
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 2


async def test_chat_logprobs(client: TestClient) -> None:
    body = await (
        await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "héllo"}],
                "logprobs": True,
                "top_logprobs": 2,
            },
        )
    ).json()
    validate(body, "CreateChatCompletionResponse")
    (entry,) = body["choices"][0]["logprobs"]["content"]
    assert entry["token"] == "héllo" and entry["bytes"] == list("héllo".encode())
    assert [t["token"] for t in entry["top_logprobs"]] == ["héllo", "alt1"]


async def test_n_choices(client: TestClient, backend: EchoBackend) -> None:
    body = await (
        await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "a b c d e f g"}],
                "n": 2,
                "seed": 1,
            },
        )
    ).json()
    validate(body, "CreateChatCompletionResponse")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert texts[0] == "b c d e f g a" and texts[0] != texts[1]
    assert len({r.sampling.seed for r in backend.requests}) == 2
    assert body["usage"]["prompt_tokens"] == 7  # the shared prompt counts once
    assert body["usage"]["completion_tokens"] == 14


async def test_stop_sequence_reaches_the_backend(client: TestClient) -> None:
    body = await (
        await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "a b STOP c", "stop": ["STOP"]}
        )
    ).json()
    assert body["choices"][0]["text"] == "a b" and body["choices"][0]["finish_reason"] == "stop"


async def test_bad_parameter_is_400_naming_it(client: TestClient) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9},
    )
    error = await _error(response, 400)
    assert error["param"] == "temperature" and error["type"] == "invalid_request_error"


async def test_bad_json_is_400(client: TestClient) -> None:
    response = await client.post(
        "/v1/completions", data=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    error = await _error(response, 400)
    assert "not valid JSON" in error["message"]


async def test_missing_prompt_is_400(client: TestClient) -> None:
    error = await _error(await client.post("/v1/completions", json={"model": MODEL}), 400)
    assert error["param"] == "prompt"


async def test_unknown_model_is_404(client: TestClient) -> None:
    response = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    error = await _error(response, 404)
    assert error["param"] == "model" and "nope" in error["message"]


async def test_prompt_too_long_is_400(client: TestClient) -> None:
    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "w " * 100})
    assert (await _error(response, 400))["message"].startswith("prompt is too long")


async def test_backend_failure_mid_generation_fails_the_request(client: TestClient) -> None:
    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "a boom"})
    error = await _error(response, 503)
    assert error["message"] == "the worker went away"


async def test_unexpected_exception_is_generic_500(client: TestClient, backend: Any) -> None:
    async def broken() -> list[Any]:
        raise RuntimeError("secret detail")

    backend.list_models = broken
    response = await client.get("/v1/models")
    error = await _error(response, 500)
    assert "secret" not in error["message"] and error["type"] == "server_error"


async def test_unknown_route_is_404_json(client: TestClient) -> None:
    error = await _error(await client.get("/v1/nothing"), 404)
    assert error["type"] == "invalid_request_error"


async def test_wrong_method_is_405_json(client: TestClient) -> None:
    response = await client.get("/v1/completions")
    await _error(response, 405)
    assert response.headers["Allow"] == "POST"


async def test_models(client: TestClient) -> None:
    body = await (await client.get("/v1/models")).json()
    validate(body, "ListModelsResponse")
    assert [m["id"] for m in body["data"]] == [MODEL]
    model = await (await client.get(f"/v1/models/{MODEL}")).json()
    validate(model, "Model")
    await _error(await client.get("/v1/models/other"), 404)


async def test_health(client: TestClient) -> None:
    response = await client.get("/health")
    assert response.status == 200 and await response.json() == {"status": "ok"}


async def test_request_id_echoed_or_generated(client: TestClient) -> None:
    response = await client.get("/health", headers={"X-Request-Id": "abc-123"})
    assert response.headers["X-Request-Id"] == "abc-123"
    response = await client.get("/health", headers={"X-Request-Id": "bad id\u00e9"})
    assert len(response.headers["X-Request-Id"]) == 32
    response = await client.get("/v1/nothing")
    assert response.headers["X-Request-Id"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": API_KEY},
        {"Authorization": "Bearer é"},
    ],
)
async def test_auth_rejects(auth_client: TestClient, headers: dict[str, str]) -> None:
    response = await auth_client.get("/v1/models", headers=headers)
    error = await _error(response, 401)
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"


async def test_auth_accepts_key_and_health_needs_none(auth_client: TestClient) -> None:
    response = await auth_client.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status == 200
    assert (await auth_client.get("/health")).status == 200


async def test_no_keys_accepts_all(client: TestClient) -> None:
    response = await client.get("/v1/models", headers={"Authorization": "Bearer anything"})
    assert response.status == 200
