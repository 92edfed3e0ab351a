"""Runs a parsed OpenAI request against the Backend and answers it: one JSON object, or an SSE
stream of chunks.

Streaming commits to 200 only once every choice has produced its first delta: the backend
reports most failures (unknown model, prompt too long, overload) on the first `__anext__`, and
those deserve their HTTP status rather than an error event inside a 200. After that, an error
becomes an SSE `error` event and the stream ends.

Whatever ends the handler (success, error, the client resetting the connection, the handler
task being cancelled, the client reading nothing for stalled_client_seconds) closes every
choice's backend iterator: `ChoiceStreams.close()` in a `finally`, so the backend aborts at once
instead of generating for nobody, and the scheduler frees the request's KV blocks.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from aiohttp import web

from services.common import tracing
from services.common.errors import LayerserveError
from services.gateway.backend import Backend, GenerationDelta
from services.gateway.choice_streams import (
    ChoiceStreams,
    ClientStalled,
    Item,
    coalesce,
    merge_deltas,
    write_within,
)
from services.gateway.http_json import SSE_DONE, error_payload, json_response, sse_event
from services.gateway.openai_protocol import ParsedRequest
from services.gateway.openai_responses import ResponseBuilder
from services.gateway.request_metrics import count_error, error_code

log = logging.getLogger(__name__)


class Renderer(Protocol):
    """One API's shapes of a response (OpenAI's chat and completions by default; the Responses
    and Anthropic Messages APIs bring their own): the whole object, and the SSE events."""

    def response(self, results: list[GenerationDelta]) -> dict[str, Any]:
        """The non-streaming body; results[i] is choice i's whole output as one delta."""
        ...

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        """The SSE events for (possibly coalesced) deltas of one choice."""
        ...

    def closing(self) -> list[bytes]:
        """The SSE events after every choice has finished."""
        ...

    def error(self, error: BaseException) -> bytes:
        """The SSE event that reports a failure mid-stream (the last one)."""
        ...


class ChunkRenderer:
    """OpenAI's text_completion and chat.completion objects and chunks (ResponseBuilder)."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._builder = ResponseBuilder(parsed)

    def response(self, results: list[GenerationDelta]) -> dict[str, Any]:
        return self._builder.response(results)

    def events(self, index: int, delta: GenerationDelta) -> list[bytes]:
        return [sse_event(chunk) for chunk in self._builder.chunks(index, delta)]

    def closing(self) -> list[bytes]:
        usage = [sse_event(self._builder.usage_chunk())] if self._builder.include_usage else []
        return [*usage, SSE_DONE]

    def error(self, error: BaseException) -> bytes:
        return sse_event(error_payload(error))


SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    # Reverse proxies (nginx) buffer responses by default, which would hold tokens back.
    "X-Accel-Buffering": "no",
}


async def respond_full(
    backend: Backend, parsed: ParsedRequest, renderer: Renderer | None = None
) -> web.Response:
    """Waits for every choice to finish; the first error fails the whole request."""
    streams = ChoiceStreams(backend, parsed.requests)
    outputs: list[list[GenerationDelta]] = [[] for _ in parsed.requests]
    try:
        while not streams.finished:
            for index, item in await streams.next_batch():
                if isinstance(item, BaseException):
                    raise item
                outputs[index].append(item)
    finally:
        streams.close()
    with tracing.current_child("deliver"):
        results = [merge_deltas(deltas) for deltas in outputs]
        return json_response((renderer or ChunkRenderer(parsed)).response(results))


async def respond_stream(
    request: web.Request,
    request_id: str,
    backend: Backend,
    parsed: ParsedRequest,
    stalled_client_seconds: float,
    renderer: Renderer | None = None,
) -> web.StreamResponse:
    streams = ChoiceStreams(backend, parsed.requests)
    renderer = renderer or ChunkRenderer(parsed)
    try:
        first = await streams.first_batch()
        _raise_any_error(first)
        response = web.StreamResponse(headers=SSE_HEADERS)
        sink = _Sink(response, stalled_client_seconds)
        try:
            with tracing.current_child("deliver"):  # from the first chunk to the last
                await response.prepare(request)
                await _write_events(sink, streams, renderer, first, request_id)
        except ConnectionError:  # aiohttp's ClientConnectionResetError is one
            log.info("request %s: client went away mid-stream; aborting", request_id)
            count_error("cancelled")  # a 200 already: the error middleware cannot see it
        except ClientStalled as stalled:
            log.warning("request %s: %s; cut off and aborted", request_id, stalled)
            count_error("cancelled")
            if request.transport is not None:
                request.transport.abort()  # drops what is buffered for the client too
        return response
    finally:
        streams.close()


def _raise_any_error(items: list[Item]) -> None:
    for _, item in items:
        if isinstance(item, BaseException):
            raise item


class _Sink:
    """The response's writes, each given stalled_client_seconds to be taken."""

    def __init__(self, response: web.StreamResponse, stalled_client_seconds: float) -> None:
        self._response = response
        self._seconds = stalled_client_seconds

    async def write(self, data: bytes) -> None:
        await write_within(self._response.write(data), self._seconds)

    async def write_eof(self) -> None:
        await write_within(self._response.write_eof(), self._seconds)


async def _write_events(
    response: _Sink,
    streams: ChoiceStreams,
    renderer: Renderer,
    items: list[Item],
    request_id: str,
) -> None:
    """Writes what is queued, then waits for more. Everything queued while the previous write
    was in flight goes out merged, one chunk per choice: a slow reader costs fewer, larger
    chunks instead of a growing backlog of tiny ones."""
    while True:
        merged, error = coalesce(items)
        events = [event for i, d in merged.items() for event in renderer.events(i, d)]
        if error is not None:
            _note_stream_error(error, request_id)
            events.append(renderer.error(error))
        elif streams.finished:
            events.extend(renderer.closing())
        if events:
            await response.write(b"".join(events))
        if error is not None or streams.finished:
            await response.write_eof()
            return
        items = await streams.next_batch()


def _note_stream_error(error: BaseException, request_id: str) -> None:
    count_error(error_code(error))  # a 200 already: the error middleware cannot see it
    if isinstance(error, LayerserveError):
        log.warning("request %s: failed mid-stream: %s", request_id, error.message)
    else:
        log.error("request %s: failed mid-stream", request_id, exc_info=error)
