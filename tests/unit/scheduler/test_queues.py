"""The waiting queue: priority, fairness across tenants, its bound and the longest wait."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import ResourceExhausted
from services.scheduler.engine import Engine
from services.scheduler.output_proto import output_to_proto
from services.scheduler.request import FinishReason
from tests.unit.scheduler.drive import FakeClock, finish_step, make_request, make_scheduler


def started_ids(step) -> list[str]:
    return [r.request.request_id for r in step.new]


def test_one_tenants_backlog_does_not_starve_anothers_single_request():
    clock = FakeClock()
    sched = make_scheduler(num_blocks=256, budget=8, max_seqs=8, clock=clock)
    for i in range(100):
        sched.add(make_request(f"a{i}", [10 + i, 11, 12, 13], max_tokens=50, tenant="A"))
        clock.now += 1
    sched.add(make_request("b0", [5, 6, 7, 8], max_tokens=50, tenant="B"))
    step = sched.schedule()  # the budget starts two prompts per step
    assert started_ids(step) == ["a0", "b0"]  # ties go to the earliest arrival; then B has 0
    finish_step(sched, step)
    step = sched.schedule()  # the two decodes take 2 of 8 tokens; A's backlog gets the rest
    assert [(r.request.request_id, r.num_new) for r in step.new] == [("a1", 4), ("a2", 2)]


def test_the_tenant_with_fewest_running_requests_goes_next_within_a_priority():
    clock = FakeClock()
    sched = make_scheduler(num_blocks=256, budget=64, max_seqs=5, clock=clock)
    for rid, tenant in [("a0", "A"), ("a1", "A"), ("b0", "B"), ("a2", "A"), ("c0", "C")]:
        sched.add(make_request(rid, [20, 21, 22], max_tokens=9, tenant=tenant))
        clock.now += 1
    sched.add(make_request("urgent", [20, 21], tenant="A", priority=3))
    assert started_ids(sched.schedule()) == ["urgent", "b0", "c0", "a0", "a1"]


def test_a_full_queue_refuses_new_requests_until_one_starts():
    sched = make_scheduler(max_waiting=2, max_seqs=1)
    sched.add(make_request("a", [3, 4]))
    sched.add(make_request("b", [3, 4]))
    with pytest.raises(ResourceExhausted, match="queue is full.*retry"):
        sched.add(make_request("c", [3, 4]))
    assert sched.stats.num_rejected == 1 and "c" not in sched.requests
    sched.schedule()  # "a" starts and leaves the queue
    sched.add(make_request("c", [3, 4]))
    assert sched.num_waiting == 2


def test_a_request_that_never_starts_expires_after_the_longest_wait():
    clock = FakeClock()
    sched = make_scheduler(max_seqs=1, max_queue_wait_s=10, clock=clock)
    sched.add(make_request("running", [3, 4], max_tokens=100))
    finish_step(sched, sched.schedule())
    sched.add(make_request("late", [3, 4]))
    clock.now = 5
    sched.add(make_request("later", [3, 4]))
    clock.now = 9.9
    assert sched.expire() == []
    clock.now = 10
    (expired,) = sched.expire()
    assert expired.request_id == "late" and expired.finish_reason is FinishReason.ERROR
    assert "late" not in sched.requests and sched.num_waiting == 1 and sched.stats.num_expired == 1
    clock.now = 1000  # a running request is never expired, however long it runs
    assert [r.request_id for r in sched.expire()] == ["later"]
    assert list(sched.requests) == ["running"]


async def test_the_engine_reports_expired_requests_as_deadline_exceeded():
    clock = FakeClock()
    sched = make_scheduler(max_seqs=1, max_queue_wait_s=30, clock=clock)
    outputs = []
    engine = Engine("127.0.0.1:9", sched.limits, outputs.extend)
    engine.scheduler = sched  # as if connected; each step starts by ending expired requests
    engine.submit(make_request("r", [3, 4]))
    clock.now = 31
    engine._expire()
    (out,) = [output_to_proto(o) for o in outputs]
    assert out.request_id == "r" and out.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "30s in the queue" in out.error.message
    await engine.stop()
