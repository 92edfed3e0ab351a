"""Bad input gets a clear error with the right status, and takes nothing down."""

from __future__ import annotations

import grpc
import pytest

from layerserve.gateway.v1 import gateway_pb2
from tests.e2e.conftest import MODEL
from tests.e2e.helpers import chat_body, grpc_generate, post
from tests.openai_schema import validate

LONG_PROMPT = "word " * 9000  # more tokens than the 8192-token context


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/v1/chat/completions", chat_body("hi"), {}, 401),
        ("/v1/chat/completions", chat_body("hi"), {"Authorization": "Bearer wrong"}, 401),
        ("/v1/chat/completions", {**chat_body("hi"), "model": "no-such-model"}, None, 404),
        ("/v1/completions", {"model": MODEL, "prompt": LONG_PROMPT}, None, 400),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 9000}, None, 400),
        ("/v1/chat/completions", chat_body("hi", max_tokens=0), None, 400),
        ("/v1/chat/completions", chat_body("hi", temperature=7), None, 400),
        ("/v1/chat/completions", chat_body("hi", top_p=0), None, 400),
        ("/v1/chat/completions", {"model": MODEL}, None, 400),
    ],
)
def test_http_errors_are_openai_shaped(stack, path, body, headers, status):
    response = post(stack, path, body, headers)
    assert response.status_code == status, response.text
    validate(response.json(), "ErrorResponse")
    assert response.json()["error"]["message"]


def test_prompt_too_long_is_rejected_before_streaming(stack):
    body = {"model": MODEL, "prompt": LONG_PROMPT, "stream": True}
    response = post(stack, "/v1/completions", body)
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("request_fields", "key", "code"),
    [
        ({"model": MODEL, "prompt": "hi"}, None, grpc.StatusCode.UNAUTHENTICATED),
        ({"model": "no-such-model", "prompt": "hi"}, "default", grpc.StatusCode.NOT_FOUND),
        ({"model": MODEL, "prompt": LONG_PROMPT}, "default", grpc.StatusCode.INVALID_ARGUMENT),
        (
            {"model": MODEL, "prompt": "hi", "max_tokens": 0},
            "default",
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        ({"model": MODEL}, "default", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_grpc_errors_carry_status_and_message(stack, request_fields, key, code):
    kwargs = {} if key == "default" else {"key": key}
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(stack, gateway_pb2.GenerateRequest(**request_fields), **kwargs)
    assert info.value.code() == code
    assert info.value.details()


def test_services_survive_bad_input(stack):
    stack.check_alive()
    response = post(stack, "/v1/chat/completions", chat_body("Say hello.", max_tokens=5))
    assert response.status_code == 200
