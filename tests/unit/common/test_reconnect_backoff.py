"""A client dialling a peer that is not up yet (a worker still loading its model) connects
within a couple of seconds of the peer coming up, however long it waited: gRPC's own backoff
grows 1.6x a try to 2 minutes, so after a 10 s wait it would next dial some 6 s later."""

from __future__ import annotations

import asyncio
import time

import grpc

from services.common.grpc_util import CHANNEL_OPTIONS, RECONNECT_BACKOFF_MS
from tests.redis_server import free_port

DOWN_S = 10.0  # the peer's start-up: gRPC's default backoff would be at its 5th try by then


def test_a_channel_connects_soon_after_its_peer_comes_up() -> None:
    async def scenario() -> float:
        port = free_port()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
        ready = asyncio.ensure_future(channel.channel_ready())
        await asyncio.sleep(DOWN_S)
        assert not ready.done()
        server = grpc.aio.server()
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        up = time.monotonic()
        try:
            await asyncio.wait_for(ready, timeout=30)
            return time.monotonic() - up
        finally:
            await channel.close()
            await server.stop(None)

    waited = asyncio.run(scenario())
    # The longest wait between dials, its jitter (+20%) and a busy machine's slack.
    assert waited < RECONNECT_BACKOFF_MS[1] / 1000 * 1.2 + 2.0, waited
