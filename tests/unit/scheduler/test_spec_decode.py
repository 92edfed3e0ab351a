"""Speculative decoding in the scheduler: the n-gram proposer, proposals budgeted and given
blocks like any token, rejected ones rolled back with their blocks, only verified tokens cached,
stops among accepted tokens, the wire form, and one output per request per step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from layerserve.worker.v1 import worker_pb2
from services.common.sampling import SamplingOptions, StructuredOutput
from services.scheduler.engine import _output
from services.scheduler.request import FinishReason
from services.scheduler.request_trace import spec_decode_attributes
from services.scheduler.scheduler_metrics import SchedulerCollector, SchedulerMetrics
from services.scheduler.spec_decode import NgramProposer
from services.scheduler.step import Sample
from services.scheduler.worker_info import WorkerInfo
from services.scheduler.worker_link import result_from_proto, step_to_proto
from tests.unit.scheduler.drive import EOS, drafts, make_request, make_scheduler


class FixedProposer:
    """Proposes `tokens` (cut to k) whatever the history."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.k = len(tokens)

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        return self.tokens[:k]


def test_ngram_proposes_what_followed_the_last_earlier_match():
    proposer = NgramProposer(min_n=1, max_n=3, k=3)
    #          the suffix [1, 2] occurs twice before; the most recent occurrence wins
    assert proposer.propose([1, 2, 5, 6, 1, 2, 7, 8, 9, 1, 2], 3) == [7, 8, 9]
    assert proposer.propose([1, 2, 5, 6, 1, 2, 7, 8, 9, 1, 2], 2) == [7, 8]  # k caps
    assert proposer.propose([1, 2, 3, 4], 3) == []  # nothing repeats
    assert proposer.propose([4, 4], 3) == [4]  # what follows the match, up to the end


def test_ngram_prefers_the_longest_matching_suffix():
    # [3] alone last occurred before 9; [2, 3] occurred before 5.
    tokens = [2, 3, 5, 6, 3, 9, 2, 3]
    assert NgramProposer(1, 2, 2).propose(tokens, 2) == [5, 6]
    assert NgramProposer(1, 1, 2).propose(tokens, 2) == [9, 2]
    assert NgramProposer(3, 3, 2).propose(tokens, 2) == []  # min_n 3: no match
    # Token ids whose bytes straddle others' must not match off a token boundary.
    assert NgramProposer(1, 1, 1).propose([256, 1, 0, 0, 7, 1], 1) == [0]


def _decoding(sched, rid="a", prompt=(1, 2, 3, 4, 5), max_tokens=8):
    """A request past its prefill (one token sampled): its next step decodes."""
    request = make_request(rid, list(prompt), max_tokens)
    sched.add(request)
    step = sched.schedule()
    sched.update([Sample(rid, 6)])
    assert not drafts(step)  # a prefill never carries proposals
    return request


def test_proposals_are_computed_with_blocks_and_rolled_back_when_rejected():
    sched = make_scheduler(num_blocks=8, block_size=4, proposer=FixedProposer([7, 8, 9, 10]))
    request = _decoding(sched)  # 6 tokens known, 5 computed, 2 blocks
    step = sched.schedule()
    assert drafts(step) == {"a": [7, 8, 9, 10]}
    assert step.running[0].num_new == 5  # its last token and the 4 proposals
    assert request.block_ids == [0, 1, 2]  # 10 tokens' KV: a third block
    assert sched.kv.pool.num_free == 5
    # The worker accepts 7, rejects 8 and samples 20 instead.
    (update,) = sched.update([Sample("a", 7), Sample("a", 20)])
    assert [s.token_id for s in update.samples] == [7, 20]
    assert request.output_token_ids == [6, 7, 20]
    assert request.num_computed_tokens == 7  # prompt, 6 and 7; 20 is computed next step
    assert request.block_ids == [0, 1]  # the third block held only rejected proposals
    assert sched.kv.pool.num_free == 6
    assert (sched.stats.num_draft_tokens, sched.stats.num_accepted_tokens) == (4, 1)
    assert (request.num_draft_tokens, request.num_accepted_tokens) == (4, 1)


def test_proposals_count_against_the_budget_and_max_tokens():
    sched = make_scheduler(budget=3, proposer=FixedProposer([7, 8, 9, 10]))
    _decoding(sched, prompt=(1, 2, 3), max_tokens=8)
    assert drafts(sched.schedule()) == {"a": [7, 8]}  # 1 + 2 tokens fill the budget of 3
    sched.update([Sample("a", 7), Sample("a", 8), Sample("a", 9)])
    sched2 = make_scheduler(proposer=FixedProposer([7, 8, 9, 10]))
    request = _decoding(sched2, max_tokens=3)  # 1 output; 2 more allowed
    assert drafts(sched2.schedule()) == {"a": [7]}  # the step's own token is the third
    sched2.update([Sample("a", 7), Sample("a", 11)])
    assert request.output_token_ids == [6, 7, 11]
    assert request.finish_reason is FinishReason.LENGTH
    assert sched2.kv.pool.num_free == sched2.kv.pool.num_blocks


