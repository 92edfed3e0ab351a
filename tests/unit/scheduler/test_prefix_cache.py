"""Prefix caching through the Scheduler: which blocks a request reuses, when blocks join the
cache, what the worker is told, and that every block comes back (blocks of 4 tokens)."""

from __future__ import annotations

from services.common.block_hash import block_hashes
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.output import Output
from services.scheduler.output_proto import output_to_proto
from services.scheduler.request import FinishReason, Status
from services.scheduler.scheduler import Sample
from services.scheduler.worker_link import step_to_proto
from tests.unit.scheduler.drive import (
    RecordingListener,
    finish_step,
    make_request,
    make_scheduler,
    run_step,
    run_until_idle,
)

SHARED = list(range(100, 108))  # two full blocks


def test_a_finished_requests_full_blocks_serve_the_next_request_with_that_prefix():
    sched = make_scheduler()
    sched.add(make_request("a", SHARED + [1, 3], max_tokens=1))
    step = sched.schedule()
    assert step.new[0].request.block_ids == [0, 1, 2]
    finish_step(sched, step)  # a ends: its blocks return to the pool, full ones cached
    assert sched.kv.pool.num_cached == 2  # the partial third block is not cached
    sched.add(make_request("b", SHARED + [4, 5, 6, 8]))
    step = sched.schedule()
    (new,) = step.new
    b, num_new = new.request, new.num_new
    assert b.block_ids == [0, 1, 3] and num_new == 4
    assert b.num_cached_tokens == 8
    (seq,) = step_to_proto(step, 1).new_sequences
    assert seq.num_computed_tokens == 8 and seq.num_new_tokens == 4
    assert [list(t.block_ids) for t in seq.block_tables] == [[0, 1, 3]]
    (result,) = finish_step(sched, step)
    assert output_to_proto(Output.sampled(result.request, *result.samples)).cached_tokens == 8
    assert (sched.stats.num_prefix_query_tokens, sched.stats.num_prefix_hit_tokens) == (22, 8)


def test_blocks_join_the_cache_only_once_the_step_that_computed_them_returned():
    sched = make_scheduler()
    sched.add(make_request("a", SHARED[:6], max_tokens=8))
    run_step(sched)
    assert sched.kv.pool.num_cached == 1  # 6 tokens: one full block
    run_step(sched)  # computes token 7 of 8
    step = sched.schedule()  # computes token 8: the second block fills...
    sched.add(make_request("b", SHARED[:6] + [7, 7, 1]))
    assert sched.kv.pool.num_cached == 1  # ...but its KV is being written right now
    finish_step(sched, step)
    assert sched.kv.pool.num_cached == 2
    (new,) = sched.schedule().new
    assert new.request.num_cached_tokens == 8  # the blocks hold a's prompt and its sampled tokens


def test_a_fully_cached_prompt_recomputes_its_last_block_in_a_fresh_one():
    sched = make_scheduler()
    sched.add(make_request("a", SHARED, max_tokens=1))
    run_step(sched)
    cached = sched.kv.cached_hashes()
    sched.add(make_request("b", SHARED))
    step = sched.schedule()
    (new,) = step.new
    b, num_new = new.request, new.num_new
    assert b.block_ids == [0, 2] and num_new == 4  # block 1 (shared) is never written
    assert b.num_cached_tokens == 4
    finish_step(sched, step)
    assert sched.kv.cached_hashes() == cached and sched.kv.pool.cached_block(cached[1]) == 1


def test_different_models_never_share_blocks():
    pool = BlockPool(8)
    model_a = KVCacheManager(pool, 4, "model-a")
    model_b = KVCacheManager(pool, 4, "model-b")
    a = make_request("a", SHARED + [1])
    model_a.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    model_a.cache_computed(a)
    assert model_a.find_cached_prefix(make_request("x", SHARED + [1])) == [[0, 1]]
    assert model_b.find_cached_prefix(make_request("y", SHARED + [1])) == [[]]
    assert block_hashes(SHARED, 4, "model-a") != block_hashes(SHARED, 4, "model-b")


