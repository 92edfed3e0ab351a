"""Inconsistent plans are refused before any state or cache changes."""

from __future__ import annotations

import pytest
import torch

from services.common.sampling import SamplingOptions
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from tests.unit.worker.conftest import RunnerFactory

NUM_BLOCKS = 8


@pytest.fixture
def runner(make_runner: RunnerFactory) -> ModelRunner:
    runner = make_runner(num_blocks=NUM_BLOCKS, block_size=4, max_model_len=64)
    runner.execute(StepPlan(new=[NewSequence("held", [5, 6, 7], 3, 0, 3, [[0]])]))
    return runner


def _snapshot(runner: ModelRunner) -> tuple[torch.Tensor, dict]:
    state = runner._requests["held"]
    facts = {"tokens": list(state.token_ids), "computed": state.num_computed,
             "tables": [list(t) for t in state.block_tables],
             "count": runner.num_requests}  # fmt: skip
    return runner._cache._buffer.clone(), facts


BAD_PLANS = {
    "unknown running id": StepPlan(running=[RunningSequence("nobody", 1, [[]])]),
    "block table too short": StepPlan(new=[NewSequence("n", list(range(9)), 9, 0, 9, [[1, 2]])]),
    "block id out of range": StepPlan(new=[NewSequence("n", [1, 2], 2, 0, 2, [[NUM_BLOCKS]])]),
    "new running block out of range": StepPlan(running=[RunningSequence("held", 1, [[-1]])]),
    "more tokens than known": StepPlan(running=[RunningSequence("held", 2, [[]])]),
    "duplicate new id": StepPlan(new=[NewSequence("held", [1], 1, 0, 1, [[1]])]),
    "twice in one plan": StepPlan(
        running=[RunningSequence("held", 1, [[]]), RunningSequence("held", 0, [[]])]
    ),
    "token outside vocab": StepPlan(new=[NewSequence("n", [49152], 1, 0, 1, [[1]])]),
    "beyond max_model_len": StepPlan(new=[NewSequence("n", [1] * 65, 65, 0, 65, [list(range(8))])]),
    "bad sampling": StepPlan(
        new=[NewSequence("n", [1], 1, 0, 1, [[1]], SamplingOptions(top_p=0.0))]
    ),
    "no block tables": StepPlan(running=[RunningSequence("held", 1, [])]),
    "running and finished": StepPlan(
        running=[RunningSequence("held", 1, [[]])], finished_ids=["held"]
    ),
    # One good entry then a bad one: nothing of the good one may be applied either.
    "partly valid": StepPlan(
        new=[NewSequence("ok", [1, 2], 2, 0, 2, [[3]])],
        running=[RunningSequence("held", 1, [[4]]), RunningSequence("ghost", 1, [[]])],
    ),
}


@pytest.mark.parametrize("name", list(BAD_PLANS))
def test_bad_plan_raises_and_changes_nothing(runner: ModelRunner, name: str) -> None:
    cache_before, facts_before = _snapshot(runner)
    with pytest.raises(ValueError):
        runner.execute(BAD_PLANS[name])
    cache_after, facts_after = _snapshot(runner)
    assert facts_after == facts_before
    assert torch.equal(cache_after, cache_before)


def test_good_plan_after_refusal_still_works(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="unknown"):
        runner.execute(StepPlan(running=[RunningSequence("nobody", 1, [[]])]))
    sampled = runner.execute(StepPlan(running=[RunningSequence("held", 1, [[1]])]))
    assert [s.request_id for s in sampled] == ["held"]


def test_finishing_unknown_ids_is_harmless(runner: ModelRunner) -> None:
    assert runner.execute(StepPlan(finished_ids=["never-seen"])) == []
    assert runner.num_requests == 1
    runner.execute(StepPlan(finished_ids=["held"]))
    assert runner.num_requests == 0


def test_runner_facts(runner: ModelRunner) -> None:
    assert (runner.block_size, runner.num_blocks, runner.max_model_len) == (4, NUM_BLOCKS, 64)
    assert runner.vocab_size == 49152
    assert set(runner.eos_token_ids) == {0, 2}  # eos id 2, <|im_end|> = 2, <|endoftext|> = 0
    assert (runner.device, runner.dtype) == ("cpu", "float32")
    assert len(runner.fingerprint) == 64
