"""The n choices of one OpenAI request, generated concurrently and funnelled into one queue.

Each choice's backend iterator is driven by its own task (a "pump"), so a slow client never
slows generation: deltas queue up, and the writer takes everything queued at once and merges
it per choice (`coalesce`). Each pump also owns closing its iterator, so `close()` is a plain
synchronous cancel that still aborts every backend request even when the caller is itself being
cancelled (client gone, server shutting down).

The buffer is bounded: past MAX_BUFFERED_ITEMS unread items it is merged in place, one delta
per choice, so a client that reads slowly costs the text it has not read yet, never one object
per token; and past MAX_UNREAD_TOKENS generated tokens nobody has taken, the choices are
stopped upstream and the reader gets ClientStalled. A client that stops reading is cut off by
the writer (`write_within`) after the gateway's stalled_client_seconds; the token bound is
what keeps its cost a bound rather than generation rate x the time until that cut-off, which
grows on a busy machine (100 stalled clients of 8,000 tokens: +98.7 MiB against 64).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable

from services.common.errors import Cancelled, Internal
from services.gateway.backend import Backend, GenerationDelta, GenerationRequest

log = logging.getLogger(__name__)

# (choice index, what it produced): a delta, or the exception that ended the choice.
Item = tuple[int, GenerationDelta | BaseException]

MAX_BUFFERED_ITEMS = 64
# Tokens that may arrive for a request while its reader is away writing (blocked by a full send
# buffer when the client does not read): a healthy reader is back for more after a few steps.
MAX_UNREAD_TOKENS = 1024

# Strong references to running pumps: the event loop keeps only weak ones, and a pump that was
# cancelled must live on until it has closed its iterator, after its request handler is gone.
_live_pumps: set[asyncio.Task[None]] = set()


class ChoiceStreams:
    """Starts one pump per request. Every choice ends with exactly one terminal item: a delta
    with finish_reason set, or an exception."""

    def __init__(self, backend: Backend, requests: list[GenerationRequest]) -> None:
        self._items: list[Item] = []  # in arrival order, merged when it outgrows the bound
        self._unread = 0  # tokens that came while the reader was away
        self._reader_waiting = False
        self._overrun = False  # MAX_UNREAD_TOKENS was passed: the choices were stopped
        self._ready = asyncio.Event()
        self._open = set(range(len(requests)))  # choices whose terminal item is still to come
        self._tasks = [
            asyncio.create_task(self._pump(i, backend, r), name=f"pump {r.request_id}")
            for i, r in enumerate(requests)
        ]
        for task in self._tasks:
            _live_pumps.add(task)
            task.add_done_callback(_live_pumps.discard)

    @property
    def finished(self) -> bool:
        return not self._open

    @property
    def buffered(self) -> int:
        """Items waiting for the reader (at most MAX_BUFFERED_ITEMS)."""
        return len(self._items)

    async def next_batch(self) -> list[Item]:
        """Waits for one item, then takes everything else already queued, in arrival order.
        Raises ClientStalled once the reader has left over MAX_UNREAD_TOKENS untaken."""
        if self._overrun:
            raise ClientStalled(f"the client left over {MAX_UNREAD_TOKENS} tokens unread")
        while not self._items:
            self._ready.clear()
            self._reader_waiting = True
            try:
                await self._ready.wait()
            finally:
                self._reader_waiting = False
        items, self._items, self._unread = self._items, [], 0
        for index, item in items:
            if _is_terminal(item):
                self._open.discard(index)
        return items

    async def first_batch(self) -> list[Item]:
        """Items up to the point where every choice has produced something, or one has failed:
        until then nothing is committed to the client, so an error can still be an HTTP status."""
        items: list[Item] = []
        waiting = set(range(len(self._tasks)))
        while waiting:
            batch = await self.next_batch()
            items.extend(batch)
            if any(isinstance(item, BaseException) for _, item in batch):
                break  # the request fails whatever the other choices do
            waiting.difference_update(index for index, _ in batch)
        return items

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _put(self, item: Item) -> None:
        self._items.append(item)
        if len(self._items) > MAX_BUFFERED_ITEMS:
            self._items = _compacted(self._items)
        if isinstance(item[1], GenerationDelta) and not self._reader_waiting:
            self._unread += len(item[1].token_ids)
            if self._unread > MAX_UNREAD_TOKENS and not self._overrun:
                self._overrun = True
                self.close()  # aborts every choice upstream: nothing more is generated for it
        self._ready.set()

    async def _pump(self, index: int, backend: Backend, request: GenerationRequest) -> None:
        iterator: AsyncIterator[GenerationDelta] | None = None
        ended = False
        try:
            iterator = backend.generate(request)
            async for delta in iterator:
                ended = delta.finish_reason is not None
                self._put((index, delta))
                if ended or self._overrun:  # a backend may not suspend, so cancel may not land
                    return
            ended = True
            self._put((index, Internal("generation ended without a finish reason")))
        except Exception as exc:  # handed to the consumer, which logs and maps it
            ended = True
            self._put((index, exc))
        finally:
            if not ended:  # cancelled: wake any reader rather than leave it waiting forever
                self._put((index, Cancelled("generation was cancelled")))
            if iterator is not None:
                await _close_iterator(iterator, request.request_id)


def _is_terminal(item: GenerationDelta | BaseException) -> bool:
    return isinstance(item, BaseException) or item.finish_reason is not None


async def _close_iterator(iterator: AsyncIterator[GenerationDelta], request_id: str) -> None:
    """aclose() is what tells the backend to abort; a no-op on a finished async generator."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # the request is over either way; the operator gets a note
        log.warning("request %s: closing the backend stream failed", request_id, exc_info=True)


