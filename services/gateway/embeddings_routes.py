"""POST /v1/embeddings: parsed by embeddings_request.py, served through the same admission as
completions (keys, limits, token reservation, spans, metrics: api_context.py), answered in
OpenAI's CreateEmbeddingResponse shape."""

from __future__ import annotations

import base64
import struct
from typing import Any

from aiohttp import web

from services.common.errors import InvalidArgument, Unavailable
from services.gateway.api_context import ApiAdapter, ApiContext
from services.gateway.backend import GenerationDelta
from services.gateway.embeddings_request import EmbeddingsCall, parse_embeddings_request


def add_embeddings_routes(app: web.Application, api: ApiAdapter) -> None:
    app.router.add_post("/v1/embeddings", api(_create))


async def _create(request: web.Request, api: ApiContext) -> web.StreamResponse:
    body = await api.read_body()
    call = parse_embeddings_request(body, api.trace_context, api.limits, request_id=api.request_id)
    return await api.serve(call.parsed, EmbeddingsRenderer(call))


class EmbeddingsRenderer:
    """The whole response (embeddings are never streamed)."""

    def __init__(self, call: EmbeddingsCall) -> None:
        self._call = call

    def response(self, results: list[GenerationDelta]) -> dict[str, Any]:
        data = [self._item(i, result) for i, result in enumerate(results)]
        prompt_tokens = sum(result.prompt_tokens for result in results)
        served = next((r.model for r in results if r.model), "")
        return {
            "object": "list",
            "data": data,
            "model": served or self._call.parsed.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }

    def _item(self, index: int, result: GenerationDelta) -> dict[str, Any]:
        vector = result.embedding
        if vector is None:
            raise Unavailable("the stack answered without an embedding; retry shortly")
        wanted = self._call.dimensions
        if wanted is not None and wanted != len(vector):
            raise InvalidArgument(
                f"this model's embeddings have {len(vector)} dimensions and cannot be "
                f"shortened; dimensions {wanted} is not supported",
                param="dimensions",
            )
        embedding: list[float] | str = vector
        if self._call.encoding_format == "base64":  # little-endian float32, as OpenAI's
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return {"object": "embedding", "index": index, "embedding": embedding}

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        raise AssertionError("embeddings are not streamed")

    def closing(self) -> list[bytes]:
        raise AssertionError("embeddings are not streamed")

    def error(self, error: BaseException) -> bytes:
        raise AssertionError("embeddings are not streamed")
