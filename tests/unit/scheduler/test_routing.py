"""Which replica a request goes to: its cached prefix, weighed against load."""

from __future__ import annotations

import pytest

from services.common.errors import NotFound, Unavailable
from services.common.max_tokens import MaxTokens
from services.scheduler.engine import Engine
from services.scheduler.routing import RoutingMode
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.submission import Submission
from tests.unit.scheduler.drive import make_request
from tests.unit.scheduler.replicas import drain, routed_cluster, serve, submit

SYSTEM = list(range(100, 356))  # 256 tokens: 64 blocks of 4


def test_a_cached_prefix_draws_the_request_to_its_replica():
    router, _ = routed_cluster(["a:1", "b:1"])
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1, 2, 3])  # b alone computed the system prompt
    for i in range(4):
        engine = submit(router, f"r{i}", SYSTEM + [10 + i, 20 + i])
        assert engine is b
        drain(b)
    assert a.scheduler.stats.num_steps == 0
    # The user sees it: the scheduler served the shared prefix from the cache.
    assert b.scheduler.stats.num_prefix_hit_tokens >= 4 * len(SYSTEM)


def test_load_breaks_ties_between_replicas_without_the_prefix():
    router, _ = routed_cluster(["a:1", "b:1"])
    a, b = router.engines
    a.scheduler.add(make_request("busy", list(range(500, 540)), max_tokens=4))
    assert submit(router, "new", list(range(900, 940))) is b
    # Both idle and nothing cached: new prefixes alternate rather than pile onto one replica.
    router2, _ = routed_cluster(["a:1", "b:1"])
    picked = {submit(router2, f"n{i}", [7000 + 40 * i + j for j in range(40)]) for i in range(2)}
    assert len(picked) == 2


def test_a_small_prefix_advantage_loses_to_load_a_large_one_does_not():
    router, _ = routed_cluster(["a:1", "b:1"])
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1])
    b.scheduler.add(make_request("queued", list(range(2000, 2100)), max_tokens=4))  # 100 tokens
    # Shares one block (4 tokens) with b's cache: not worth waiting behind 100 tokens.
    small = SYSTEM[:4] + list(range(3000, 3100))
    assert submit(router, "small", small) is a
    router.abort("small")
    # Shares 256 of 260 tokens: b gets through its queue and this prompt sooner than a can
    # compute the whole prompt.
    big = SYSTEM + list(range(4000, 4004))
    assert submit(router, "big", big) is b


def test_a_hot_replica_sheds_requests_of_its_prefix():
    router, _ = routed_cluster(["a:1", "b:1"])
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1])
    picks = [submit(router, f"r{i}", SYSTEM + [50 + i] * 40) for i in range(12)]
    # Nothing runs meanwhile: each request's uncached 40 tokens queue on b until a, computing
    # the whole 296-token prompt, is the sooner place.
    assert picks[0] is b
    assert a in picks


def test_a_replica_that_is_not_ready_is_never_picked():
    router, _ = routed_cluster(["a:1", "b:1"])
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1])
    b.scheduler.fail_all()
    b.scheduler = None  # what Engine._fail_all leaves while the worker is unreachable
    assert not b.ready
    assert all(submit(router, f"r{i}", SYSTEM + [i]) is a for i in range(5))
    a.scheduler = None
    with pytest.raises(Unavailable):
        submit(router, "none", SYSTEM)


def test_a_model_is_unknown_only_once_every_worker_has_said_what_it_serves():
    """At start-up the scheduler knows its workers' addresses before they have loaded: a
    request then gets 503 Unavailable (retry), not 404, for a model one of them may serve."""
    router, _ = routed_cluster(["a:1"])
    loading = Engine("b:1", SchedulerLimits(), emit=lambda outputs: None)  # no WorkerInfo yet
    router.add_engine(loading)
    other = Submission("early", "other-model", [1, 2, 3], max_tokens=MaxTokens(2))
    with pytest.raises(Unavailable, match="still starting"):
        router.submit(other)
    assert submit(router, "served", [1, 2, 3]) is router.engines[0]  # a's model runs meanwhile
    router.remove_engine("b:1")
    with pytest.raises(NotFound, match="does not exist"):
        router.submit(other)


def test_round_robin_and_load_modes_ignore_the_cache():
    router, _ = routed_cluster(["a:1", "b:1"], mode=RoutingMode.ROUND_ROBIN)
    picks = [submit(router, f"r{i}", SYSTEM + [i]) for i in range(4)]
    assert picks[0] is not picks[1] and picks[0] is picks[2] and picks[1] is picks[3]
    router, _ = routed_cluster(["a:1", "b:1"], mode=RoutingMode.LOAD)
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1])
    a.scheduler.add(make_request("q", [5, 6], max_tokens=1))
    b.scheduler.add(make_request("q1", [5, 6], max_tokens=1))
    b.scheduler.add(make_request("q2", [5, 6], max_tokens=1))
    assert submit(router, "r", SYSTEM + [9]) is a
