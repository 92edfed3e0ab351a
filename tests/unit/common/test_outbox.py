"""A session's outputs go out in messages of at most mux.MAX_BATCH: a client that lags (a
gateway on a saturated machine) then parses a bounded message, not every output queued while
it lagged (47,300 outputs, 4 MB, in one message before), in order and without waiting."""

from __future__ import annotations

import asyncio

from services.common.mux import MAX_BATCH, Outbox


async def test_a_backlog_goes_out_in_bounded_batches_in_order() -> None:
    outbox: Outbox[int] = Outbox()
    for i in range(3 * MAX_BATCH + 7):
        outbox.put(i)
    batches = []
    while not outbox.empty:
        batches.append(await asyncio.wait_for(outbox.next_batch(), 1))
    assert [len(b) for b in batches] == [MAX_BATCH] * 3 + [7]
    assert [i for b in batches for i in b] == list(range(3 * MAX_BATCH + 7))
    waiting = asyncio.ensure_future(outbox.next_batch())  # nothing left: it waits
    await asyncio.sleep(0.01)
    assert not waiting.done()
    outbox.put(-1)
    assert await asyncio.wait_for(waiting, 1) == [-1]
