"""The engine loop over a real worker server (a null runner whose steps take 20 ms): one step ahead
when scheduling asynchronously, one at a time otherwise, the same tokens either way, and the
worker left holding nothing."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from layerserve.worker.v1 import worker_pb2_grpc
from services.scheduler.engine import Engine
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.spec_decode import NgramProposer, Speculator
from services.worker.engine.null_runner import NullRunner, continuation
from services.worker.serving.server import WorkerServicer
from tests.unit.scheduler.drive import EOS, make_request

STEP_SECONDS = 0.02
PROMPT = [EOS + 10, 11, 12]


@pytest.fixture
async def slow_worker():
    """A worker server whose steps take STEP_SECONDS: its address and servicer."""
    servicer = WorkerServicer(NullRunner(num_blocks=256, step_seconds=STEP_SECONDS), "m")
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", servicer
    await server.stop(grace=None)


# None: by the worker's device; the null worker computes on no GPU, so one step at a time.
@pytest.mark.parametrize(("async_scheduling", "ahead"), [(False, 1), (True, 2), (None, 1)])
async def test_steps_in_flight_and_tokens(slow_worker, async_scheduling, ahead):
    address, servicer = slow_worker
    outputs = []
    engine = Engine(address, SchedulerLimits(), outputs.extend, async_scheduling=async_scheduling)
    engine.start()
    try:
        await _until(lambda: engine.scheduler is not None)
        for rid in ("a", "b", "c"):
            engine.submit(make_request(rid, PROMPT, max_tokens=6))
        most_in_flight = 0
        while sum(o.finish_reason is not None for o in outputs) < 3:
            most_in_flight = max(most_in_flight, len(engine._in_flight))
            await asyncio.sleep(STEP_SECONDS / 4)
        await _until(lambda: servicer.num_held == 0)  # the last step told it to forget them
    finally:
        await engine.stop()
    assert most_in_flight == ahead
    tokens: dict[str, list[int]] = {}
    for output in outputs:
        tokens.setdefault(output.request_id, []).extend(output.token_ids)
    # The null runner's tokens: exactly max_tokens each, none past the end.
    assert tokens == {rid: continuation(PROMPT, 6) for rid in ("a", "b", "c")}


# auto speculation (speculate_when_synchronous): on where the engine steps its worker one at a
# time (None: the null worker is no GPU; False), dropped where it schedules ahead (True).
@pytest.mark.parametrize(
    ("async_scheduling", "ahead", "speculates"),
    [(None, 1, True), (False, 1, True), (True, 2, False)],
)
async def test_auto_speculation_only_where_steps_are_synchronous(
    slow_worker, async_scheduling, ahead, speculates
):
    address, _ = slow_worker
    engine = Engine(
        address, SchedulerLimits(), lambda outputs: None, async_scheduling=async_scheduling,
        proposer=NgramProposer(3, 6, 8), speculate_when_synchronous=True,
    )  # fmt: skip
    engine.start()
    try:
        await _until(lambda: engine.scheduler is not None)
        assert engine.max_steps_in_flight == ahead
        assert isinstance(engine.scheduler.speculator, Speculator) is speculates
    finally:
        await engine.stop()


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