def test_a_stop_among_accepted_tokens_drops_those_after_it():
    sched = make_scheduler(proposer=FixedProposer([7, EOS, 9]))
    request = _decoding(sched)
    sched.schedule()
    (update,) = sched.update([Sample("a", 7), Sample("a", EOS), Sample("a", 9), Sample("a", 4)])
    assert [s.token_id for s in update.samples] == [7, EOS]
    assert request.output_token_ids == [6, 7, EOS]
    assert request.finish_reason is FinishReason.STOP
    assert sched.kv.pool.num_free == sched.kv.pool.num_blocks


def test_only_verified_tokens_join_the_prefix_cache():
    sched = make_scheduler(num_blocks=8, block_size=4, proposer=FixedProposer([7, 8, 9]))
    request = _decoding(sched, prompt=(1, 2, 3))  # 4 known, 3 computed
    sched.schedule()  # computes 3 (last known) and 7, 8, 9: two full blocks of KV
    sched.update([Sample("a", 7), Sample("a", 30)])  # 8 rejected
    assert request.num_computed_tokens == 5  # 1 2 3 6 7
    assert request.num_cached_blocks == 1  # [1 2 3 6]; [7 8 9 _] held unverified KV
    assert sched.kv.pool.num_cached == 1


def test_speculation_never_preempts():
    proposer = FixedProposer([7, 8, 9, 10, 11, 12])
    sched = make_scheduler(num_blocks=3, block_size=4, proposer=proposer)
    a, b = make_request("a", [1, 2, 3], 8), make_request("b", [4, 5, 6], 8)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.update([Sample("a", 6), Sample("b", 6)])  # 2 of 3 blocks used; 1 free
    step = sched.schedule()  # proposals would need 2 more blocks each: both decode plainly
    assert drafts(step) == {}
    assert [(r.request.request_id, r.num_new) for r in step.requests] == [("a", 1), ("b", 1)]
    assert a.num_preemptions == b.num_preemptions == 0


def test_constrained_requests_and_steps_in_flight_do_not_speculate():
    sched = make_scheduler(proposer=FixedProposer([7, 8]))
    request = make_request("a", [1, 2, 3], 8)
    request.sampling = SamplingOptions(structured=StructuredOutput("choice", ("x", "y")))
    sched.add(request)
    sched.schedule()
    sched.update([Sample("a", 6)])
    assert drafts(sched.schedule()) == {}
    other = make_scheduler(proposer=FixedProposer([7, 8]))
    _decoding(other)
    other.add(make_request("b", [1, 2, 3], 8))
    first = other.schedule()  # a speculates
    assert drafts(first) == {"a": [7, 8]}
    ahead = other.schedule()  # scheduled before first's result: a waits, b gets no proposals
    assert "a" not in [r.request.request_id for r in ahead.requests] and not drafts(ahead)


def test_the_wire_carries_proposals_and_several_tokens_per_request():
    sched = make_scheduler(proposer=FixedProposer([7, 8]))
    _decoding(sched)
    step = sched.schedule()
    msg = step_to_proto(step, 1)
    assert list(msg.running[0].draft_token_ids) == [7, 8]
    assert msg.running[0].num_new_tokens == 3
    wire = worker_pb2.StepResult(step_id=1)
    for token in (7, 8, 12):
        wire.sampled.add(request_id="a", token_id=token)
    (update,) = sched.update(result_from_proto(wire).samples)
    output = _output(update)
    assert output.token_ids == [7, 8, 12] and output.finish_reason is None


def test_acceptance_shows_in_metrics_and_on_the_request_span():
    sched = make_scheduler(proposer=FixedProposer([7, 8, 9]))
    sched.events.observers.append(SchedulerMetrics("m"))
    request = _decoding(sched)
    sched.schedule()
    sched.update([Sample("a", 7), Sample("a", 8), Sample("a", 30)])  # 2 of 3 accepted
    worker = SimpleNamespace(address="w", info=WorkerInfo("m", 4, 8, 256, 64), scheduler=sched)
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(lambda: [worker]))
    labels = {"model": "m", "worker": "w"}
    read = registry.get_sample_value
    assert read("layerserve:spec_decode_num_draft_tokens_total", labels) == 3
    assert read("layerserve:spec_decode_num_accepted_tokens_total", labels) == 2
    assert read("layerserve:spec_decode_num_drafts_total", labels) == 1
    length = REGISTRY.get_sample_value(
        "layerserve:spec_decode_accepted_length_bucket", {"model": "m", "le": "3.0"}
    )
    assert length is not None and length >= 1
    attributes = spec_decode_attributes(request)
    assert attributes["layerserve.spec_decode.acceptance_rate"] == pytest.approx(2 / 3)
    assert attributes["layerserve.spec_decode.mean_accepted_length"] == 3.0
