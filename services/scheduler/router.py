"""Which worker runs a request: by model, then the ready replica that would finish its prefill
soonest (see routing.py: cached prefix against load). Also which workers exist at all: the
start-up ones plus those the Admin API adds, some of them draining
(taking no new requests while their running ones finish)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.common.sampling import SamplingOptions
from services.scheduler.admission import ModelLimits, admit
from services.scheduler.block_hash import BlockHash, block_hashes
from services.scheduler.kv_cache_manager import group_windows
from services.scheduler.prefix_index import worker_key
from services.scheduler.request_trace import RequestTrace
from services.scheduler.routing import Replica, ReplicaPicker
from services.scheduler.worker_link import WorkerLink


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    max_model_len: int
    path: str  # WorkerInfo.model_path; "" = the embedded default model
    replicas: int  # ready, not draining


class Router:
    def __init__(self, links: list[WorkerLink]) -> None:
        # Every worker, in the order added. The caller may still append start-up links to
        # this very list after construction (they need the servicer that needs the router).
        self._all = links
        self._draining: set[str] = set()  # addresses
        self._owner: dict[str, WorkerLink] = {}
        # Models whose workers were all removed: requests for them are UNAVAILABLE (a worker
        # may register again, e.g. a Kubernetes pod replaced), not an unknown model's NOT_FOUND.
        self._departed: set[str] = set()
        self.picker = ReplicaPicker()  # __main__ sets the --routing mode and the prefix index

    @property
    def links(self) -> list[WorkerLink]:
        """The links that take new requests: every worker not draining (what _pick picks from)."""
        if not self._draining:
            return self._all
        return [link for link in self._all if link.address not in self._draining]

    @property
    def all_links(self) -> list[WorkerLink]:
        """Every worker, draining ones included, in the order added."""
        return list(self._all)

    def models(self) -> list[ServedModel]:
        """Models with at least one ready worker that takes new requests, sorted by name."""
        served: dict[str, ServedModel] = {}
        for link in self.links:
            info = link.info
            if not link.ready or info is None:
                continue
            seen = served.get(info.model)
            replicas = seen.replicas + 1 if seen else 1
            served[info.model] = ServedModel(
                info.model, info.max_model_len, info.model_path, replicas
            )
        return [served[name] for name in sorted(served)]

    def model_names(self) -> set[str]:
        """Every model a known worker has reported, ready or not, draining or not."""
        return {link.info.model for link in self._all if link.info is not None}

    # -- workers in and out (Admin API) ----------------------------------------------------

    def link(self, address: str) -> WorkerLink:
        for link in self._all:
            if link.address == address:
                return link
        raise NotFound(f"no worker at `{address}`", param="address")

    def has_link(self, address: str) -> bool:
        return any(link.address == address for link in self._all)

    def add_link(self, link: WorkerLink) -> None:
        if self.has_link(link.address):
            raise InvalidArgument(f"the worker at `{link.address}` is already added")
        self._all.append(link)

    def drain(self, address: str) -> WorkerLink:
        link = self.link(address)
        self._draining.add(address)
        return link

    def is_draining(self, address: str) -> bool:
        return address in self._draining

    def remove_link(self, address: str) -> WorkerLink:
        """Forgets a worker; its requests stay owned until finished or ended (see in_flight)."""
        link = self.link(address)
        self._all.remove(link)
        self._draining.discard(address)
        if link.info is not None and link.info.model not in self.model_names():
            self._departed.add(link.info.model)
        return link

    def in_flight(self, link: WorkerLink) -> list[str]:
        """Ids of the requests routed to `link` that have not finished."""
        return [request_id for request_id, owner in self._owner.items() if owner is link]

    # -- requests ---------------------------------------------------------------------------

    def submit(self, msg: scheduler_pb2.Submit, trace: RequestTrace | None = None) -> None:
        """Routes and queues a request. Raises NotFound, Unavailable or InvalidArgument.
        trace: the request's spans (request_trace.py), None when not traced."""
        if self._only_draining(msg.model):
            raise Unavailable(f"every worker of model `{msg.model}` is draining; retry shortly")
        link, hashes = self._pick(msg.model, msg.request_id, msg.prompt_token_ids)
        info = link.info
        assert info is not None
        limits = ModelLimits(
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            block_size=info.block_size,
            num_blocks=info.num_blocks,
            eos_token_ids=frozenset(info.eos_token_ids),
            windows=group_windows(g.sliding_window for g in info.kv_cache_groups),
            max_chunk=link.limits.max_num_batched_tokens,
        )
        request = admit(
            request_id=msg.request_id,
            prompt_token_ids=list(msg.prompt_token_ids),
            max_tokens=msg.max_tokens,
            sampling=SamplingOptions.from_proto(msg.sampling),
            stop_token_ids=list(msg.stop_token_ids),
            ignore_eos=msg.ignore_eos,
            priority=msg.priority,
            trace_context=dict(msg.trace.carrier),
            limits=limits,
            tenant=msg.tenant,
        )
        request.block_hashes = hashes  # computed once for routing; the scheduler reuses them
        request.trace = trace
        link.submit(request)  # first: a full queue raises, and then the link owns nothing
        self._owner[request.request_id] = link

    def abort(self, request_id: str) -> None:
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.abort(request_id)

    def forget(self, request_id: str) -> None:
        """The request finished; it no longer needs routing."""
        self._owner.pop(request_id, None)

    def _only_draining(self, model: str) -> bool:
        """The model has workers, but every one of them is draining."""
        if not self._draining:
            return False
        mine = [link for link in self._all if link.info is not None and link.info.model == model]
        return bool(mine) and all(link.address in self._draining for link in mine)

    def _pick(
        self, model: str, request_id: str, prompt: Sequence[int]
    ) -> tuple[WorkerLink, list[BlockHash]]:
        """The ready replica to run the request (see routing.cost), and the prompt's block
        hashes when the routing mode uses them (empty otherwise)."""
        replicas = [
            link for link in self.links if link.info is not None and link.info.model == model
        ]
        if not replicas and model in self._departed:
            raise Unavailable(
                f"no worker serves model `{model}` right now (the last one left); retry shortly"
            )
        if not replicas:
            raise NotFound(f"The model `{model}` does not exist.", param="model")
        ready = [link for link in replicas if link.ready]
        if not ready:
            raise Unavailable(f"no worker for model `{model}` is ready; retry shortly")
        hashes: list[BlockHash] = []
        info = ready[0].info
        if self.picker.wants_hashes and info is not None:
            # All replicas of a model share its weights, so one fingerprint hashes for all.
            hashes = block_hashes(list(prompt), info.block_size, info.model_fingerprint)
        states = [self._replica_state(link) for link in ready]
        choice = self.picker.pick(request_id, states, hashes, len(prompt))
        return ready[choice.index], hashes

    def _replica_state(self, link: WorkerLink) -> Replica:
        s, info = link.scheduler, link.info
        assert s is not None and info is not None
        key = worker_key(info.model, link.address)
        return Replica(
            key=key,
            pending_tokens=self.picker.expected.pending_tokens(key, s),
            num_running=len(s.running),
            num_requests=len(s.requests),
            free_blocks=s.kv.pool.num_free,
            block_size=info.block_size,
        )
