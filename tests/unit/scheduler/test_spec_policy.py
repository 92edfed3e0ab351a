"""The adaptive speculation policy: the step cost it learns from timed steps, the acceptance it
keeps per request, and the proposals it takes: all of them while tokens are free or accepted,
fewer as they cost more or are rejected, none for a request whose proposals keep failing on a
step that is already costly; and, driving a Scheduler with a clock, that a request copying its
prompt keeps its proposals while one whose proposals are rejected loses them."""

from __future__ import annotations

import pytest

from services.scheduler.spec_decode import NgramProposer
from services.scheduler.spec_policy import Acceptance, StepCost, choose
from services.scheduler.step import Sample, ScheduledStep
from tests.unit.scheduler.drive import FakeClock, drafts, make_request, make_scheduler


def test_step_cost_learns_each_size_and_reads_between_them():
    cost = StepCost()
    assert cost.seconds(1) == 0.0  # nothing timed: tokens look free
    for _ in range(30):
        cost.record(1, 0.0075)
    # One size timed: a bigger step looks no dearer, so proposals are tried and timed.
    assert cost.seconds(9) == pytest.approx(0.0075)
    for seconds in (0.010, 0.012, 0.011):
        cost.record(3, seconds)
    assert cost.seconds(3) == pytest.approx(0.011)  # the median of its steps
    assert cost.seconds(2) == pytest.approx(0.00925)  # halfway between 1 and 3
    # Above the largest size: the last two sizes' slope per token (1.75 ms).
    assert cost.seconds(5) == pytest.approx(0.0145)


def test_step_cost_is_not_one_line():
    # What a CPU's 4-bit kernel does (docs/benchmarks.md): a second row nearly free, a third
    # not. A line fitted through all of them would price the second row at a third's cost.
    cost = StepCost()
    for tokens, seconds in [(1, 0.0075), (2, 0.0080), (3, 0.0160)] * 20:
        cost.record(tokens, seconds)
    assert cost.seconds(2) - cost.seconds(1) == pytest.approx(0.0005)
    assert cost.seconds(3) - cost.seconds(2) == pytest.approx(0.0080)


def test_a_bigger_step_never_looks_cheaper_than_a_smaller_one():
    # Seen at 8 streams on a noisy CPU: 13 tokens timed once at 33 ms, 16 twice at 30 ms. A
    # policy reading those as they are would find 16 cheaper than 13 and take the proposals.
    cost = StepCost()
    for _ in range(9):
        cost.record(8, 0.017)
    cost.record(13, 0.033)
    cost.record(16, 0.029)
    cost.record(16, 0.031)
    pooled = (0.033 + 0.030 * 2) / 3  # 16's median with 13's, weighted by their steps
    assert cost.seconds(13) == pytest.approx(pooled)
    assert cost.seconds(16) == pytest.approx(pooled)
    assert cost.seconds(8) == pytest.approx(0.017)  # below them: untouched
    for _ in range(8):  # 16 timed more: its own median again, above 13's
        cost.record(16, 0.036)
    assert cost.seconds(16) == pytest.approx(0.036)
    assert cost.seconds(13) == pytest.approx(0.033)


def test_step_cost_follows_recent_steps_and_forgets_stale_sizes():
    cost = StepCost()
    for _ in range(50):
        cost.record(8, 0.040)
    cost.record(8, 0.900)  # one step stalled by another process: not a new price
    assert cost.seconds(8) == pytest.approx(0.040)
    for _ in range(50):  # the machine got busier
        cost.record(8, 0.080)
    assert cost.seconds(8) == pytest.approx(0.080)
    cost.record(16, 0.200)
    for _ in range(StepCost.STALE_STEPS + 64):  # 16 never timed again
        cost.record(8, 0.080)
    # Forgotten: a step of 16 looks as dear as one of 8 (free proposals), and is timed again.
    assert cost.seconds(16) == pytest.approx(0.080, rel=0.01)


def test_a_step_that_only_tells_the_worker_to_forget_is_not_timed():
    # Its near-zero time beside one-token steps' would draw a line pricing a token at a whole
    # step (seen on the L2 bench: no proposal was ever taken after one such step).
    sched = make_scheduler(num_blocks=8, block_size=4, proposer=NgramProposer(2, 4, 6))
    speculator = sched.speculator
    speculator.sent(ScheduledStep(finished_ids=["done"]), now=1.0)
    speculator.done(now=1.00002)
    assert speculator.cost.seconds(1) == 0.0  # still nothing timed: proposals look free


def test_acceptance_counts_the_first_rejection_as_the_last_trial():
    record = Acceptance()
    record.add(num_drafts=4, num_accepted=4)  # 4 trials, all accepted
    record.add(num_drafts=4, num_accepted=1)  # the 2nd rejected: 2 trials; the rest untried
    assert (record.accepted, record.trials) == (5, 6)
    weight = Acceptance.PRIOR_WEIGHT  # the prior counts as this many trials
    assert record.rate(prior=0.5) == pytest.approx((5 + weight * 0.5) / (6 + weight))
    assert Acceptance().overall_rate() == 0.5  # no record: Laplace's 1/2


def line(a: float, b: float):
    """A step cost of a + b x tokens seconds."""
    return lambda tokens: a + b * tokens


