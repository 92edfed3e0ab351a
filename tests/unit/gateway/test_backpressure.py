"""Issue 17 row 3 in process: a stream's buffer in the gateway is bounded, and a client that
stops reading is cut off after stalled_client_seconds with its request aborted upstream, over
SSE and over gRPC. (tests/reliability/test_hostile_clients.py measures 100 such clients'
memory on a real stack.)"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import grpc
import pytest
from aiohttp.test_utils import TestServer

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.common.max_tokens import MaxTokens
from services.gateway.api_keys import KeyRing
from services.gateway.backend import GenerationRequest
from services.gateway.choice_streams import (
    MAX_BUFFERED_ITEMS,
    MAX_UNREAD_TOKENS,
    ChoiceStreams,
    ClientStalled,
    coalesce,
)
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, public_server
from services.gateway.http_app import create_app
from services.gateway.request_limits import RequestLimits
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

LIMITS = RequestLimits(stalled_client_seconds=0.5)
# 60 words of 500 characters: every token is 500 bytes.
PROMPT = " ".join(f"{i:03d}" + "w" * 497 for i in range(60))
# Tokens of 4 kB, one a millisecond for 30 s: far more than the socket buffers between a
# server and a client that reads nothing hold after a second.
BIG_PROMPT = " ".join(f"{i:03d}" + "w" * 3997 for i in range(60))


async def test_a_stream_nobody_reads_is_stopped_at_a_token_bound() -> None:
    """What a reader that is away costs is bounded by MAX_UNREAD_TOKENS, not by max_tokens nor
    by how long the cut-off takes: its choices are aborted upstream past it."""
    backend = EchoBackend()
    request = GenerationRequest(
        "r-0", MODEL, prompt=PROMPT, max_tokens=MaxTokens(5000), ignore_eos=True
    )
    streams = ChoiceStreams(backend, [request, GenerationRequest("r-1", MODEL, "a b")])
    peak = 0
    for _ in range(6000):  # the pumps run; the reader is away
        await asyncio.sleep(0)
        peak = max(peak, streams.buffered)
    assert peak <= MAX_BUFFERED_ITEMS + 2
    assert "r-0" in backend.aborted  # the request is stopped upstream, every choice of it
    merged, _ = coalesce(streams._items)
    assert len(merged[0].token_ids) <= MAX_UNREAD_TOKENS + 1
    with pytest.raises(ClientStalled, match=f"over {MAX_UNREAD_TOKENS} tokens unread"):
        await streams.next_batch()


async def test_a_reader_that_keeps_coming_back_gets_everything() -> None:
    request = GenerationRequest(
        "r-0", MODEL, prompt=PROMPT, max_tokens=MaxTokens(5000), ignore_eos=True
    )
    streams = ChoiceStreams(EchoBackend(), [request])
    items = []
    while not streams.finished:
        items += await streams.next_batch()
        for _ in range(20):  # a write that takes a while
            await asyncio.sleep(0)
    merged, error = coalesce(items)
    assert error is None and merged[0].completion_tokens == 5000
    assert len(merged[0].token_ids) == 5000 and len(merged[0].text) == 5000 * 501 - 1


async def _until(check, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "never happened"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def _stalled_socket(port: int, request: bytes) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock  # and never read


async def test_an_sse_client_that_stops_reading_is_cut_off_and_its_request_aborted() -> None:
    backend = EchoBackend(token_delay=0.001)
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": BIG_PROMPT,
            "max_tokens": 30000,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    async with TestServer(create_app(backend, limits=LIMITS)) as server:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = await asyncio.to_thread(_stalled_socket, server.port, head + body)
        try:
            await _until(lambda: backend.aborted, timeout=10)
        finally:
            sock.close()
    assert backend.requests[0].request_id in backend.aborted


async def test_a_grpc_client_that_stops_reading_is_cut_off_and_its_request_aborted() -> None:
    backend = EchoBackend(token_delay=0.001)
    server = public_server(LIMITS, [])
    servicer = GatewayServicer(backend, FrontDoor(KeyRing([])), LIMITS)
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    options = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", -1)]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(
                model=MODEL, prompt=BIG_PROMPT, max_tokens=30000, ignore_eos=True
            )
            call = stub.Generate(request)
            await call.read()  # one message, then nothing
            await _until(lambda: backend.aborted, timeout=10)
            call.cancel()
    finally:
        await server.stop(None)
