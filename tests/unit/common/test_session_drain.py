"""A session stream's server side while its server drains (services/common/mux.py): it ends
once its requests have ended and been delivered, without waiting for the client to close."""

from __future__ import annotations

import asyncio

from services.common.mux import Outbox, session_batches


async def collect(outbox: Outbox[str], open_ids: set[str], draining: list[bool]) -> list[list[str]]:
    reader = asyncio.get_running_loop().create_future()  # the client never stops sending
    try:
        return [
            batch
            async for batch in session_batches(
                outbox, reader, lambda: bool(open_ids), lambda: draining[0]
            )
        ]
    finally:
        reader.cancel()


async def test_a_draining_session_delivers_its_last_outputs_then_ends():
    outbox: Outbox[str] = Outbox()
    open_ids = {"a", "b"}
    draining = [False]
    session = asyncio.ensure_future(collect(outbox, open_ids, draining))
    outbox.put("a:1")
    await asyncio.sleep(0.01)
    draining[0] = True
    outbox.wake()
    await asyncio.sleep(0.01)
    assert not session.done()  # a and b are still running
    outbox.put("a:end")
    open_ids.discard("a")
    await asyncio.sleep(0.01)
    assert not session.done()
    outbox.put("b:end")
    open_ids.discard("b")
    batches = await asyncio.wait_for(session, 5)
    assert [item for batch in batches for item in batch] == ["a:1", "a:end", "b:end"]
    assert all(batches)  # a wake-up alone writes no empty message


async def test_an_idle_session_ends_when_the_drain_starts():
    outbox: Outbox[str] = Outbox()
    draining = [False]
    session = asyncio.ensure_future(collect(outbox, set(), draining))
    await asyncio.sleep(0.01)
    assert not session.done()  # not draining: an idle session waits for its client
    draining[0] = True
    outbox.wake()
    assert await asyncio.wait_for(session, 5) == []
