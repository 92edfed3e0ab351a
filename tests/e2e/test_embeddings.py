"""POST /v1/embeddings and the gRPC Embed rpc on the real stack's chat model: its pooled hidden
states, not trained for retrieval, so the tests check the contract (shapes, normalisation,
determinism, batching, the SDKs). Retrieval quality, from a sentence-embedding model served
beside it: test_sentence_embeddings.py."""

from __future__ import annotations

import math

import grpc
import openai
from langchain_openai import OpenAIEmbeddings

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from tests.e2e.conftest import API_KEY, MODEL
from tests.e2e.helpers import post
from tests.openai_schema import validate

HIDDEN_SIZE = 576  # SmolLM2-135M's
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "Hello"]


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a, b, strict=True))


def test_the_openai_sdk_gets_normalised_vectors_batched_or_not(stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=API_KEY)
    batch = client.embeddings.create(model=MODEL, input=TEXTS)  # base64 on the wire
    vectors = [item.embedding for item in batch.data]
    assert [len(v) for v in vectors] == [HIDDEN_SIZE] * 3
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-3) for v in vectors)
    single = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert _close(single.data[0].embedding, vectors[1])
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > 10
    body = post(stack, "/v1/embeddings", {"model": MODEL, "input": TEXTS[:2]}).json()
    validate(body, "CreateEmbeddingResponse")


def test_langchain_embeds_documents_and_queries(stack) -> None:
    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{stack.http_url}/v1",
        api_key=API_KEY,
        check_embedding_ctx_length=False,  # else it sends OpenAI's tokenizer's ids
    )
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[0])
    assert len(documents) == 3 and _close(query, documents[0])


def test_grpc_embed(stack) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        reply = stub.Embed(
            gateway_pb2.EmbedRequest(model=MODEL, inputs=TEXTS[:2]),
            metadata=[("authorization", f"Bearer {API_KEY}")],
            timeout=60,
        )
    assert [len(e.values) for e in reply.embeddings] == [HIDDEN_SIZE] * 2
    assert reply.model == MODEL and reply.prompt_tokens > 5
