"""The worker's own health inputs: the step watch that notices a hung engine step, and the
warm-up step that must succeed before the worker reports SERVING."""

from __future__ import annotations

import pytest

from services.worker.engine.null_runner import NullRunner
from services.worker.engine.plan import NewSequence, StepPlan
from services.worker.engine.warm_up import warm_up
from services.worker.serving.step_watch import StepWatch
from tests.unit.worker.conftest import RunnerFactory


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_within_its_bound_is_not_a_problem():
    clock = FakeClock()
    watch = StepWatch(timeout_s=2.0, clock=clock)
    seen = []

    def step() -> str:
        clock.now += 1.5
        seen.append(watch.problem())
        return "sampled"

    assert watch.problem() is None
    assert watch.run(step) == "sampled"
    assert seen == [None]


def test_a_step_past_its_bound_is_hung_until_it_returns(caplog):
    clock = FakeClock()
    watch = StepWatch(timeout_s=2.0, clock=clock)
    seen = []

    def slow_step() -> None:
        clock.now += 7.0
        seen.append(watch.problem())

    watch.run(slow_step)
    assert seen[0] is not None and "7.0s" in seen[0] and "bound 2s" in seen[0]
    assert watch.problem() is None  # it returned: healthy again
    assert "returned after 7.00s" in caplog.text


def test_a_step_that_raises_still_ends():
    clock = FakeClock()
    watch = StepWatch(timeout_s=1.0, clock=clock)

    def broken() -> None:
        clock.now += 5.0
        raise ValueError("inconsistent plan")

    with pytest.raises(ValueError):
        watch.run(broken)
    assert watch.problem() is None


def test_warm_up_leaves_the_null_runner_holding_nothing():
    runner = NullRunner(block_size=16, num_blocks=4)
    warm_up(runner)
    assert runner._sequences == {}


def test_warm_up_runs_the_model_and_leaves_nothing_behind(make_runner: RunnerFactory):
    warmed = make_runner(num_blocks=8, block_size=16)
    warm_up(warmed)
    assert warmed.num_requests == 0
    # The scheduler may hand out block 0 at once: what the warm-up wrote there must not leak
    # into a request that gets it (same greedy token as on a runner never warmed up).
    prompt = [50, 60, 70]
    plan = StepPlan(new=[NewSequence("r1", prompt, len(prompt), 0, len(prompt), [[0]])])
    fresh = make_runner(num_blocks=8, block_size=16)
    assert warmed.execute(plan) == fresh.execute(plan)
