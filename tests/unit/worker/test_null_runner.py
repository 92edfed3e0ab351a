"""The null worker's tokens follow from the sequence itself: a request resubmitted with its
prompt and the tokens already produced (a migration to another worker, a preemption) continues
with exactly the tokens of the uninterrupted run, and continuation() says what they are."""

from __future__ import annotations

from services.worker.engine.null_runner import FIRST_TOKEN, NUM_TOKENS, NullRunner, continuation
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan

PROMPT = [5, 17, 42, 1000, 7]


def generate(runner: NullRunner, rid: str, token_ids: list[int], count: int, chunk: int) -> list:
    """`count` tokens for a new request, its known tokens computed `chunk` at a time."""
    computed = min(chunk, len(token_ids))
    plan = StepPlan(new=[NewSequence(rid, token_ids, len(token_ids), 0, computed, [[0]])])
    out = []
    while len(out) < count:
        out += [s.token_id for s in runner.execute(plan)]
        step = min(chunk, len(token_ids) - computed) if computed < len(token_ids) else 1
        computed += step
        plan = StepPlan(running=[RunningSequence(rid, step, [])])
    runner.execute(StepPlan(finished_ids=[rid]))
    return out


def test_a_resubmitted_stream_continues_with_the_uninterrupted_runs_tokens() -> None:
    whole = generate(NullRunner(), "a", PROMPT, 40, chunk=64)
    assert whole == continuation(PROMPT, 40)
    assert len(set(whole)) > 20  # not a constant: a resumed count would show
    assert all(FIRST_TOKEN <= t < FIRST_TOKEN + NUM_TOKENS for t in whole)
    for cut in (1, 13, 39):
        # Another worker (a fresh runner), the prompt and what was sent so far, in chunks.
        resumed = generate(NullRunner(), "a", PROMPT + whole[:cut], 40 - cut, chunk=3)
        assert whole[:cut] + resumed == whole, cut


def test_tokens_depend_on_the_sequence_not_on_the_request() -> None:
    runner = NullRunner()
    assert generate(runner, "x", PROMPT, 8, 64) == generate(runner, "y", PROMPT, 8, 64)
    assert generate(runner, "z", PROMPT[:-1] + [8], 8, 64) != continuation(PROMPT, 8)