def test_choose_takes_everything_while_tokens_are_free():
    assert choose([(0.9, 4), (0.05, 3), (0.5, 0)], 8, 8, line(0.04, 0.0)) == [4, 3, 0]
    # The fixed policy's cost (every step free), or nothing timed yet: all, whatever the gain.
    assert choose([(0.2, 1), (0.5, 0)], 8, 8, line(0.0, 0.0)) == [1, 0]


def test_choose_takes_proposals_while_they_pay_best_first():
    # A step of 8 decoding sequences, 40 ms plus 2 ms a token: the j-th proposal of a request
    # with acceptance p is taken while p^j t(T) > E b.
    taken = choose([(0.95, 8), (0.3, 4), (0.05, 4)], 8, 8, line(0.040, 0.002))
    assert taken[0] >= 5  # nearly always accepted: worth most of its proposals
    assert taken[1] <= 1  # the first is worth 0.3 of a token; the second 0.09 does not pay
    assert taken[2] == 0  # rejected almost always: not worth a token
    # At batch 1 the same step costs the same but yields 1 token: more proposals pay.
    assert choose([(0.3, 4)], 1, 1, line(0.040, 0.002)) == [2]
    # Tokens that cost more than their step's fixed part: only near-certain proposals pay.
    assert choose([(0.8, 8), (0.5, 4)], 8, 8, line(0.010, 0.010)) == [0, 0]
    # A near-certain proposal is a token for the price of one token, below the step's average
    # (a + b T) / E as long as a > 0: it pays however dear tokens are, once the gain clears
    # MIN_GAIN (here +4%: not taken; with a dearer fixed part, +18%: all taken).
    assert choose([(0.99, 8), (0.5, 4)], 8, 8, line(0.010, 0.010)) == [0, 0]
    assert choose([(0.99, 8), (0.5, 4)], 8, 8, line(0.040, 0.010)) == [8, 0]


def test_choose_at_batch_one_on_a_cpu_prices_each_row():
    # One sequence; steps measured on the CPU with the float32 4-bit op (busy 2-core EPYC):
    # 1, 2 and 3 tokens take 7.5, 10.7 and 16.2 ms. A proposal pays only when it is accepted
    # more often than its row costs against the step: 3.2 / 7.5 = 0.43 for the first.
    cost = {1: 0.0075, 2: 0.0107, 3: 0.0162}
    seconds = lambda tokens: cost.get(tokens, 0.0162 + 0.0055 * (tokens - 3))  # noqa: E731
    assert choose([(0.40, 8)], 1, 1, seconds) == [0]  # open text, sampled: ~0.4 accepted
    # 0.5: one proposal gains 5% on paper, within MIN_GAIN; 0.6 gains 12%, and the second
    # (worth 0.36) does not pay
    assert choose([(0.50, 8)], 1, 1, seconds) == [0]
    assert choose([(0.60, 8)], 1, 1, seconds) == [1]
    # Copying (0.95): two proposals (16.2 ms for 2.85 tokens) are worse than one (10.7 ms for
    # 1.95), but the third row is cheap (19 ms for 3.71 tokens): the best is three.
    cost[4] = 0.0190
    assert choose([(0.95, 8)], 1, 1, seconds) == [3]


def _drive(sched, clock, outputs, steps, cost):
    """Steps where the worker takes cost[0] + cost[1] x tokens seconds and each request's
    next tokens are outputs[request id]: proposals are accepted while they match them."""
    drafts_per_step = []
    for _ in range(steps):
        step = sched.schedule()
        clock.now += cost[0] + cost[1] * step.num_tokens
        proposed = drafts(step)
        drafts_per_step.append({rid: len(d) for rid, d in proposed.items()})
        samples = []
        for part in step.requests:
            request = part.request
            if not request.num_output_placeholders:
                continue  # a prefill chunk short of its last token
            rid = request.request_id
            proposal = proposed.get(rid, [])
            done = len(request.output_token_ids)
            for j, token in enumerate(outputs[rid][done : done + 1 + len(proposal)]):
                samples.append(Sample(rid, token))
                if j < len(proposal) and proposal[j] != token:
                    break  # the worker's own token replaces the first rejected proposal
        sched.update(samples)
    return drafts_per_step


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_copying_request_keeps_its_proposals_and_a_missing_one_loses_them(adaptive):
    clock = FakeClock()
    sched = make_scheduler(
        num_blocks=96,
        block_size=4,
        clock=clock,
        proposer=NgramProposer(2, 4, 6),
        adaptive_speculation=adaptive,
    )
    passage = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21] * 2
    # "copy" repeats its prompt, so the n-gram proposals are right. "miss" writes "30 31 x"
    # with a new x each time: after every "30 31" the proposer offers what followed the last
    # one, which is always wrong.
    copy = make_request("copy", passage, max_tokens=200)
    miss = make_request("miss", [30, 31, 32] * 8, max_tokens=60)
    outputs = {"copy": passage[12:] * 17, "miss": [t for x in range(100, 120) for t in (30, 31, x)]}
    for request in (copy, miss):
        sched.add(request)
    steps = _drive(sched, clock, outputs, steps=24, cost=(0.040, 0.010))
    late = steps[8:]
    assert sum(s.get("copy", 0) for s in late) >= 4 * len(late)  # most of its 6, every step
    missed = sum(s.get("miss", 0) for s in late)
    if adaptive:
        assert missed <= len(late) // 4  # a probe now and then
    else:  # the fixed policy: all the proposer finds (3 tokens), every third step
        assert missed >= len(late) * 3 // 4
    assert copy.num_accepted_tokens > 0.9 * copy.num_draft_tokens
