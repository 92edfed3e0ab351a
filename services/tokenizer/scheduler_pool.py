"""Every scheduler replica this tokenizer sends requests to (`--scheduler A,B,C` or a
dns:/// name): one session stream per replica, requests routed across them by the KV cache
each replica's workers hold and by load (scheduler_choice.py), and each request's replica
remembered so that an abort finds it. A refresh every `refresh_s` follows the replicas
(a dns:/// name is resolved again), their models and their workers' load."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from layerserve.scheduler.v1 import scheduler_pb2
from services.common.block_hash import BlockHash, block_hashes
from services.common.errors import Unavailable
from services.common.recent_routes import RecentRoutes
from services.tokenizer.model_catalog import StackView
from services.tokenizer.prefix_lookup import PrefixLookup
from services.tokenizer.scheduler_addresses import parse_schedulers, resolve_schedulers
from services.tokenizer.scheduler_choice import (
    SchedulerCandidate,
    WorkerCandidate,
    pick_scheduler,
)
from services.tokenizer.scheduler_link import SchedulerLink
from services.tokenizer.stack_view_proto import merge_views

log = logging.getLogger(__name__)

# Where a prefix was sent moments ago is remembered in blocks of this many tokens (the
# schedulers' own block size is used for their index when they report it).
RECENT_BLOCK_TOKENS = 16


class SchedulerPool:
    def __init__(
        self, spec: str, refresh_s: float = 0.5, prefix: PrefixLookup | None = None
    ) -> None:
        self._entries = parse_schedulers(spec)
        self.spec = spec
        self._refresh_s = refresh_s
        self._prefix = prefix
        self.links: dict[str, SchedulerLink] = {}
        self._owner: dict[str, SchedulerLink] = {}  # request id -> the replica running it
        self._sent: dict[str, int] = {}  # address -> requests sent since its last report
        self._recent = RecentRoutes(horizon_s=10.0)
        self._turn = 0
        self._task: asyncio.Task[None] | None = None
        if not self._entries[0].startswith("dns:"):
            for address in self._entries:
                self.links[address] = SchedulerLink(address)

    def start(self) -> None:
        for link in self.links.values():
            link.start()
        self._task = asyncio.get_running_loop().create_task(self._keep_refreshed())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(link.close() for link in self.links.values()))
        if self._prefix is not None:
            await self._prefix.close()

    def readiness(self) -> str | None:
        """None while at least one replica serves; else why none does."""
        if any(link.health.serving for link in self.links.values()):
            return None
        if not self.links:
            return f"no scheduler replica found at {self.spec}"
        return "; ".join(link.health.reason for link in self.links.values())

    # -- what the replicas serve -----------------------------------------------------------

    async def fetch_view(self) -> StackView:
        """Every model and alias the replicas serve together (the catalog's fetch). Raises
        Unavailable when no replica answers."""
        links = list(self.links.values())
        results = await asyncio.gather(
            *(link.fetch_view() for link in links), return_exceptions=True
        )
        views = [r for r in results if isinstance(r, StackView)]
        if not views:
            raise Unavailable(f"no scheduler replica answers ({self.spec})")
        return merge_views(views)

    async def _keep_refreshed(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self._follow_replicas()
            await asyncio.gather(
                *(self._refresh(link) for link in list(self.links.values())),
                return_exceptions=True,
            )
            self._recent.expire()
            await asyncio.sleep(self._refresh_s)

    async def _refresh(self, link: SchedulerLink) -> None:
        await asyncio.gather(link.fetch_view(), link.fetch_load())
        self._sent[link.address] = 0

    async def _follow_replicas(self) -> None:
        """A dns:/// name's replicas as it resolves now: new ones get a link; a link to one
        gone is kept while requests run on it (its stream ends with it)."""
        if not self._entries[0].startswith("dns:"):
            return
        found = await resolve_schedulers(self._entries)
        for address in found:
            if address not in self.links:
                log.info("scheduler replica %s appeared", address)
                link = self.links[address] = SchedulerLink(address)
                link.start()
        for address in [a for a in self.links if a not in found]:
            link = self.links[address]
            if not link.requests:
                log.info("scheduler replica %s is gone", address)
                del self.links[address]
                await link.close()

    # -- requests --------------------------------------------------------------------------

    async def choose(
        self, model: str, prompt: list[int], avoid: frozenset[str] = frozenset()
    ) -> SchedulerLink:
        """The replica to run a request on (see scheduler_choice.py). Raises Unavailable
        when no replica (outside `avoid`) is there to ask."""
        allowed = [link for link in self.links.values() if link.address not in avoid]
        links = [link for link in allowed if link.serves(model)]
        if not links:
            # What each serves is refreshed every refresh_s: a worker just added may not show
            # yet. A replica that is up answers for the model itself (NotFound, Unavailable);
            # a lone replica is always asked, as it was before there were several.
            links = [link for link in allowed if link.health.serving or len(self.links) == 1]
            if not links:
                raise Unavailable(f"no scheduler replica serves model `{model}` right now")
            return links[0]
        if len(links) == 1:
            return links[0]
        recent = block_hashes(prompt, RECENT_BLOCK_TOKENS, model)
        cached = await self._cached_blocks(links, model, prompt)
        candidates = [self._candidate(link, model, recent, cached) for link in links]
        self._turn += 1
        chosen = links[pick_scheduler(candidates, len(prompt), self._turn)]
        self._recent.record(chosen.address, recent)
        return chosen

    def _candidate(
        self,
        link: SchedulerLink,
        model: str,
        recent: list[BlockHash],
        cached: dict[str, int],
    ) -> SchedulerCandidate:
        workers = tuple(
            WorkerCandidate(
                running=w.running + w.waiting,
                free_blocks=w.free_blocks,
                block_size=w.block_size,
                cached_blocks=cached.get(w.key, 0),
            )
            for w in link.workers
            if w.model == model
        )
        return SchedulerCandidate(
            workers=workers,
            sent_since_report=self._sent.get(link.address, 0),
            recent_blocks=self._recent.prefix_blocks(link.address, recent),
            recent_block_size=RECENT_BLOCK_TOKENS,
        )

    async def _cached_blocks(
        self, links: list[SchedulerLink], model: str, prompt: list[int]
    ) -> dict[str, int]:
        """Per worker key, the leading blocks of the prompt its cache holds (Redis index)."""
        workers = [w for link in links for w in link.workers if w.model == model and w.block_size]
        if self._prefix is None or not workers:
            return {}
        # Replicas of one model share its weights: one geometry hashes for all.
        hashes = block_hashes(prompt, workers[0].block_size, workers[0].fingerprint)
        return await self._prefix.cached_blocks([w.key for w in workers], hashes)

    def submit(
        self,
        link: SchedulerLink,
        submit: scheduler_pb2.Submit,
        sink: Callable[[object], None],
    ) -> None:
        request_id = submit.request_id
        self._owner[request_id] = link
        link.requests.add(request_id)
        self._sent[link.address] = self._sent.get(link.address, 0) + 1
        link.mux.submit(request_id, submit, sink)

    def ended(self, request_id: str) -> None:
        """The request ended (its last output, an error, or a move to another replica)."""
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.requests.discard(request_id)

    def has_other(self, tried: set[str]) -> bool:
        """Whether some replica is not among `tried` (addresses)."""
        return any(address not in tried for address in self.links)

    def owns(self, request_id: str, link: SchedulerLink) -> bool:
        """Whether the request is still open and was last sent to `link`."""
        return self._owner.get(request_id) is link

    def abort(self, request_id: str) -> None:
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.requests.discard(request_id)
            link.mux.abort(request_id)
