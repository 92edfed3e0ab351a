"""Many requests over one long-lived bidirectional gRPC stream, in both directions batched.

A hop carries one message per engine step, not one per token per request: the client side
(`MuxClient`) coalesces submits and aborts that pile up while a write is in flight, and the
server side (`Outbox`) coalesces outputs that pile up while the client reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from services.common.errors import Unavailable

log = logging.getLogger(__name__)

Submit = TypeVar("Submit")
Output = TypeVar("Output")


@dataclass
class MuxProtocol(Generic[Submit, Output]):
    """How to speak one session rpc: build a request message, split a response into outputs."""

    open_stream: Callable[[], grpc.aio.StreamStreamCall]
    build_request: Callable[[list[Submit], list[str]], Any]
    outputs_of: Callable[[Any], Iterable[Output]]
    request_id_of: Callable[[Output], str]
    is_final: Callable[[Output], bool]
    peer: str = "peer"


@dataclass
class _Pending(Generic[Submit]):
    ids: list[str] = field(default_factory=list)
    submits: list[Submit] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)


Sink = Callable[[Any], None]


class MuxClient(Generic[Submit, Output]):
    """Client end of a session stream. `submit` takes a sink (a callable, e.g. a queue's
    put_nowait) that receives the request's outputs, then None after its final output; or a
    LayerserveError if the stream breaks. Sinks run inline on the reading task: no task switch
    per token. The stream opens on first use and reopens after a failure."""

    def __init__(self, protocol: MuxProtocol[Submit, Output]) -> None:
        self._protocol = protocol
        self._sinks: dict[str, Sink] = {}
        self._pending = _Pending[Submit]()
        self._on_stream: set[str] = set()  # ids written on the current stream
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, request_id: str, message: Submit, sink: Sink) -> None:
        self._sinks[request_id] = sink
        self._pending.ids.append(request_id)
        self._pending.submits.append(message)
        self._ensure_running()
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        if self._sinks.pop(request_id, None) is None:
            return
        if request_id in self._on_stream:
            self._pending.aborts.append(request_id)
            self._wakeup.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        call = self._protocol.open_stream()
        reader = asyncio.ensure_future(self._read(call))
        try:
            while not reader.done():
                await self._wakeup.wait()
                self._wakeup.clear()
                batch, self._pending = self._pending, _Pending[Submit]()
                live = [
                    (i, s)
                    for i, s in zip(batch.ids, batch.submits, strict=True)
                    if i in self._sinks
                ]
                self._on_stream.update(i for i, _ in live)
                if live or batch.aborts:
                    request = self._protocol.build_request([s for _, s in live], batch.aborts)
                    await call.write(request)
                self._on_stream.difference_update(batch.aborts)
        except grpc.aio.AioRpcError as err:
            log.warning("session to %s failed: %s", self._protocol.peer, err.details())
        except asyncio.InvalidStateError:
            # A write raced the peer ending the call ("RPC already finished"); the reader
            # has the reason and logs it. The stream's requests fail below.
            pass
        finally:
            reader.cancel()
            call.cancel()
            self._fail_stream_requests()

    def _fail_stream_requests(self) -> None:
        """Ends the requests written on the dead stream; pending ones go on a new stream."""
        error = Unavailable(f"lost the connection to the {self._protocol.peer}")
        for request_id in self._on_stream:
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink(error)
        self._on_stream.clear()
        if self._pending.submits:
            asyncio.get_running_loop().call_soon(self._ensure_running)

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async for response in call:
                for output in self._protocol.outputs_of(response):
                    self._deliver(output)
        except grpc.aio.AioRpcError as err:
            log.warning("session to %s ended: %s", self._protocol.peer, err.details())
        finally:
            self._wakeup.set()

    def _deliver(self, output: Output) -> None:
        request_id = self._protocol.request_id_of(output)
        sink = self._sinks.get(request_id)
        if sink is None:
            return  # aborted here already; late outputs are dropped
        final = self._protocol.is_final(output)
        if final:
            del self._sinks[request_id]
            self._on_stream.discard(request_id)
        sink(output)
        if final:
            sink(None)


# Outputs per message at most. A client that reads slower than outputs come (a gateway on a
# saturated machine) leaves them queued here; one message of all of them made it parse 47,300
# outputs (4 MB) at once, its memory then growing with generation rate x the time it lagged.
MAX_BATCH = 512


class Outbox(Generic[Output]):
    """Server end of a session stream: outputs put from anywhere are written as batches of at
    most MAX_BATCH."""

    def __init__(self) -> None:
        self._items: list[Output] = []
        self._ready = asyncio.Event()

    def put(self, output: Output) -> None:
        self._items.append(output)
        self._ready.set()

    async def next_batch(self) -> list[Output]:
        """Waits until something is queued, then takes what is queued, MAX_BATCH at most."""
        await self._ready.wait()
        batch, self._items = self._items[:MAX_BATCH], self._items[MAX_BATCH:]
        if not self._items:
            self._ready.clear()
        return batch

    def wake(self) -> None:
        """Wakes the writer with nothing to write (a session that drains rechecks its state)."""
        self._ready.set()

    @property
    def empty(self) -> bool:
        return not self._items


async def session_batches(
    outbox: Outbox[Output],
    reader: asyncio.Future,
    has_open: Callable[[], bool],
    draining: Callable[[], bool] = lambda: False,
) -> AsyncIterator[list[Output]]:
    """The server side of a session: yields batches of outputs until the client has stopped
    sending (reader done) and every request it submitted has ended and been delivered. Once
    `draining()` (the server refuses new requests; it wakes the outbox when that starts), the
    session also ends without waiting for the client, as soon as nothing is left open."""
    while True:
        if reader.done():
            if reader.cancelled() or reader.exception() is not None:
                return
            if outbox.empty and not has_open():
                return
            batch = await outbox.next_batch()
            if batch:
                yield batch
            continue
        if draining() and outbox.empty and not has_open():
            return
        waiting = asyncio.ensure_future(outbox.next_batch())
        await asyncio.wait({waiting, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
        elif waiting.result():
            yield waiting.result()
