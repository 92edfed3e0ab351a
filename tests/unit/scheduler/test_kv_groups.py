"""KV cache groups on the scheduler side: a sliding-window group returns the blocks its window
has passed to the shared pool, the worker is told every group's blocks, the prefix cache serves
each group what it reads, and admission counts what a request can really hold. Blocks of 4
tokens; the sliding group's window is 8 tokens unless said otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from layerserve.worker.v1 import worker_pb2
from services.common.block_hash import block_hashes
from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.common.sampling_proto import sampling_to_proto
from services.scheduler.admission import ModelLimits, admit
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager, group_windows, token_capacity
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.worker_link import step_to_proto
from tests.unit.scheduler.drive import (
    EOS,
    RecordingListener,
    finish_step,
    make_request,
    make_scheduler,
    run_step,
    run_until_idle,
)
from tests.unit.scheduler.replicas import routed_cluster, submit

WINDOWED = (None, 8)  # group 0: full attention; group 1: a window of 8 tokens
PROMPT = list(range(100, 124))  # six full blocks, three windows


def sliding_held(request) -> int:
    return sum(block != -1 for block in request.block_tables[1])


def sliding_cap(window: int, chunk: int, block_size: int = 4) -> int:
    """The most blocks a sliding group holds for one request (admission's bound): those of a
    window plus a chunk, one more where the window starts mid-block."""
    return -(-(window - 1 + chunk) // block_size) + 1


# -- blocks freed as the window moves -------------------------------------------------------


def test_a_long_generation_holds_a_bounded_window_of_sliding_blocks():
    sched = make_scheduler(num_blocks=32, budget=4, windows=WINDOWED)
    request = make_request("a", list(range(100, 110)), max_tokens=30)
    sched.add(request)
    most_held = 0
    while len(request.output_token_ids) < 29:
        run_step(sched)
        most_held = max(most_held, sliding_held(request))
    step = sched.schedule()  # computes token 38, whose query reads keys 31..38: blocks 7..9
    full, sliding = request.block_tables
    assert len(full) == len(sliding) == 10 and -1 not in full
    assert sliding[:7] == [-1] * 7 and -1 not in sliding[7:]
    assert sched.kv.pool.num_free == 32 - 10 - 3
    assert most_held <= sliding_cap(window=8, chunk=4)
    finish_step(sched, step)
    run_until_idle(sched)
    assert request.output_token_ids == [7] * 30
    assert sched.kv.pool.num_free == 32


def test_aborting_a_request_past_its_window_returns_every_block():
    sched = make_scheduler(num_blocks=32, windows=WINDOWED)
    request = make_request("a", PROMPT, max_tokens=20)
    sched.add(request)
    for _ in range(10):
        run_step(sched)
    assert request.block_tables[1][:6] == [-1] * 6  # at 33 tokens: blocks 0..5 dropped
    sched.abort("a")
    assert sched.kv.pool.num_free == 32
    assert all(sched.kv.pool.ref_count(b) == 0 for b in range(32))


def test_a_preempted_request_past_its_window_returns_every_block_and_resumes():
    sched = make_scheduler(num_blocks=12, budget=8, windows=WINDOWED, enable_prefix_caching=False)
    old = make_request("old", list(range(10, 18)), max_tokens=20)
    new = make_request("new", list(range(40, 48)), max_tokens=20)
    sched.add(old)
    sched.add(new)
    for _ in range(5):
        run_step(sched)
    assert old.block_tables == [[0, 1, 4], [-1, 3, 5]]  # block 2 went back to the pool
    assert sched.kv.pool.num_free == 1
    step = sched.schedule()  # old's 13th token needs a block per group: new yields its six
    assert step.finished_ids == ["new"] and sched.stats.num_preemptions == 1
    assert old.block_tables == [[0, 1, 4, 2], [-1, 3, 5, 10]]
    finish_step(sched, step)
    run_until_idle(sched)
    assert len(old.output_token_ids) == len(new.output_token_ids) == 20
    assert sched.kv.pool.num_free == 12


# -- what the worker is told ----------------------------------------------------------------


def test_step_messages_carry_every_groups_blocks_with_dropped_ones_as_minus_one():
    sched = make_scheduler(num_blocks=32, windows=WINDOWED)
    sched.add(make_request("a", PROMPT[:10], max_tokens=12))
    step = sched.schedule()
    (seq,) = step_to_proto(step, 1).new_sequences
    assert [list(t.block_ids) for t in seq.block_tables] == [[0, 1, 2], [3, 4, 5]]
    finish_step(sched, step)
    step = sched.schedule()  # token 11 fits in block 2: nothing appended, one entry per group
    (running,) = step_to_proto(step, 2).running
    assert [list(t.block_ids) for t in running.new_block_tables] == [[], []]
    finish_step(sched, step)
    run_step(sched)
    step = sched.schedule()  # token 13 opens block 3; the query at 12 reads 5..12: block 0 goes
    (running,) = step_to_proto(step, 4).running
    assert [list(t.block_ids) for t in running.new_block_tables] == [[6], [7]]
    assert sched.requests["a"].block_tables == [[0, 1, 2, 6], [-1, 4, 5, 7]]


def test_one_group_sends_one_table_per_sequence():
    sched = make_scheduler(num_blocks=32)
    sched.add(make_request("a", PROMPT[:10], max_tokens=12))
    step = sched.schedule()
    msg = step_to_proto(step, 1)
    expected = worker_pb2.StepRequest(step_id=1)
    expected.new_sequences.add(
        request_id="a",
        token_ids=PROMPT[:10],
        num_prompt_tokens=10,
        num_new_tokens=10,
        block_tables=[worker_pb2.BlockTable(block_ids=[0, 1, 2])],
        sampling=sampling_to_proto(SamplingOptions()),
    ).trace.SetInParent()
    assert msg.SerializeToString() == expected.SerializeToString()
    finish_step(sched, step)
    for _ in range(2):
        run_step(sched)
    expected = worker_pb2.StepRequest(step_id=4)
    expected.running.add(
        request_id="a", num_new_tokens=1, new_block_tables=[worker_pb2.BlockTable(block_ids=[3])]
    )
    assert step_to_proto(sched.schedule(), 4).SerializeToString() == expected.SerializeToString()


# -- the prefix cache ------------------------------------------------------------------------


def test_a_shared_prefix_longer_than_the_window_reuses_only_the_sliding_blocks_it_reads():
    sched = make_scheduler(num_blocks=16, windows=WINDOWED)
    sched.add(make_request("a", PROMPT, max_tokens=1))
    run_step(sched)  # a computes blocks 0..5 in both groups and ends: all cached
    assert sched.kv.pool.num_free == 16
    sched.add(make_request("b", PROMPT + [1, 3, 5, 7]))
    step = sched.schedule()
    (new,) = step.new
    b, num_new = new.request, new.num_new
    assert num_new == 4 and b.num_cached_tokens == 24
    # Restarting at token 24, the window reaches back to token 17: blocks 4 and 5.
    assert b.block_tables == [[0, 1, 2, 3, 4, 5, 12], [-1, -1, -1, -1, 10, 11, 13]]
    (seq,) = step_to_proto(step, 2).new_sequences
    assert seq.num_computed_tokens == 24
    assert list(seq.block_tables[1].block_ids) == [-1, -1, -1, -1, 10, 11, 13]
    # The sliding blocks before the window stay cached and evictable for other prefixes.
    assert sched.kv.pool.num_free == 16 - 7 - 3
    finish_step(sched, step)
    run_until_idle(sched)
    assert sched.kv.pool.num_free == 16


def test_evicting_the_prefixs_tail_falls_back_to_a_shorter_prefix_with_its_own_window():
    sched = make_scheduler(num_blocks=12, windows=WINDOWED)
    sched.add(make_request("a", PROMPT, max_tokens=1))
    run_step(sched)
    pool = sched.kv.pool
    pool.free(pool.allocate(2))  # another request came and went: the tail, 5 and 11, evicted
    sched.add(make_request("b", PROMPT + [1, 3, 5, 7]))
    (new,) = sched.schedule().new
    assert new.request.num_cached_tokens == 20 and new.num_new == 8
    b = new.request
    # Restarting at token 20 reads from token 13 on: sliding blocks 3 and 4 (ids 9 and 10).
    assert b.block_tables == [[0, 1, 2, 3, 4, 5, 11], [-1, -1, -1, 9, 10, 8, 7]]


def test_a_missing_sliding_block_lowers_the_prefix_to_one_whose_window_is_cached():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, 4, "model-a", WINDOWED)
    hashes = block_hashes(PROMPT, 4, "model-a")
    full, sliding = pool.allocate(6), pool.allocate(6)
    pool.cache(full, hashes, group=0)
    pool.cache(sliding[:5], hashes[:5], group=1)  # block 5 of the sliding group is missing
    pool.free(full + sliding)
    request = make_request("b", PROMPT + [1])
    # Six blocks would need sliding blocks 4 and 5; five blocks need 3 and 4.
    assert kv.find_cached_prefix(request) == [full[:5], [-1, -1, -1, sliding[3], sliding[4]]]
    assert kv.allocate_slots(request, 5, kv.find_cached_prefix(request)) == [[12, 13], [14, 15]]
    assert request.block_tables[1] == [-1, -1, -1, sliding[3], sliding[4], 14, 15]


def test_only_group_zeros_blocks_reach_the_cache_listener():
    events = RecordingListener()
    sched = make_scheduler(num_blocks=12, windows=WINDOWED, listener=events)
    sched.add(make_request("a", PROMPT[:8] + [1], max_tokens=1))
    run_step(sched)
    hashes = block_hashes(PROMPT[:8], 4, "model-a")
    assert events.events == [("stored", hashes)]
    assert sched.kv.cached_hashes() == hashes
    assert sched.kv.pool.num_cached == 4  # both groups cache both blocks
    sched.kv.pool.allocate(12)  # evicts everything
    assert events.events[1] == ("removed", [hashes[1], hashes[0]])
    assert len(events.events) == 2 and sched.kv.cached_hashes() == []


# -- admission --------------------------------------------------------------------------------


def limits(windows, num_blocks=16, max_chunk=4) -> ModelLimits:
    return ModelLimits(
        max_model_len=1000,
        vocab_size=1000,
        block_size=4,
        num_blocks=num_blocks,
        eos_token_ids=frozenset({EOS}),
        windows=windows,
        max_chunk=max_chunk,
    )


def build(prompt_len: int, max_tokens: int, model: ModelLimits):
    return admit(
        request_id="r",
        prompt_token_ids=[5] * prompt_len,
        max_tokens=MaxTokens(max_tokens),
        sampling=SamplingOptions(),
        stop_token_ids=[],
        ignore_eos=True,
        priority=0,
        trace_context={},
        limits=model,
    )


def test_admission_counts_the_blocks_a_sliding_group_gives_back():
    # A request of 48 tokens: 12 blocks of the full group, and at most 4 of the sliding one
    # (a window of 8 plus a chunk of 4 spans 3 blocks, one more where it starts mid-block).
    windowed = limits(WINDOWED)
    assert windowed.kv_capacity == 48
    assert build(40, 8, windowed).max_tokens == 8
    assert build(40, 0, windowed).max_tokens == 8  # unset: what fits
    with pytest.raises(InvalidArgument, match=r"49 tokens exceed this worker's KV cache \(48"):
        build(40, 9, windowed)
    with pytest.raises(InvalidArgument, match="KV cache holds 48 tokens"):
        build(48, 0, windowed)
    # Two full groups share the pool: half of it each. One group: the whole pool, as ever.
    assert limits((None, None)).kv_capacity == 32
    assert limits((None,)).kv_capacity == 64 == limits(group_windows([])).kv_capacity
    with pytest.raises(InvalidArgument, match="KV cache holds 64 tokens"):
        build(64, 0, limits((None,)))


def test_every_group_windowed_leaves_only_the_context_length_as_a_bound():
    assert token_capacity(16, 4, (8, 8), max_chunk=4) > 10**9
    assert token_capacity(7, 4, (8, 8), max_chunk=4) == 12  # 3 blocks per table fit, not 4
    assert build(900, 0, limits((8, 8))).max_tokens == 100


def test_the_router_admits_by_the_workers_kv_cache_groups_and_step_budget():
    router, _ = routed_cluster(["a:1"])  # 256 blocks of 4: 1024 tokens in one group
    (engine,) = router.engines
    engine.info = dataclasses.replace(engine.info, windows=group_windows([0, 8]))
    engine.limits = SchedulerLimits(max_num_batched_tokens=16)
    # The sliding group holds at most 7 blocks (8 + 16 tokens): 249 blocks are left for the
    # full group, 996 tokens.
    submit(router, "fits", list(range(10, 1000)))  # 990 + 2 to generate
    with pytest.raises(InvalidArgument, match="KV cache holds 996 tokens"):
        submit(router, "too-long", list(range(10, 1010)))


@pytest.mark.parametrize("window, chunk", [(8, 4), (8, 8), (12, 4), (5, 4)])
def test_a_request_of_the_admitted_length_runs_alone_to_completion(window, chunk):
    windows = (None, window, window)
    capacity = token_capacity(16, 4, windows, max_chunk=chunk)
    sched = make_scheduler(num_blocks=16, budget=chunk, windows=windows)
    request = make_request("a", list(range(100, 100 + capacity - 8)), max_tokens=8)
    sched.add(request)
    run_until_idle(sched)  # raises if the request can never get its blocks
    assert len(request.output_token_ids) == 8 and sched.stats.num_preemptions == 0
    assert sched.kv.pool.num_free == 16


# -- the scheduler -----------------------------------------------------------------------------


def test_many_requests_past_the_window_finish_under_preemption_without_leaking_blocks():
    sched = make_scheduler(num_blocks=24, budget=8, max_seqs=6, windows=(None, 8, 8))
    requests = []
    for i in range(10):
        prompt = PROMPT[: 6 + 3 * (i % 5)] + list(range(300 + 10 * i, 300 + 10 * i + 4))
        requests.append(make_request(f"r{i}", prompt, max_tokens=12 + i % 4))
        sched.add(requests[-1])
    run_until_idle(sched)
    assert sched.stats.num_preemptions > 0 and sched.stats.num_prefix_hit_tokens > 0
    assert all(len(r.output_token_ids) == r.max_tokens for r in requests)
    assert sched.kv.pool.num_free == 24
    assert all(sched.kv.pool.ref_count(b) == 0 for b in range(24))
