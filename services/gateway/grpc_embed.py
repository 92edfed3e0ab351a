"""The public gRPC Embed rpc: EmbedRequest -> the HTTP API's embeddings call (the same parser,
so the same checks and errors), admitted by the front door, answered as an EmbedResponse."""

from __future__ import annotations

from layerserve.gateway.v1 import gateway_pb2
from services.common.errors import InvalidArgument
from services.gateway.api_keys import ApiKey
from services.gateway.backend import Backend, GenerationDelta
from services.gateway.choice_streams import ChoiceStreams, merge_deltas
from services.gateway.embeddings_request import parse_embeddings_request
from services.gateway.embeddings_routes import EmbeddingsRenderer
from services.gateway.front_door import FrontDoor
from services.gateway.request_limits import RequestLimits


async def embed(
    msg: gateway_pb2.EmbedRequest,
    request_id: str,
    trace_context: dict[str, str],
    key: ApiKey,
    door: FrontDoor,
    backend: Backend,
    limits: RequestLimits,
) -> gateway_pb2.EmbedResponse:
    if msg.inputs and msg.token_inputs:
        raise InvalidArgument("set inputs or token_inputs, not both", param="inputs")
    inputs = list(msg.inputs) or [list(t.ids) for t in msg.token_inputs]
    body = {"model": msg.model, "input": inputs}
    call = parse_embeddings_request(body, trace_context, limits, request_id=request_id)
    requests = call.parsed.requests
    async with door.admit(key, call.parsed.model, backend, requests) as metered:
        results = await _results(len(requests), ChoiceStreams(metered, requests))
    body = EmbeddingsRenderer(call).response(results)  # checks every input got its vector
    return gateway_pb2.EmbedResponse(
        embeddings=[gateway_pb2.Embedding(values=item["embedding"]) for item in body["data"]],
        prompt_tokens=body["usage"]["prompt_tokens"],
        model=body["model"],
    )


async def _results(count: int, streams: ChoiceStreams) -> list[GenerationDelta]:
    outputs: list[list[GenerationDelta]] = [[] for _ in range(count)]
    try:
        while not streams.finished:
            for index, item in await streams.next_batch():
                if isinstance(item, BaseException):
                    raise item
                outputs[index].append(item)
    finally:
        streams.close()  # aborts what is still running (the client went away)
    return [merge_deltas(deltas) for deltas in outputs]
