"""Asynchronous scheduling through the real scheduler and model runner (OfflineEngine, the runner
in a thread of its own, one step queued behind the one it computes): the tokens a caller sees
are those of step-by-step scheduling, greedy and seeded, with preemptions, stop ids, aborts
(the tokenizer's stop strings), max_tokens, n > 1 and constrained rows."""

from __future__ import annotations

import json

import pytest

from benchmarks.offline import OfflineEngine, make_runner
from services.common.sampling import SamplingOptions, StructuredOutput
from services.scheduler.request import Request
from services.scheduler.scheduler import SchedulerLimits
from tests.unit.worker.tiny_model import random_prompts, random_tiny

LIMITS = SchedulerLimits(max_num_batched_tokens=48, max_num_seqs=8)
SEEDED = SamplingOptions(temperature=0.9, top_p=0.95, seed=1234)


@pytest.fixture(scope="module")
def tiny():
    return random_tiny(seed=3)


def _requests(sampling: list[SamplingOptions], stop: frozenset[int] = frozenset()) -> list:
    prompts = random_prompts((5, 23, 9, 40, 17, 3, 31, 12), seed=7)
    lengths = (16, 9, 24, 12, 20, 7, 14, 18)
    return [
        Request(f"r{i}", prompt, max_tokens, sampling[i % len(sampling)], stop)
        for i, (prompt, max_tokens) in enumerate(zip(prompts, lengths, strict=True))
    ]


def _run(engine: OfflineEngine, requests: list[Request], abort_after: dict[str, int]) -> tuple:
    """What reached the caller per request, and the preemptions."""
    emitted: dict[str, list[int]] = {}
    ended: set[str] = set()

    def on_update(updated) -> None:
        for update in updated:
            request = update.request
            assert request.request_id not in ended, "a token after the request's end"
            emitted.setdefault(request.request_id, []).extend(s.token_id for s in update.samples)
            if request.finish_reason is not None:
                ended.add(request.request_id)
        for rid, count in abort_after.items():
            if len(emitted.get(rid, ())) >= count and rid not in ended:
                engine.scheduler.abort(rid)  # as the tokenizer does on a stop string
                ended.add(rid)

    engine.run(requests, on_update)
    pool = engine.scheduler.kv.pool
    assert pool.num_free == pool.num_blocks  # every block came back
    assert engine.runner.num_requests == 0  # and the worker forgot every request
    return emitted, engine.scheduler.stats.num_preemptions


def _both(runner_for, make_requests, abort_after=None) -> dict[bool, tuple]:
    runs = {}
    for ahead in (False, True):
        engine = OfflineEngine(runner_for(), LIMITS, async_scheduling=ahead)
        runs[ahead] = _run(engine, make_requests(), abort_after or {})
    return runs


@pytest.mark.parametrize("num_blocks", [256, 9])  # 9 blocks of 16: preemptions
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_async_gives_the_tokens_of_sync(tiny, num_blocks, sampling):
    options = [SamplingOptions()] if sampling == "greedy" else [SEEDED]
    runs = _both(lambda: make_runner(tiny, num_blocks), lambda: _requests(options))
    assert runs[True][0] == runs[False][0]
    assert sum(len(t) for t in runs[True][0].values()) == 16 + 9 + 24 + 12 + 20 + 7 + 14 + 18
    if num_blocks < 256:
        assert runs[True][1] > 0 and runs[False][1] > 0


def test_stop_ids_aborts_and_n_gt_1_give_the_tokens_of_sync(tiny):
    # n = 2: the same prompt under two seeds is two requests; greedy rows share the batch.
    options = [SEEDED, SamplingOptions(temperature=0.9, seed=99), SamplingOptions()]
    greedy = _both(lambda: make_runner(tiny, 256), lambda: _requests(options))[False][0]
    # Stop on a token some rows sample midway, so they end while the next step is out.
    stop = frozenset({greedy["r2"][5], greedy["r5"][2]})
    aborts = {"r1": 4, "r3": 1, "r6": 6}  # stop strings, found by the tokenizer downstream
    runs = _both(lambda: make_runner(tiny, 10), lambda: _requests(options, stop), aborts)
    assert runs[True][0] == runs[False][0]
    assert any(tokens[-1] in stop and len(tokens) > 1 for tokens in runs[True][0].values())
    for rid, count in aborts.items():
        assert len(runs[True][0][rid]) == count


def test_constrained_rows_give_the_tokens_of_sync(make_runner, tokenizer):
    """SmolLM2: JSON rows end on EOS once their grammar completes, and the step already out
    samples once more for them: the matcher past its end must not fail the step."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    structured = StructuredOutput("json_schema", json.dumps(schema))
    options = [
        SamplingOptions(structured=structured),
        SamplingOptions(),
        SamplingOptions(temperature=0.7, seed=5, structured=StructuredOutput("choice", ("a", "b"))),
    ]
    prompts = ["Answer in JSON: is water wet?", "The capital of France is", "Pick a or b:"]

    def requests() -> list[Request]:
        eos = frozenset({tokenizer.token_to_id("<|im_end|>"), 0})
        return [
            Request(f"r{i}", tokenizer.encode(p).ids, 24, options[i], eos)
            for i, p in enumerate(prompts)
        ]

    runs = _both(lambda: make_runner(num_blocks=64), requests)
    assert runs[True][0] == runs[False][0]
    text = tokenizer.decode(runs[True][0]["r0"][:-1])
    assert json.loads(text)["ok"] in (True, False)
