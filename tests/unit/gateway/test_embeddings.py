"""POST /v1/embeddings at the gateway: inputs in every form OpenAI takes, one request each
through the stack, answered in OpenAI's shape (float or base64), with usage and errors."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.api_keys import KeyRing
from services.gateway.backend import GenerationDelta, GenerationRequest, ModelCard
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, public_server
from services.gateway.http_app import create_app
from services.gateway.request_limits import DEFAULT_LIMITS
from tests.openai_schema import validate
from tests.unit.gateway.conftest import API_KEY, front_door

MODEL = "m"


class EmbeddingBackend:
    """A vector of three made from the prompt's length; one prompt token per character."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def list_models(self) -> list[ModelCard]:
        return [ModelCard(id=MODEL, max_model_len=2048)]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.requests.append(request)
        size = len(request.prompt or "") or len(request.prompt_token_ids or [])
        yield GenerationDelta(
            "x", [7], finish_reason="length", prompt_tokens=size, completion_tokens=1,
            model=MODEL, embedding=[0.5, 0.25, float(size)],
        )  # fmt: skip


@pytest.fixture
def backend() -> EmbeddingBackend:
    return EmbeddingBackend()


@pytest.fixture
async def client(backend: EmbeddingBackend) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(backend))) as test_client:  # type: ignore[arg-type]
        yield test_client


async def _embed(client: TestClient, **fields) -> tuple[int, dict]:
    response = await client.post("/v1/embeddings", json={"model": MODEL, **fields})
    return response.status, await response.json()


@pytest.mark.parametrize(
    ("value", "sizes"),
    [
        ("hello", [5]),
        (["hello", "hi"], [5, 2]),
        ([1, 2, 3], [3]),
        ([[1, 2], [3]], [2, 1]),
    ],
)
async def test_every_input_form_gets_one_embedding_each(
    client: TestClient, backend: EmbeddingBackend, value, sizes: list[int]
) -> None:
    status, body = await _embed(client, input=value)
    assert status == 200, body
    validate(body, "CreateEmbeddingResponse")
    assert [item["index"] for item in body["data"]] == list(range(len(sizes)))
    assert [item["embedding"][2] for item in body["data"]] == sizes
    assert body["usage"] == {"prompt_tokens": sum(sizes), "total_tokens": sum(sizes)}
    assert all(r.embed and r.max_tokens.limit == 1 for r in backend.requests)


async def test_base64_is_little_endian_float32(client: TestClient) -> None:
    status, body = await _embed(client, input="hey", encoding_format="base64")
    assert status == 200, body
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert struct.unpack("<3f", raw) == (0.5, 0.25, 3.0)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", 5]}, "input"),
        ({"input": [[-1]]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 2}, "dimensions"),
        ({"input": ["a"] * 2049}, "input"),
    ],
)
async def test_bad_requests_name_the_field(client: TestClient, fields: dict, param: str) -> None:
    status, body = await _embed(client, **fields)
    assert status == 400, body
    assert body["error"]["param"] == param


async def test_dimensions_of_the_models_own_size_are_served(client: TestClient) -> None:
    status, body = await _embed(client, input="a", dimensions=3)
    assert status == 200, body


async def test_grpc_embed_serves_the_same_call(backend: EmbeddingBackend) -> None:
    server = public_server(DEFAULT_LIMITS, [])
    servicer = GatewayServicer(backend, FrontDoor(KeyRing([])), DEFAULT_LIMITS)  # type: ignore[arg-type]
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            reply = await stub.Embed(gateway_pb2.EmbedRequest(model=MODEL, inputs=["ab", "abc"]))
            assert [list(e.values) for e in reply.embeddings] == [[0.5, 0.25, 2], [0.5, 0.25, 3]]
            assert (reply.prompt_tokens, reply.model) == (5, MODEL)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Embed(gateway_pb2.EmbedRequest(model=MODEL))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "input" in (refused.value.details() or "")
    finally:
        await server.stop(None)


async def test_the_key_is_charged_for_every_input(backend: EmbeddingBackend) -> None:
    app = create_app(backend, front_door=front_door(API_KEY))  # type: ignore[arg-type]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with TestClient(TestServer(app)) as client:
        body = {"model": MODEL, "input": ["hello", "hi"]}
        response = await client.post("/v1/embeddings", json=body, headers=headers)
        assert response.status == 200
        usage = await (await client.get("/v1/usage", headers=headers)).json()
    assert usage["prompt_tokens"] == 7  # 5 + 2, not the first input's alone
