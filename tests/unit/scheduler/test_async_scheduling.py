"""Asynchronous scheduling at the Scheduler: step n + 1 is scheduled before step n's result is
applied. Placeholders get exact blocks; a request that finished at step n is dropped at n + 1
and nothing of it reaches the caller after its finish; preempted and aborted requests' tokens
in flight are dropped; and a whole workload gives the same tokens as scheduling step by step,
against a fake worker whose tokens depend on everything before them (as greedy decoding's)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest

from services.scheduler.request import FinishReason, Request, Status
from services.scheduler.scheduler import Sample, ScheduledStep, Scheduler
from tests.unit.scheduler.drive import EOS, make_request, make_scheduler


@dataclass(slots=True)
class _Held:
    tokens: list[int]
    computed: int


class FakeWorker:
    """Holds each sequence as the real worker does (tokens it was sent, then those it samples)
    and samples a token that depends on every token before it, so a dropped, doubled or
    misplaced token changes all that follows."""

    def __init__(self, eos_every: int = 0) -> None:
        self.held: dict[str, _Held] = {}
        self.eos_every = eos_every  # > 0: some sequences hit EOS

    def execute(self, step: ScheduledStep) -> list[Sample]:
        for request_id in step.finished_ids:
            self.held.pop(request_id, None)
        work = []
        for new in step.new:
            request = new.request
            assert request.request_id not in self.held
            self.held[request.request_id] = _Held(list(request.all_token_ids), new.num_cached)
            work.append((request.request_id, new.num_new))
        work += [(r.request.request_id, r.num_new) for r in step.running]
        samples = []
        for request_id, num_new in work:
            seq = self.held[request_id]
            seq.computed += num_new
            assert seq.computed <= len(seq.tokens), "computing a token the worker does not have"
            if seq.computed == len(seq.tokens):
                token = self._next(seq.tokens)
                seq.tokens.append(token)
                samples.append(Sample(request_id, token))
        return samples

    def _next(self, tokens: list[int]) -> int:
        digest = 0
        for token in tokens:
            digest = (digest * 1_000_003 + token) % 1_000_000_007
        if self.eos_every and digest % self.eos_every == 0:
            return EOS
        return 3 + digest % 40


def drive(
    sched: Scheduler,
    worker: FakeWorker,
    *,
    ahead: bool,
    abort_after: dict[str, int] | None = None,
    max_steps: int = 2000,
) -> dict[str, list[int]]:
    """Runs the scheduler until idle, one step ahead when `ahead` (engine.py's loop). What
    reaches the caller per request; abort_after: abort a request once it has emitted that
    many tokens (the tokenizer does on a stop string)."""
    emitted: dict[str, list[int]] = {}
    ended: set[str] = set()
    in_flight: deque[list[Sample]] = deque()
    for _ in range(max_steps):
        step = sched.schedule() if sched.has_work() else None
        sent = step is not None and not step.is_empty
        if sent:
            in_flight.append(worker.execute(step))
        if not in_flight:
            return emitted
        if len(in_flight) == (2 if ahead else 1) or not sent:
            for update in sched.update(in_flight.popleft()):
                request = update.request
                assert request.request_id not in ended, "output after the request's end"
                emitted.setdefault(request.request_id, []).extend(
                    s.token_id for s in update.samples
                )
                if request.finish_reason is not None:
                    ended.add(request.request_id)
            for rid, count in (abort_after or {}).items():
                if len(emitted.get(rid, ())) >= count and rid not in ended:
                    sched.abort(rid)
                    ended.add(rid)
    raise AssertionError("the scheduler did not drain")


def _workload(num: int = 8, max_tokens: int = 12) -> list[Request]:
    return [
        make_request(f"r{i}", [5 + i + j for j in range(3 + 5 * i % 11)], max_tokens=max_tokens)
        for i in range(num)
    ]


def test_a_running_request_is_scheduled_again_with_its_token_as_a_placeholder():
    sched = make_scheduler(num_blocks=8, block_size=4)
    request = make_request("a", [11, 12, 13, 14], max_tokens=8)
    sched.add(request)
    first = sched.schedule()  # the prompt; samples the first token
    second = sched.schedule()  # before that token is back
    assert [(r.request, r.num_new) for r in first.new] == [(request, 4)]
    # The placeholder is token 5: a block of its own, allocated now.
    assert [(r.request, r.num_new) for r in second.running] == [(request, 1)]
    assert second.running[0].new_blocks == [[request.block_ids[1]]]
    assert request.num_computed_tokens == 5 and request.num_output_placeholders == 2
    assert [s.request.request_id for s in sched.results._in_flight[0]] == ["a"]
    sched.update([Sample("a", 20)])
    assert request.output_token_ids == [20] and request.num_output_placeholders == 1
    sched.update([Sample("a", 21)])
    assert request.output_token_ids == [20, 21] and request.num_output_placeholders == 0


def test_a_request_that_ends_in_step_n_is_dropped_from_n_plus_1_and_its_blocks_freed():
    sched = make_scheduler(num_blocks=8, block_size=4)
    request = make_request("a", [11, 12, 13, 14], max_tokens=8)
    sched.add(request)
    sched.schedule()
    sched.schedule()  # step n + 1 holds "a" with the block for its 6th token
    updated = sched.update([Sample("a", EOS)])
    assert [(u.request.request_id, u.request.finish_reason) for u in updated] == [
        ("a", FinishReason.STOP)
    ]
    assert sched.kv.pool.num_free == 8  # the extra token's block too
    assert sched.update([Sample("a", 30)]) == []  # the extra token: dropped here
    assert request.output_token_ids == [EOS]
    assert sched.schedule().finished_ids == ["a"]  # the worker forgets it


def test_max_tokens_reached_by_placeholders_schedules_no_further_step():
    sched = make_scheduler(num_blocks=8, block_size=4)
    request = make_request("a", [11, 12, 13], max_tokens=2)
    sched.add(request)
    sched.schedule()
    sched.schedule()  # its 2nd and last token is now in flight
    assert sched.schedule().is_empty  # no 3rd: it would only be thrown away
    sched.update([Sample("a", 20)])
    updated = sched.update([Sample("a", 21)])
    assert updated[0].request.finish_reason is FinishReason.LENGTH
    assert request.output_token_ids == [20, 21]


def test_the_context_length_reached_by_placeholders_schedules_no_further_step():
    sched = make_scheduler(num_blocks=80, block_size=4, max_model_len=6)
    request = make_request("a", [11, 12, 13, 14, 15], max_tokens=50)
    sched.add(request)
    sched.schedule()  # 5 prompt tokens; the 6th (the last that fits) is sampled
    assert sched.schedule().is_empty  # computing the 6th would sample a 7th: past the model
    sched.update([Sample("a", 20)])
    assert request.finish_reason is FinishReason.LENGTH


def test_a_preempted_requests_token_in_flight_is_dropped_and_it_is_recomputed():
    sched = make_scheduler(num_blocks=3, block_size=4, budget=64)
    low = make_request("low", [1, 2, 3, 4], max_tokens=8, priority=-1)
    high = make_request("high", [5, 6, 7, 8], max_tokens=8)
    sched.add(high)
    sched.add(low)
    sched.schedule()  # both prompts: 2 blocks
    step = sched.schedule()  # both need a 2nd block, 1 is free: the low one yields...
    assert "low" in step.finished_ids and low.num_preemptions == 1
    # ... and starts over in the same step, on the block it gave up: its prompt recomputed.
    assert [(r.request.request_id, r.num_new) for r in step.new] == [("low", 4)]
    assert low.status is Status.RUNNING and low.num_output_placeholders == 1
    updated = sched.update([Sample("high", 30), Sample("low", 31)])
    assert [u.request.request_id for u in updated] == ["high"]  # low's is of its first run: stale
    assert low.output_token_ids == [] and low.num_output_placeholders == 1
    updated = sched.update([Sample("high", 32), Sample("low", 31)])
    assert [u.request.request_id for u in updated] == ["high", "low"]
    assert low.output_token_ids == [31]


def test_prefix_caching_offers_only_blocks_whose_step_has_returned():
    sched = make_scheduler(num_blocks=8, block_size=4)
    request = make_request("a", [11, 12, 13], max_tokens=8)
    sched.add(request)
    sched.schedule()  # tokens 1-3
    sched.schedule()  # token 4 (a placeholder) fills block 0: not computed until it returns
    sched.update([Sample("a", 20)])
    assert request.num_cached_blocks == 0
    sched.schedule()
    sched.update([Sample("a", 21)])
    assert request.num_cached_blocks == 1


@pytest.mark.parametrize(
    ("num_blocks", "eos_every", "abort_after"),
    [
        (64, 0, {}),  # roomy: no preemption
        (12, 0, {}),  # tight: preemptions, some with steps in flight
        (64, 7, {}),  # EOS stops while the next step is out
        (7, 13, {"r1": 3, "r4": 1, "r6": 5}),  # stop strings (aborts), EOS, preemptions
    ],
)
def test_one_step_ahead_gives_the_tokens_of_step_by_step(num_blocks, eos_every, abort_after):
    runs = {}
    for ahead in (False, True):
        sched = make_scheduler(num_blocks=num_blocks, block_size=4, budget=24)
        requests = _workload()
        for request in requests:
            sched.add(request)
        worker = FakeWorker(eos_every)
        emitted = drive(sched, worker, ahead=ahead, abort_after=abort_after)
        assert sched.kv.pool.num_free == num_blocks  # every block came back
        assert worker.held == {}  # and the worker was told to forget every request
        runs[ahead] = (emitted, [r.output_token_ids for r in requests], sched.stats.num_preemptions)
    assert runs[True][:2] == runs[False][:2]
    if num_blocks < 64:
        assert runs[True][2] > 0 and runs[False][2] > 0
    for rid, count in abort_after.items():
        assert len(runs[True][0][rid]) <= count
