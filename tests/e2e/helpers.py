"""Small clients for the end-to-end tests: OpenAI HTTP (with SSE parsing) and gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import httpx

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(stack: Stack, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{stack.http_url}{path}",
        json=body,
        headers=AUTH if headers is None else headers,
        timeout=120,
    )


def sse_events(response: httpx.Response) -> Iterator[dict | str]:
    """Parsed `data:` events of a streaming response; "[DONE]" as the string."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        yield data if data == "[DONE]" else json.loads(data)


def stream(stack: Stack, path: str, body: dict) -> list[dict | str]:
    with httpx.stream(
        "POST", f"{stack.http_url}{path}", json={**body, "stream": True}, headers=AUTH, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response))


def grpc_generate(
    stack: Stack, request: gateway_pb2.GenerateRequest, key: str | None = API_KEY
) -> list[gateway_pb2.GenerateResponse]:
    metadata = [("authorization", f"Bearer {key}")] if key else []
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        return list(stub.Generate(request, metadata=metadata, timeout=120))


def greedy_tokens(stack: Stack, prompt: str, max_tokens: int) -> list[int]:
    """The token ids of a greedy gRPC generation of exactly max_tokens (EOS ignored)."""
    request = gateway_pb2.GenerateRequest(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=True,
        sampling=common_pb2.SamplingParams(temperature=0),
    )
    return [t for response in grpc_generate(stack, request) for t in response.token_ids]


def chat_body(content: str, **extra) -> dict:
    return {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        **extra,
    }