def test_store_and_evict_events_name_the_blocks_hashes():
    events = RecordingListener()
    sched = make_scheduler(num_blocks=3, listener=events)
    sched.add(make_request("a", SHARED + [1], max_tokens=1))
    run_step(sched)
    hashes = block_hashes(SHARED, 4, "model-a")
    assert events.events == [("stored", hashes)]
    assert sched.kv.cached_hashes() == hashes
    sched.add(make_request("b", list(range(50, 59)), max_tokens=1))  # needs all 3 blocks
    run_step(sched)
    assert events.events[1] == ("removed", [hashes[1], hashes[0]])
    assert events.events[2][0] == "stored" and len(events.events[2][1]) == 2


def test_a_preempted_request_resumes_from_its_own_cached_blocks():
    sched = make_scheduler(num_blocks=4)
    sched.add(make_request("old", list(range(10, 18)), max_tokens=6))
    sched.add(make_request("new", list(range(30, 38)), max_tokens=6))
    run_step(sched)  # both prefilled, 2 blocks each, all 4 cached
    step = run_step(sched)  # both need a third block: "new" yields
    new = sched.requests["new"]
    assert step.finished_ids == ["new"] and new.status is Status.WAITING
    assert sched.requests["old"].block_ids == [0, 1, 3]  # new's tail block was evicted first
    sched.abort("old")
    step = sched.schedule()
    (resumed,) = step.new
    num_new = resumed.num_new
    assert resumed.request is new and new.block_ids == [2, 3, 1]
    assert num_new == 5 and new.num_computed_tokens == 9  # 4 tokens came from the cache
    assert new.num_cached_tokens == 0  # at its first start nothing was cached
    finish_step(sched, step)
    run_until_idle(sched)
    assert sched.kv.pool.num_free == 4


def test_every_block_comes_back_after_aborts_mid_prefill_and_preemptions():
    sched = make_scheduler(num_blocks=12, budget=10, max_seqs=4)
    for i in range(12):
        prompt = SHARED[: 4 + i % 5] + list(range(200 + i, 203 + i))  # overlapping prefixes
        sched.add(make_request(f"r{i}", prompt, max_tokens=6 + i % 7))
    aborted = 0
    for i in range(40):
        step = sched.schedule()
        finish_step(sched, step)
        if i % 6 == 2:  # abort whatever is mid-prefill now
            partial = [r for r in sched.running if r.num_computed_tokens < r.num_prompt_tokens]
            for request in partial:
                sched.abort(request.request_id)
                aborted += 1
    run_until_idle(sched)
    pool = sched.kv.pool
    assert aborted > 0 and sched.stats.num_preemptions > 0 and sched.stats.num_prefix_hit_tokens > 0
    assert pool.num_free == 12
    assert all(pool.ref_count(b) == 0 for b in range(12))


def test_an_aborted_request_leaves_its_blocks_uncached_when_the_step_returns():
    sched = make_scheduler()
    sched.add(make_request("a", SHARED + [1]))
    step = sched.schedule()
    sched.abort("a")  # while the worker computes
    finish_step(sched, step)
    assert sched.kv.pool.num_cached == 0 and sched.kv.pool.num_free == 8


def test_caching_off_never_reuses_blocks():
    sched = make_scheduler(enable_prefix_caching=False)
    sched.add(make_request("a", SHARED + [1], max_tokens=1))
    run_step(sched)
    sched.add(make_request("b", SHARED + [1], max_tokens=1))
    (new,) = sched.schedule().new
    assert new.num_new == 9 and new.request.num_cached_tokens == 0
    assert sched.kv.pool.num_cached == 0 and sched.stats.num_prefix_query_tokens == 0
    (update,) = sched.update([Sample("b", 7)])
    assert update.request.finish_reason is FinishReason.LENGTH


def test_a_failed_worker_takes_its_cache_along():
    events = RecordingListener()
    sched = make_scheduler(listener=events)
    sched.add(make_request("a", SHARED + [1]))
    run_step(sched)
    failed = sched.fail_all()
    assert [r.request_id for r in failed] == ["a"]
    assert events.events[-1] == ("removed", block_hashes(SHARED, 4, "model-a"))
    assert sched.kv.cached_hashes() == [] and sched.kv.pool.num_free == 8