def _compacted(items: list[Item]) -> list[Item]:
    """The same items merged per choice: what the reader would have written, in fewer objects.
    Items after an error go: the reader stops at the first error anyway."""
    merged, error = coalesce(items)
    compact: list[Item] = list(merged.items())
    if error is not None:
        compact.append((next(i for i, item in items if item is error), error))
    return compact


class ClientStalled(Exception):
    """The client took nothing for the gateway's stalled_client_seconds."""


async def write_within(write: Awaitable[None], seconds: float) -> None:
    """Awaits a write to the client; raises ClientStalled when it is not taken in time."""
    try:
        await asyncio.wait_for(write, seconds)
    except TimeoutError:
        raise ClientStalled(f"the client read nothing for {seconds:g}s") from None


def coalesce(items: list[Item]) -> tuple[dict[int, GenerationDelta], BaseException | None]:
    """Merges each choice's queued deltas into one, in order; stops at the first error.

    Returns the merged deltas keyed by choice (in order of first appearance) and the error."""
    grouped: dict[int, list[GenerationDelta]] = {}
    error: BaseException | None = None
    for index, item in items:
        if isinstance(item, BaseException):
            error = item
            break
        grouped.setdefault(index, []).append(item)
    return {index: merge_deltas(deltas) for index, deltas in grouped.items()}, error


def merge_deltas(deltas: list[GenerationDelta]) -> GenerationDelta:
    """Consecutive deltas of one choice as one: texts concatenate, counts are running totals.
    Joins once, so merging thousands of queued deltas stays linear."""
    if len(deltas) == 1:
        return deltas[0]
    with_logprobs = [d.logprobs for d in deltas if d.logprobs is not None]
    return GenerationDelta(
        text="".join(d.text for d in deltas),
        token_ids=[t for d in deltas for t in d.token_ids],
        logprobs=[lp for lps in with_logprobs for lp in lps] if with_logprobs else None,
        finish_reason=deltas[-1].finish_reason,
        prompt_tokens=max(d.prompt_tokens for d in deltas),
        completion_tokens=max(d.completion_tokens for d in deltas),
        cached_tokens=max(d.cached_tokens for d in deltas),
        model=next((d.model for d in deltas if d.model), ""),
        tool_calls=[call for d in deltas for call in d.tool_calls],
        prompt_text=next((d.prompt_text for d in deltas if d.prompt_text is not None), None),
        prompt_logprobs=next(
            (d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None
        ),
        embedding=next((d.embedding for d in deltas if d.embedding is not None), None),
        stop_sequence=deltas[-1].stop_sequence,
    )
