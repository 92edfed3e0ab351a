"""A request whose scheduler replica is lost moves to another with the tokens already sent,
within a limit; then, or with no replica left, it ends with UNAVAILABLE saying why."""

from __future__ import annotations

import asyncio

import pytest

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import Unavailable
from services.tokenizer import migration
from services.tokenizer.migration import MigratingSink
from services.tokenizer.request_events import RequestListener


class Link:
    def __init__(self, address: str) -> None:
        self.address = address


class Pool:
    """The SchedulerPool's part a MigratingSink uses; replicas by address, in order."""

    def __init__(self, *addresses: str) -> None:
        self.links = [Link(a) for a in addresses]
        self.down: set[str] = set()  # replicas serving no worker of the model yet
        self.sent: list[tuple[str, scheduler_pb2.Submit]] = []
        self.owner: dict[str, Link] = {}

    async def choose(self, model, prompt, avoid=frozenset()):
        for link in self.links:
            if link.address not in avoid and link.address not in self.down:
                return link
        raise Unavailable("none")

    def has_other(self, tried) -> bool:
        return any(link.address not in tried for link in self.links)

    def submit(self, link, submit, sink) -> None:
        self.owner[submit.request_id] = link
        self.sent.append((link.address, submit))

    def owns(self, request_id, link) -> bool:
        return self.owner.get(request_id) is link

    def ended(self, request_id) -> None:
        self.owner.pop(request_id, None)


class Stream:
    finished = False


class Sink:
    def __init__(self) -> None:
        self.stream = Stream()
        self.got: list = []

    def __call__(self, output) -> None:
        self.got.append(output)


class Events(RequestListener):
    def __init__(self) -> None:
        self.moves: list[tuple] = []

    def migrated(self, request_id, model, reason, tokens_done) -> None:
        self.moves.append((request_id, model, reason, tokens_done))


def tokens(*ids: int) -> scheduler_pb2.RequestOutput:
    return scheduler_pb2.RequestOutput(request_id="r", token_ids=ids)


def started(pool: Pool, max_migrations: int = 3) -> tuple[MigratingSink, Sink, Events]:
    submit = scheduler_pb2.Submit(
        request_id="r", model="m", prompt_token_ids=[1, 2, 3], max_tokens=10
    )
    sink, events = Sink(), Events()
    migrating = MigratingSink(submit, sink, pool, pool.links[0], events, max_migrations)
    migrating.start()
    return migrating, sink, events


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_lost_stream_resumes_elsewhere_after_the_tokens_sent() -> None:
    pool = Pool("a:1", "b:1")
    migrating, sink, events = started(pool)
    migrating(tokens(7, 8))
    migrating(Unavailable("lost the connection"))
    await settle()
    address, resumed = pool.sent[-1]
    assert address == "b:1"
    assert list(resumed.prompt_token_ids) == [1, 2, 3, 7, 8]
    assert resumed.resumed_output_tokens == 2
    assert resumed.max_tokens == 8
    assert events.moves == [("r", "m", "scheduler_lost", 2)]
    assert [o for o in sink.got if isinstance(o, Unavailable)] == []  # the client saw none
    migrating(tokens(9))
    migrating(Unavailable("lost again"))  # b lost too; a was lost before: nowhere left
    await settle()
    error = sink.got[-1]
    assert isinstance(error, Unavailable)
    assert "no other scheduler replica serves model `m`" in error.message
    assert [o.token_ids[0] for o in sink.got[:-1]] == [7, 9]


async def test_the_migration_limit_ends_it_with_unavailable() -> None:
    pool = Pool("a:1", "b:1", "c:1")
    migrating, sink, events = started(pool, max_migrations=1)
    migrating(Unavailable("lost"))
    await settle()
    migrating(
        scheduler_pb2.RequestOutput(
            request_id="r",
            finish_reason=common_pb2.FINISH_REASON_ERROR,
            error=common_pb2.Status(code=14, message="no worker"),
        )
    )
    await settle()
    assert len(pool.sent) == 2 and len(events.moves) == 1
    assert isinstance(sink.got[-1], Unavailable)
    assert "moved 1 times already (the limit" in sink.got[-1].message
    assert "could not serve it (no worker)" in sink.got[-1].message  # the scheduler's reason


async def test_a_schedulers_moves_between_workers_count_against_the_same_limit() -> None:
    pool = Pool("a:1", "b:1", "c:1")
    migrating, sink, events = started(pool, max_migrations=3)
    # Scheduler a moved it to another worker twice (its worker was lost): the outputs say so.
    migrating(scheduler_pb2.RequestOutput(request_id="r", token_ids=[7], migrations=2))
    migrating(Unavailable("lost"))
    await settle()
    _, resumed = pool.sent[-1]
    assert resumed.migrations == 3  # a's two and this one: b may move it no further
    migrating(Unavailable("lost again"))
    await settle()
    assert len(events.moves) == 1
    assert isinstance(sink.got[-1], Unavailable)
    assert "moved 3 times already (the limit" in sink.got[-1].message


async def test_an_abort_while_moving_submits_nothing() -> None:
    pool = Pool("a:1", "b:1")
    migrating, _, events = started(pool)
    migrating(Unavailable("lost"))
    pool.ended("r")  # the client went away before another replica was chosen
    await settle()
    assert len(pool.sent) == 1 and events.moves == []


async def test_it_waits_for_a_replica_to_get_the_models_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(migration, "RETRY_S", 0.01)
    pool = Pool("a:1", "b:1")
    pool.down.add("b:1")  # the lost replica's workers have not moved to b yet
    migrating, sink, _ = started(pool)
    migrating(tokens(7))
    migrating(Unavailable("lost"))
    await asyncio.sleep(0.1)
    assert len(pool.sent) == 1 and len(sink.got) == 1  # still waiting, no error
    pool.down.clear()
    await asyncio.sleep(0.1)
    assert pool.sent[-1][0] == "b:1"
    monkeypatch.setattr(migration, "WAIT_FOR_REPLICA_S", 0.05)
    pool.links.append(Link("c:1"))
    pool.down.add("c:1")
    migrating(Unavailable("lost b"))
    await asyncio.sleep(0.2)
    assert isinstance(sink.got[-1], Unavailable)  # c never got the model's workers
