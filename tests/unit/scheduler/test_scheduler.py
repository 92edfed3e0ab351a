"""The scheduler's decisions, step by step, with exact block ids."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.scheduler.admission import ModelLimits, admit
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import FinishReason, Request, Status
from services.scheduler.scheduler import Sample, Scheduler, SchedulerLimits

EOS = 2


def make_scheduler(num_blocks=8, block_size=4, budget=16, max_seqs=8, caching=True) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), block_size)
    limits = SchedulerLimits(budget, max_seqs, enable_prefix_caching=caching)
    return Scheduler(limits, kv, 64, frozenset({EOS}))


def make_request(rid: str, prompt_len: int, max_tokens: int = 4, priority: int = 0) -> Request:
    return Request(
        rid,
        list(range(10, 10 + prompt_len)),
        max_tokens,
        SamplingOptions(),
        frozenset({EOS}),
        priority=priority,
    )


def sample_all(sched: Scheduler, step, token: int = 7) -> list:
    """Samples `token` for every scheduled request that caught up with its tokens."""
    caught_up = [part.request for part in step.requests if part.request.num_output_placeholders]
    return sched.update([Sample(r.request_id, token) for r in caught_up])


def test_prefill_then_decode_allocates_blocks_as_tokens_grow():
    sched = make_scheduler()
    sched.add(make_request("a", prompt_len=6, max_tokens=4))
    step = sched.schedule()
    (new,) = step.new
    assert new.num_new == 6 and new.request.block_ids == [0, 1]
    sample_all(sched, step)
    for _ in range(2):  # computing tokens 7 and 8 fits in the two blocks
        step = sched.schedule()
        assert [(r.request.request_id, r.num_new, r.new_blocks) for r in step.running] == [
            ("a", 1, [[]])
        ]
        sample_all(sched, step)
    step = sched.schedule()  # the 9th token needs a third block
    assert step.running[0].new_blocks == [[2]]
    updated = sample_all(sched, step)
    assert updated[0].request.finish_reason is FinishReason.LENGTH
    assert sched.kv.pool.num_free == 8
    assert sched.schedule().finished_ids == ["a"]  # the worker is told to forget it


def test_long_prompt_is_chunked_under_the_token_budget_while_decodes_continue():
    sched = make_scheduler(num_blocks=16, budget=8)
    sched.add(make_request("short", prompt_len=3, max_tokens=10))
    sample_all(sched, sched.schedule())
    sched.add(make_request("long", prompt_len=20))
    step = sched.schedule()
    assert [(r.request.request_id, r.num_new) for r in step.running] == [("short", 1)]
    assert [(r.request.request_id, r.num_new) for r in step.new] == [("long", 7)]
    updated = sample_all(sched, step)
    assert [u.request.request_id for u in updated] == ["short"]  # a partial prefill samples none
    step = sched.schedule()
    assert [(r.request.request_id, r.num_new) for r in step.running] == [("short", 1), ("long", 7)]


def test_eos_stops_unless_ignored():
    sched = make_scheduler()
    sched.add(make_request("a", prompt_len=2, max_tokens=10))
    assert sched.update([Sample("a", EOS)]) == []  # not running yet: dropped
    step = sched.schedule()
    (update,) = sample_all(sched, step, token=EOS)
    assert update.request.finish_reason is FinishReason.STOP


def test_out_of_blocks_preempts_the_most_recent_request_which_resumes_with_its_tokens():
    # Without prefix caching, so the resumed request recomputes everything (with caching it
    # would resume from the blocks "old" cached: see test_prefix_cache.py).
    sched = make_scheduler(num_blocks=4, block_size=4, budget=64, caching=False)
    sched.add(make_request("old", prompt_len=8, max_tokens=20))
    sched.add(make_request("new", prompt_len=8, max_tokens=20))
    step = sched.schedule()
    assert sched.kv.pool.num_free == 0
    sample_all(sched, step)  # both at 9 tokens: each needs a third block
    step = sched.schedule()
    assert step.finished_ids == ["new"]
    assert [r.request.request_id for r in step.running] == ["old"]
    new = sched.requests["new"]
    assert new.status is Status.WAITING and new.block_ids == [] and new.num_computed_tokens == 0
    assert new.output_token_ids == [7] and sched.stats.num_preemptions == 1
    sched.abort("old")
    step = sched.schedule()
    (resumed,) = step.new  # its prompt and generated token, recomputed:
    assert resumed.request is new and resumed.num_new == 9


def test_a_prompt_starts_only_when_the_pool_can_hold_all_of_it():
    """Two 28-token prompts (7 blocks each) in a pool of 10, 8 tokens a step: "b" waits until
    "a" has finished instead of starting on the blocks left over and being preempted (losing
    its prefill) once "a" needs them."""
    sched = make_scheduler(num_blocks=10, block_size=4, budget=8, caching=False)
    sched.add(make_request("a", prompt_len=28, max_tokens=6))
    sched.add(make_request("b", prompt_len=28, max_tokens=6))
    started: dict[str, int] = {}
    for step_index in range(40):
        step = sched.schedule()
        for part in step.new:
            started[part.request.request_id] = step_index
        sample_all(sched, step)
        if not sched.has_work():
            break
    assert sched.stats.num_preemptions == 0
    assert started["b"] > started["a"] + 4, "b waited for a's blocks"
    assert sched.kv.pool.num_free == 10 and not sched.requests


def test_priority_orders_the_queue_and_chooses_the_victim():
    sched = make_scheduler(num_blocks=4, block_size=4, budget=4, max_seqs=1)
    sched.add(make_request("low", prompt_len=2))
    sched.add(make_request("high", prompt_len=2, priority=5))
    step = sched.schedule()
    assert [r.request.request_id for r in step.new] == ["high"]


def test_abort_frees_blocks_and_tells_the_worker():
    sched = make_scheduler()
    sched.add(make_request("a", prompt_len=9))
    sched.schedule()
    assert sched.kv.pool.num_free == 5
    sched.abort("a")
    assert sched.kv.pool.num_free == 8
    assert sched.schedule().finished_ids == ["a"]
    assert not sched.has_work()


def test_admission_rejects_what_can_never_run():
    limits = ModelLimits(
        max_model_len=32, vocab_size=100, block_size=4, num_blocks=4, eos_token_ids=frozenset({EOS})
    )

    def build(prompt, max_tokens=0, sampling=None):
        return admit(
            request_id="r",
            prompt_token_ids=prompt,
            max_tokens=MaxTokens(max_tokens),
            sampling=sampling or SamplingOptions(),
            stop_token_ids=[],
            ignore_eos=False,
            priority=0,
            trace_context={},
            limits=limits,
        )

    with pytest.raises(InvalidArgument, match="maximum context length"):
        build(list(range(40)))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        build([5, 500])
    with pytest.raises(InvalidArgument, match="KV cache"):
        build([5] * 10, max_tokens=10)  # 20 tokens > 4 blocks of 4
    with pytest.raises(InvalidArgument, match="temperature"):
        build([5], max_tokens=1, sampling=SamplingOptions(temperature=9))
    assert build([5] * 4, max_tokens=0).max_tokens == 12  # what fits in the KV cache
    # Longer than the KV cache, shorter than the context, max_tokens unset: refused at once
    # (it used to pass as "-4 tokens to generate" and wait forever for 5 blocks of 4).
    with pytest.raises(InvalidArgument, match="KV cache holds 16 tokens"):
        build([5] * 20, max_tokens=0)
