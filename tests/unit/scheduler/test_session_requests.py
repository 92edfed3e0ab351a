"""The scheduler's Session stream keeps one record per request: a request leaves it when it
finishes, when its client aborts it and when its session ends, and the router hears which."""

from __future__ import annotations

import asyncio

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import InvalidArgument, ResourceExhausted, code_number
from services.scheduler.output import Output
from services.scheduler.request import FinishReason
from services.scheduler.server import SchedulerServicer
from services.scheduler.submission import Submission


class FakeRouter:
    """Takes every request except "full" (its worker's queue is full)."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.aborted: list[str] = []
        self.forgotten: list[str] = []

    def submit(self, submission: Submission) -> None:
        if submission.request_id == "full":
            raise ResourceExhausted("the queue is full")
        self.submitted.append(submission.request_id)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)


def _message(*submits: str, aborts: tuple[str, ...] = ()) -> scheduler_pb2.SessionRequest:
    return scheduler_pb2.SessionRequest(
        submits=[scheduler_pb2.Submit(request_id=rid, model="m") for rid in submits],
        aborts=aborts,
    )


async def _next_outputs(session) -> list:
    response = await asyncio.wait_for(anext(session), 5)
    return list(response.outputs)


async def test_a_request_leaves_once_finished_aborted_or_orphaned_and_the_router_hears_which():
    router = FakeRouter()
    servicer = SchedulerServicer(router)  # type: ignore[arg-type]
    incoming: asyncio.Queue = asyncio.Queue()

    async def client():
        while True:
            yield await incoming.get()

    session = servicer.Session(client(), context=None)
    await incoming.put(_message("done", "dup", "dup", "full", "dropped", "orphan"))
    errors = await _next_outputs(session)
    assert [(o.request_id, o.error.code) for o in errors] == [
        ("dup", code_number(InvalidArgument(""))),
        ("full", code_number(ResourceExhausted(""))),
    ]
    assert all(o.finish_reason == common_pb2.FINISH_REASON_ERROR for o in errors)
    assert router.submitted == ["done", "dup", "dropped", "orphan"]

    servicer.emit([Output("done", [7], finish_reason=FinishReason.STOP)])
    (done,) = await _next_outputs(session)
    assert (done.request_id, done.model, list(done.token_ids)) == ("done", "m", [7])
    assert router.forgotten[-1] == "done"  # finished: the router forgets it
    servicer.emit([Output("done", [8])])  # finished: nothing more of it reaches the client

    # An abort stops its request once; a finished request's id may be used again.
    await incoming.put(_message("done", "dup", aborts=("dropped", "dropped")))
    (duplicate,) = await _next_outputs(session)
    assert duplicate.request_id == "dup"  # the first "dup" is still open
    assert router.aborted == ["dropped"]
    assert router.submitted[-1] == "done"

    await session.aclose()  # the client went away: what it left open is aborted
    assert router.aborted[0] == "dropped"
    assert sorted(router.aborted[1:]) == ["done", "dup", "orphan"]


async def test_a_session_whose_client_stopped_sending_ends_with_its_last_request():
    router = FakeRouter()
    servicer = SchedulerServicer(router)  # type: ignore[arg-type]

    async def client():
        yield _message("a", "b")

    session = servicer.Session(client(), context=None)
    first = asyncio.ensure_future(_next_outputs(session))
    while len(router.submitted) < 2:  # the session's reader takes the submits
        await asyncio.sleep(0.01)
    servicer.emit([Output("a", [7], finish_reason=FinishReason.LENGTH)])
    (a,) = await first
    assert a.finish_reason == common_pb2.FINISH_REASON_LENGTH
    servicer.emit([Output.failed("b", InvalidArgument("bad"))])
    (b,) = await _next_outputs(session)
    assert b.error.message == "bad"
    rest = await asyncio.wait_for(_drain(session), 5)
    assert rest == []  # nothing left open: the stream ends


async def _drain(session) -> list:
    return [response async for response in session]
