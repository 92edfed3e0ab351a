"""Which replica of a model gets a request: the one that holds the longest cached prefix of
it, weighed against how busy each replica is (or plain load, or round-robin, as baselines).
Pure: it reads each replica's WorkerLoad snapshot and the prefix index, never a Scheduler."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from services.common.block_hash import BlockHash
from services.common.recent_routes import RecentRoutes
from services.scheduler.prefix_index import PrefixIndex, WorkerKey
from services.scheduler.worker_load import WorkerLoad

# What one running request costs its replica, in prompt tokens: each decode step of a larger
# batch takes longer, so a replica with many running requests is slower to reach a new one.
RUNNING_REQUEST_TOKENS = 16


class RoutingMode(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LOAD = "load"
    PREFIX = "prefix"


@dataclass(frozen=True, slots=True)
class Replica:
    """One ready replica as the router sees it at this instant."""

    key: WorkerKey
    block_size: int
    load: WorkerLoad


@dataclass(frozen=True, slots=True)
class Choice:
    index: int  # into the replicas given to pick()
    cached_blocks: int  # leading blocks of the request the chosen replica holds (or will soon)
    cached_tokens: int  # the prompt tokens those blocks hold: the prefix expected cached


def cost(replica: Replica, num_prompt_tokens: int, cached_blocks: int) -> int:
    # The rule: send the request where its prefill would finish soonest, counted in tokens of
    # work: the prompt tokens the replica must still compute (a cached prefix is free) plus the
    # work already queued there (uncomputed tokens, and a fixed toll per running request). So a
    # 1,000-token system prompt sticks to the replica caching it until that replica has about
    # 1,000 tokens more queued than another: a hot replica sheds load rather than taking every
    # request of a popular prefix, and a small prefix advantage loses to a real load difference.
    # A replica whose free KV blocks cannot hold the uncached part would leave the request
    # waiting (or evict cached prefixes to fit it), so it pays the whole prompt once more.
    # Queued requests not started yet count as their expected uncached part (WorkerLoad): one
    # whose prefix is cached there must not count as its whole prompt, or a replica would look
    # busiest exactly where it is cheapest.
    load = replica.load
    cached_tokens = min(cached_blocks * replica.block_size, num_prompt_tokens)
    uncached = num_prompt_tokens - cached_tokens
    needed_blocks = -(-uncached // replica.block_size)
    kv_short = num_prompt_tokens if needed_blocks > load.free_blocks else 0
    queued = load.pending_tokens + RUNNING_REQUEST_TOKENS * load.num_running
    return uncached + queued + kv_short


class ReplicaPicker:
    """Picks among ready replicas. `view` returns the current prefix index (the Redis-fed one,
    or the in-process one when Redis is absent or down); it is only read, never awaited."""

    def __init__(
        self,
        mode: RoutingMode = RoutingMode.PREFIX,
        view: Callable[[], PrefixIndex] | None = None,
        recent: RecentRoutes | None = None,
    ) -> None:
        self.mode = mode
        self._view = view
        self.recent = recent if recent is not None else RecentRoutes()
        self._turn = 0  # rotates among equals, so idle replicas share new prefixes

    @property
    def wants_hashes(self) -> bool:
        return self.mode is RoutingMode.PREFIX

    def pick(
        self, replicas: list[Replica], hashes: list[BlockHash], num_prompt_tokens: int
    ) -> Choice:
        assert replicas, "pick among no replicas"
        self._turn += 1
        self.recent.expire()
        n = len(replicas)
        if self.mode is RoutingMode.ROUND_ROBIN:
            return Choice(self._turn % n, 0, 0)
        cached = self._cached_blocks([r.key for r in replicas], hashes)

        def rank(i: int) -> tuple[int, int, int]:
            r = replicas[i]
            work = cost(r, num_prompt_tokens, cached[i])
            return (work, r.load.num_requests, (i - self._turn) % n)

        best = min(range(n), key=rank)
        chosen = replicas[best]
        if hashes:
            self.recent.record(chosen.key, hashes)
        cached_tokens = min(cached[best] * chosen.block_size, num_prompt_tokens)
        return Choice(best, cached[best], cached_tokens)

    def _cached_blocks(self, keys: list[WorkerKey], hashes: list[BlockHash]) -> list[int]:
        """Each replica's cached prefix of the request, in blocks: what its cache reports, or
        what was routed to it moments ago, whichever is longer."""
        if not hashes or self._view is None:
            return [0] * len(keys)
        reported = self._view().prefix_blocks(hashes)
        return [max(reported.get(k, 0), self.recent.prefix_blocks(k, hashes)) for k in keys]
