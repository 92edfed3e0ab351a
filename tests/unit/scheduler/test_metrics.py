"""The scheduler's metrics as an operator reads them: requests waiting then running, KV cache
usage, preemptions, prefix cache hits and tokens, per model and worker, read from the real
Scheduler behind an Engine; and, over a real Execute stream to an in-process null worker,
the tokens of every engine step and each request's time in the queue."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from layerserve.worker.v1 import worker_pb2_grpc
from services.scheduler.engine import Engine
from services.scheduler.scheduler import Scheduler
from services.scheduler.scheduler_metrics import SchedulerCollector, observe_step
from services.scheduler.worker_info import WorkerInfo
from services.worker.engine.null_runner import NullRunner
from services.worker.serving.server import WorkerServicer
from tests.prometheus_text import Scrape
from tests.unit.scheduler.drive import (
    FakeClock,
    finish_step,
    make_request,
    make_scheduler,
    run_step,
    run_until_idle,
)

MODEL = "m"
ADDRESS = "127.0.0.1:9"  # never dialled: the tests run the engine's scheduler by hand
SERIES = {"model": MODEL, "worker": ADDRESS}


def linked(sched: Scheduler) -> tuple[Engine, CollectorRegistry]:
    """An engine as if connected to a worker of MODEL, and a registry with its collector."""
    link = Engine(ADDRESS, sched.limits, emit=lambda outputs: None)
    link.info = WorkerInfo(MODEL, 4, sched.kv.pool.num_blocks, 256, 100)
    link.scheduler = sched
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(lambda: [link]))
    return link, registry


def scrape(registry: CollectorRegistry) -> Scrape:
    return Scrape.parse(generate_latest(registry).decode())


def gauges(registry: CollectorRegistry) -> tuple[float, float, float]:
    page = scrape(registry)
    return tuple(
        page.value(f"layerserve:{name}", **SERIES)
        for name in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc")
    )


async def test_requests_show_as_waiting_then_running_and_fill_the_kv_cache():
    sched = make_scheduler(num_blocks=8, block_size=4, max_seqs=1)
    link, registry = linked(sched)
    link.submit(make_request("a", [3, 4, 5, 6, 7], max_tokens=2))  # 2 blocks
    link.submit(make_request("b", [8, 9], max_tokens=2))
    assert gauges(registry) == (2, 0, 0.0)
    step = sched.schedule()  # one may run at a time
    assert gauges(registry) == (1, 1, 2 / 8)
    finish_step(sched, step)
    run_until_idle(sched)
    assert gauges(registry) == (0, 0, 0.0)  # cached blocks nobody uses count as free
    page = scrape(registry)
    assert page.value("layerserve:prompt_tokens_total", **SERIES) == 5 + 2
    assert page.value("layerserve:generation_tokens_total", **SERIES) == 2 + 2
    assert page.types["layerserve:num_requests_waiting"] == "gauge"
    assert page.types["layerserve:prompt_tokens"] == "counter"
    await link.stop()


async def test_preemptions_and_prefix_cache_hits_are_counted_in_tokens():
    sched = make_scheduler(num_blocks=4, block_size=4)
    link, registry = linked(sched)
    link.submit(make_request("old", list(range(10, 18)), max_tokens=6))
    link.submit(make_request("new", list(range(30, 38)), max_tokens=6))
    run_step(sched)  # both prefilled, two blocks each, all four cached
    assert scrape(registry).value("layerserve:num_preemptions_total", **SERIES) == 0
    run_step(sched)  # both need a third block: "new" yields its blocks
    page = scrape(registry)
    assert page.value("layerserve:num_preemptions_total", **SERIES) == 1
    assert page.value("layerserve:prefix_cache_hits_total", **SERIES) == 0
    assert page.value("layerserve:prefix_cache_queries_total", **SERIES) == 16
    link.abort("old")
    run_until_idle(sched)  # "new" resumes from its own first block, still cached
    page = scrape(registry)
    assert page.value("layerserve:prefix_cache_queries_total", **SERIES) == 16 + 9
    assert page.value("layerserve:prefix_cache_hits_total", **SERIES) == 4
    await link.stop()


async def test_an_engine_without_a_worker_reports_nothing():
    link = Engine(ADDRESS, make_scheduler().limits, emit=lambda outputs: None)
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(lambda: [link]))
    page = scrape(registry)
    assert "layerserve:num_requests_running" in page.types  # described, with no series
    assert page.label_values("layerserve:num_requests_running", "worker") == set()
    await link.stop()


@pytest.fixture
async def null_worker():
    """A real worker server (no model) on a free port: its address."""
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(
        WorkerServicer(NullRunner(block_size=16, num_blocks=64), MODEL), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(grace=None)


async def test_the_step_loop_observes_each_steps_tokens_and_each_requests_queue_time(
    null_worker,
):
    prompts = {"a": list(range(10, 15)), "b": list(range(20, 27)), "c": list(range(30, 33))}
    max_tokens = 4
    outputs = []
    link = Engine(null_worker, make_scheduler(max_seqs=1).limits, outputs.extend)
    before = Scrape.parse(generate_latest(REGISTRY).decode())
    link.start()
    try:
        await _until(lambda: link.scheduler is not None)
        for rid, prompt in prompts.items():  # one runs at a time: the others queue
            link.submit(make_request(rid, prompt, max_tokens=max_tokens))
        await _until(lambda: sum(o.finish_reason is not None for o in outputs) == len(prompts))
    finally:
        await link.stop()
    after = Scrape.parse(generate_latest(REGISTRY).decode())
    iteration = "layerserve:iteration_tokens_total"
    # Each request computes its prompt, then every sampled token but the last.
    computed = sum(len(p) + max_tokens - 1 for p in prompts.values())
    assert after.delta(before, iteration + "_sum", model=MODEL) == computed
    steps = after.delta(before, iteration + "_count", model=MODEL)
    assert len(prompts) <= steps <= computed
    queue = "layerserve:request_queue_time_seconds_count"
    assert after.delta(before, queue, model=MODEL) == len(prompts)  # once each, at its start
    forward = "layerserve:model_forward_time_seconds_count"
    assert after.delta(before, forward, model=MODEL) >= steps  # the worker timed them too


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not true in time"
        await asyncio.sleep(0.01)


def test_queue_time_is_the_wait_before_a_requests_first_start_only():
    model = "queue-time-test"  # series of its own in the process-wide registry
    clock = FakeClock(now=5.0)
    sched = make_scheduler(num_blocks=4, block_size=4, clock=clock)
    sched.add(make_request("old", list(range(10, 18)), max_tokens=6))
    clock.now = 6.0
    sched.add(make_request("new", list(range(30, 38)), max_tokens=6))
    queue = "layerserve:request_queue_time_seconds"
    before = Scrape.parse(generate_latest(REGISTRY).decode())

    def step_at(now: float) -> None:
        clock.now = now
        step = sched.schedule()
        observe_step(model, step, clock())
        finish_step(sched, step)

    step_at(7.5)  # both start: waited 2.5 and 1.5 s
    step_at(8.0)  # "new" is preempted
    assert sched.stats.num_preemptions == 1
    sched.abort("old")
    step_at(20.0)  # "new" resumes: not a first start
    after = Scrape.parse(generate_latest(REGISTRY).decode())
    assert after.delta(before, queue + "_count", model=model) == 2
    assert after.delta(before, queue + "_sum", model=model) == pytest.approx(4.0)
