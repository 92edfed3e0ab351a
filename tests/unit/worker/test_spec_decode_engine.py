"""Speculative decoding through the real scheduler and model runner (OfflineEngine, tiny random
Llama): the tokens a caller sees are those of decoding without it, greedy and seeded, with
proposals accepted in full, in part and not at all, preemptions, prefix caching, stop ids met
among accepted proposals, max_tokens and constrained rows; every block comes back."""

from __future__ import annotations

import json

import pytest

from benchmarks.offline import OfflineEngine
from benchmarks.offline import make_runner as make_tiny_runner
from services.common.sampling import SamplingOptions, StructuredOutput
from services.scheduler.request import FinishReason, Request
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.spec_decode import NgramProposer
from tests.unit.worker.tiny_model import random_prompts, random_tiny

LIMITS = SchedulerLimits(max_num_batched_tokens=48, max_num_seqs=8)
SEEDED = SamplingOptions(temperature=0.9, top_p=0.95, seed=1234, logprobs=2)
LENGTHS = (16, 9, 24, 12, 20, 7, 14, 18)


@pytest.fixture(scope="module")
def tiny():
    return random_tiny(seed=3)


class OracleProposer:
    """Proposes what a run without speculation produced after the same tokens, with every
    third proposal position wrong: proposals accepted in full, in part and not at all."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], k: int = 4) -> None:
        self.reference = reference  # prompt -> the tokens that followed it
        self.k = k

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        for prompt, output in self.reference.items():
            if tuple(token_ids[: len(prompt)]) == prompt:
                done = len(token_ids) - len(prompt)
                proposal = output[done : done + min(k, self.k)]
                return [t if (done + j) % 3 else (t + 1) % 256 for j, t in enumerate(proposal)]
        return []


def _requests(sampling: SamplingOptions, stop: frozenset[int] = frozenset()) -> list[Request]:
    prompts = random_prompts((5, 23, 9, 40, 17, 3, 31, 12), seed=7)
    # Two prompts that repeat a pattern: the n-gram proposer finds something there.
    prompts[1] = [5, 6, 7, 8, 9] * 5
    prompts[4] = [11, 12, 13] * 6
    return [
        Request(f"r{i}", prompt, max_tokens, sampling, stop)
        for i, (prompt, max_tokens) in enumerate(zip(prompts, LENGTHS, strict=True))
    ]


def _run(engine: OfflineEngine, requests: list[Request]) -> dict[str, list]:
    """Per request, the (token, logprob) pairs the caller saw; checks nothing leaked."""
    seen: dict[str, list] = {}

    def on_update(updated) -> None:
        for update in updated:
            pairs = [(sample.token_id, sample.logprob) for sample in update.samples]
            seen.setdefault(update.request.request_id, []).extend(pairs)

    engine.run(requests, on_update)
    pool = engine.scheduler.kv.pool
    assert pool.num_free == pool.num_blocks  # every block came back
    assert engine.runner.num_requests == 0  # and the worker forgot every request
    for request in requests:
        assert [t for t, _ in seen[request.request_id]] == request.output_token_ids
    return seen


def _tokens(seen: dict[str, list]) -> dict[str, list[int]]:
    return {rid: [t for t, _ in pairs] for rid, pairs in seen.items()}


def _reference(tiny, sampling, num_blocks=256, stop=frozenset(), limits=LIMITS):
    requests = _requests(sampling, stop)
    seen = _run(OfflineEngine(make_tiny_runner(tiny, num_blocks), limits), requests)
    oracle = {tuple(r.prompt_token_ids): r.output_token_ids for r in requests}
    return seen, oracle


@pytest.mark.parametrize("num_blocks", [256, 9])  # 9 blocks of 16: preemptions
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_speculation_gives_the_tokens_of_decoding_without_it(
    tiny, num_blocks, sampling, prefix_caching
):
    options = SamplingOptions(logprobs=2) if sampling == "greedy" else SEEDED
    limits = SchedulerLimits(48, 8, enable_prefix_caching=prefix_caching)
    reference, oracle = _reference(tiny, options, num_blocks, limits=limits)
    for proposer in (OracleProposer(oracle), NgramProposer(1, 3, 4)):
        runner = make_tiny_runner(tiny, num_blocks)  # every proposal computed (fixed policy)
        engine = OfflineEngine(runner, limits, proposer=proposer, adaptive_speculation=False)
        seen = _run(engine, _requests(options))
        assert _tokens(seen) == _tokens(reference)
        for rid, pairs in seen.items():  # logprobs per emitted token, as without speculation
            assert [lp for _, lp in pairs] == pytest.approx(
                [lp for _, lp in reference[rid]], abs=1e-4
            )
        scheduler = engine.scheduler
        assert 0 < scheduler.stats.num_accepted_tokens < scheduler.stats.num_draft_tokens
        if num_blocks < 256:
            assert scheduler.stats.num_preemptions > 0


def test_oracle_speculation_takes_fewer_steps(tiny):
    reference, oracle = _reference(tiny, SamplingOptions())
    plain = OfflineEngine(make_tiny_runner(tiny, 256), LIMITS)
    _run(plain, _requests(SamplingOptions()))
    fast = OfflineEngine(make_tiny_runner(tiny, 256), LIMITS, proposer=OracleProposer(oracle))
    _run(fast, _requests(SamplingOptions()))
    assert fast.scheduler.stats.num_steps < 0.7 * plain.scheduler.stats.num_steps


def test_a_stop_id_among_accepted_proposals_ends_the_request_there(tiny):
    reference, oracle = _reference(tiny, SamplingOptions())
    # A token from the middle of the longest output: it is among a step's accepted proposals.
    stop = frozenset({oracle[max(oracle, key=lambda p: len(oracle[p]))][11]})
    expected, _ = _reference(tiny, SamplingOptions(), stop=stop)
    requests = _requests(SamplingOptions(), stop)
    engine = OfflineEngine(make_tiny_runner(tiny, 256), LIMITS, proposer=OracleProposer(oracle))
    seen = _run(engine, requests)
    assert _tokens(seen) == _tokens(expected)
    stopped = [r for r in requests if r.finish_reason is FinishReason.STOP]
    assert stopped and all(r.output_token_ids[-1] in stop for r in stopped)
    assert all(len(r.output_token_ids) == r.max_tokens for r in requests if r not in stopped)


def test_smollm_greedy_and_constrained_rows(make_runner, tokenizer):
    """SmolLM2 copying a passage (the n-gram proposer's case) gives the tokens it gives without
    speculation; a JSON-constrained row beside it is never sent proposals."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    structured = StructuredOutput("json_schema", json.dumps(schema))
    passage = "The quick brown fox jumps over the lazy dog. " * 2
    prompts = [f"Repeat exactly: {passage}\nRepeated:", "Answer in JSON: is water wet?"]
    options = [SamplingOptions(), SamplingOptions(structured=structured)]
    eos = frozenset({tokenizer.token_to_id("<|im_end|>"), 0})

    def requests() -> list[Request]:
        return [
            Request(f"r{i}", tokenizer.encode(p).ids, 24, options[i], eos)
            for i, p in enumerate(prompts)
        ]

    plain = _run(OfflineEngine(make_runner(num_blocks=64), LIMITS), requests())
    spec_requests = requests()
    engine = OfflineEngine(make_runner(num_blocks=64), LIMITS, proposer=NgramProposer(2, 4, 4))
    seen = _run(engine, spec_requests)
    assert _tokens(seen) == _tokens(plain)
    assert spec_requests[0].num_accepted_tokens > 0
    assert spec_requests[1].num_draft_tokens == 0
