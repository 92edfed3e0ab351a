"""Request migration inside the scheduler (migration.py): a lost worker's requests continue on
another replica with their output kept, within a limit of moves and a bounded wait."""

from __future__ import annotations

import asyncio

from services.common.max_tokens import MaxTokens
from services.scheduler.engine import Engine
from services.scheduler.migration import Migrator
from services.scheduler.output import Output
from services.scheduler.request import FinishReason
from services.scheduler.router import Router
from services.scheduler.routing import RoutingMode
from services.scheduler.step import Sample
from services.scheduler.submission import Submission
from tests.unit.scheduler.drive import run_step
from tests.unit.scheduler.replicas import MODEL, routed_cluster, wait_until

PROMPT = [11, 12, 13, 14, 15, 16]


def run(coroutine):
    """On a loop of its own: asyncio.run would leave this thread without a current loop,
    which later tests in the process ask for."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def started_on_one(max_tokens: int = 8) -> tuple[Router, Engine, Engine]:
    """Two replicas; request r submitted and given 3 tokens by the one it went to."""
    router, _ = routed_cluster(["a:1", "b:2"], RoutingMode.ROUND_ROBIN)
    router.submit(Submission("r", MODEL, PROMPT, max_tokens=MaxTokens(max_tokens)))
    first = router.owner("r")
    assert first is not None and first.scheduler is not None
    for token in (21, 22, 23):
        run_step(first.scheduler, token)
    other = next(e for e in router.all_engines if e is not first)
    return router, first, other


def lose(engine: Engine) -> list:
    """What Engine._lose_all does when the worker fails."""
    assert engine.scheduler is not None
    released = engine.scheduler.release_all()
    engine.scheduler = None
    return released


def test_a_lost_workers_request_continues_on_the_other_with_its_output():
    router, first, other = started_on_one()
    outputs: list[Output] = []
    migrator = Migrator(router, outputs.extend)
    migrator.lost(first, lose(first), "connection reset")
    assert router.owner("r") is other and not outputs
    assert other.scheduler is not None
    step = run_step(other.scheduler, 24)
    [new] = step.new
    # Recomputed whole: the prompt and the three tokens the client has; the worker counts
    # sampling positions from the prompt's end, so a seeded request resumes where it was.
    assert new.request.all_token_ids == [*PROMPT, 21, 22, 23, 24]
    assert new.request.num_prompt_tokens == len(PROMPT)
    assert new.request.num_migrations == 1


def test_max_tokens_counts_the_tokens_before_the_move():
    router, first, other = started_on_one(max_tokens=5)
    migrator = Migrator(router, lambda outputs: None)
    [request] = lose(first)
    migrator.lost(first, [request], "gone")
    assert other.scheduler is not None
    run_step(other.scheduler, 24)
    assert request.finish_reason is None
    run_step(other.scheduler, 25)  # 5 tokens: 3 before the move, 2 after
    assert request.finish_reason is FinishReason.LENGTH
    assert request.output_token_ids == [21, 22, 23, 24, 25]


def test_after_max_migrations_the_request_ends_unavailable_naming_the_limit():
    router, first, other = started_on_one()
    outputs: list[Output] = []
    migrator = Migrator(router, outputs.extend, max_migrations=1)
    migrator.lost(first, lose(first), "gone")
    first.scheduler = other.scheduler  # the first worker is back; now the other one fails
    migrator.lost(other, lose(other), "gone again")
    [failed] = outputs
    assert failed.finish_reason is FinishReason.ERROR and failed.error is not None
    assert failed.error.rpc_code == "UNAVAILABLE"
    assert "--max-migrations" in failed.error.message
    assert router.owner("r") is None


def test_moves_made_by_the_tokenizer_count_against_the_same_limit():
    router, _ = routed_cluster(["a:1", "b:2"], RoutingMode.ROUND_ROBIN)
    submission = Submission("r", MODEL, PROMPT, max_tokens=MaxTokens(8), migrations=3)
    router.submit(submission)  # moved here from a lost scheduler: its third move
    first = router.owner("r")
    assert first is not None and first.scheduler is not None
    outputs: list[Output] = []
    Migrator(router, outputs.extend, max_migrations=3).lost(first, lose(first), "gone")
    [failed] = outputs
    assert failed.error is not None and "moved 3 times already" in failed.error.message
    assert failed.migrations == 4  # the tokenizer, told, moves it no further either


def test_outputs_after_a_move_carry_the_count():
    router, first, other = started_on_one()
    outputs: list[Output] = []
    Migrator(router, outputs.extend).lost(first, lose(first), "gone")
    assert other.scheduler is not None
    step = other.scheduler.schedule()
    [update] = other.scheduler.update([Sample("r", 24)])
    assert Output.sampled(update.request, *update.samples).migrations == 1
    assert step.new


def test_with_no_replica_left_it_waits_then_ends_unavailable():
    async def scenario() -> list[Output]:
        router, first, other = started_on_one()
        other.scheduler = None  # the other replica is down too
        outputs: list[Output] = []
        migrator = Migrator(router, outputs.extend, wait_s=0.3)
        migrator.lost(first, lose(first), "gone")
        await asyncio.sleep(0.1)
        assert not outputs  # still waiting for a replica
        await wait_until(lambda: bool(outputs), 5)
        return outputs

    [failed] = run(scenario())
    assert failed.error is not None and failed.error.rpc_code == "UNAVAILABLE"
    assert f"no other worker of model `{MODEL}`" in failed.error.message


def test_a_replica_that_comes_back_within_the_wait_takes_it():
    async def scenario() -> tuple[Router, Engine, list[Output]]:
        router, first, other = started_on_one()
        parked_scheduler, other.scheduler = other.scheduler, None
        outputs: list[Output] = []
        migrator = Migrator(router, outputs.extend, wait_s=5)
        migrator.lost(first, lose(first), "gone")
        await asyncio.sleep(0.1)
        other.scheduler = parked_scheduler  # reconnected
        await wait_until(lambda: router.owner("r") is other, 5)
        return router, other, outputs

    _, other, outputs = run(scenario())
    assert not outputs


def test_an_aborted_request_is_not_moved():
    async def scenario() -> Router:
        router, first, other = started_on_one()
        parked_scheduler, other.scheduler = other.scheduler, None
        migrator = Migrator(router, lambda outputs: None, wait_s=5)
        migrator.lost(first, lose(first), "gone")
        router.abort("r")
        other.scheduler = parked_scheduler
        await asyncio.sleep(0.5)
        assert other.scheduler is not None and not other.scheduler.has_work()
        return router

    assert run(scenario()).owner("r") is None
