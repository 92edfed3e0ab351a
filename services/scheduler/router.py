"""Which worker runs a request: by model, then the ready replica that would finish its prefill
soonest (see routing.py: cached prefix against load, read from each worker's WorkerLoad).
Also which workers exist at all: the start-up ones plus those the Admin API adds, some of them
draining (taking no new requests while their running ones finish)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.block_hash import BlockHash, block_hashes
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.scheduler.admission import ModelLimits, admit
from services.scheduler.engine import Engine
from services.scheduler.prefix_index import worker_key
from services.scheduler.request import Request
from services.scheduler.routing import Choice, Replica, ReplicaPicker
from services.scheduler.submission import Submission


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    max_model_len: int
    path: str  # WorkerInfo.model_path; "" = the embedded default model
    replicas: int  # ready, not draining


class Router:
    def __init__(self, engines: list[Engine]) -> None:
        # Every worker, in the order added. The caller may still append start-up engines to
        # this very list after construction (they need the servicer that needs the router).
        self._all = engines
        self._draining: set[str] = set()  # addresses
        self._owner: dict[str, Engine] = {}
        # Models whose workers were all removed: requests for them are UNAVAILABLE (a worker
        # may register again, e.g. a Kubernetes pod replaced), not an unknown model's NOT_FOUND.
        self._departed: set[str] = set()
        self.picker = ReplicaPicker()  # __main__ sets the --routing mode and the prefix index

    @property
    def engines(self) -> list[Engine]:
        """The engines that take new requests: every worker not draining (_pick's choice)."""
        if not self._draining:
            return self._all
        return [engine for engine in self._all if engine.address not in self._draining]

    @property
    def all_engines(self) -> list[Engine]:
        """Every worker, draining ones included, in the order added."""
        return list(self._all)

    def models(self) -> list[ServedModel]:
        """Models with at least one ready worker that takes new requests, sorted by name."""
        served: dict[str, ServedModel] = {}
        for engine in self.engines:
            info = engine.info
            if not engine.ready or info is None:
                continue
            seen = served.get(info.model)
            replicas = seen.replicas + 1 if seen else 1
            served[info.model] = ServedModel(
                info.model, info.max_model_len, info.model_path, replicas
            )
        return [served[name] for name in sorted(served)]

    def model_names(self) -> set[str]:
        """Every model a known worker has reported, ready or not, draining or not."""
        return {engine.info.model for engine in self._all if engine.info is not None}

    # -- workers in and out (Admin API) ----------------------------------------------------

    def engine(self, address: str) -> Engine:
        for engine in self._all:
            if engine.address == address:
                return engine
        raise NotFound(f"no worker at `{address}`", param="address")

    def has_engine(self, address: str) -> bool:
        return any(engine.address == address for engine in self._all)

    def add_engine(self, engine: Engine) -> None:
        if self.has_engine(engine.address):
            raise InvalidArgument(f"the worker at `{engine.address}` is already added")
        self._all.append(engine)

    def drain(self, address: str) -> Engine:
        engine = self.engine(address)
        self._draining.add(address)
        return engine

    def is_draining(self, address: str) -> bool:
        return address in self._draining

    def remove_engine(self, address: str) -> Engine:
        """Forgets a worker; its requests stay owned until finished or ended (see in_flight)."""
        engine = self.engine(address)
        self._all.remove(engine)
        self._draining.discard(address)
        if engine.info is not None and engine.info.model not in self.model_names():
            self._departed.add(engine.info.model)
        return engine

    def in_flight(self, engine: Engine) -> list[str]:
        """Ids of the requests routed to `engine` that have not finished."""
        return [request_id for request_id, owner in self._owner.items() if owner is engine]

    # -- requests ---------------------------------------------------------------------------

    def submit(self, submission: Submission) -> None:
        """Routes and queues a request. Raises NotFound, Unavailable, InvalidArgument or
        ResourceExhausted (the chosen worker's queue is full)."""
        model = submission.model
        if self._only_draining(model):
            raise Unavailable(f"every worker of model `{model}` is draining; retry shortly")
        engine, hashes, choice = self._pick(model, submission.prompt_token_ids)
        info = engine.info
        assert info is not None
        limits = ModelLimits(
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            block_size=info.block_size,
            num_blocks=info.num_blocks,
            eos_token_ids=info.eos_token_ids,
            windows=info.windows,
            max_chunk=engine.limits.max_num_batched_tokens,
        )
        request = admit(
            request_id=submission.request_id,
            prompt_token_ids=list(submission.prompt_token_ids),
            max_tokens=submission.max_tokens,
            sampling=submission.sampling,
            stop_token_ids=list(submission.stop_token_ids),
            ignore_eos=submission.ignore_eos,
            priority=submission.priority,
            trace_context=dict(submission.trace_context),
            limits=limits,
            tenant=submission.tenant,
            resumed_output_tokens=submission.resumed_output_tokens,
        )
        request.block_hashes = hashes  # computed once for routing; the scheduler reuses them
        request.num_migrations = submission.migrations  # one count for both tiers' moves
        if self.picker.wants_hashes:
            request.predicted_cached_tokens = choice.cached_tokens
        engine.submit(request)  # first: a full queue raises, and then the engine owns nothing
        self._owner[request.request_id] = engine

    def place(self, request: Request, model: str) -> Engine:
        """Queues a request whose worker was lost at a ready replica of `model`, routed on all
        its tokens (migration.py). Raises Unavailable (none ready), NotFound or
        ResourceExhausted (its queue is full)."""
        engine, _, choice = self._pick(model, request.all_token_ids)
        if self.picker.wants_hashes:
            request.predicted_cached_tokens = choice.cached_tokens
        engine.submit(request)
        self._owner[request.request_id] = engine
        return engine

    def owner(self, request_id: str) -> Engine | None:
        """The engine the request was routed to, while it has not finished."""
        return self._owner.get(request_id)

    def abort(self, request_id: str) -> None:
        engine = self._owner.pop(request_id, None)
        if engine is not None:
            engine.abort(request_id)

    def forget(self, request_id: str) -> None:
        """The request finished; it no longer needs routing."""
        self._owner.pop(request_id, None)

    def _only_draining(self, model: str) -> bool:
        """The model has workers, but every one of them is draining."""
        if not self._draining:
            return False
        mine = [e for e in self._all if e.info is not None and e.info.model == model]
        return bool(mine) and all(e.address in self._draining for e in mine)

    def _pick(self, model: str, prompt: Sequence[int]) -> tuple[Engine, list[BlockHash], Choice]:
        """The ready replica to run the request (see routing.cost), the prompt's block hashes
        when the routing mode uses them (empty otherwise), and the picker's choice."""
        replicas = [e for e in self.engines if e.info is not None and e.info.model == model]
        if not replicas and model in self._departed:
            raise Unavailable(
                f"no worker serves model `{model}` right now (the last one left); retry shortly"
            )
        if not replicas and any(e.info is None for e in self._all):
            # A worker not yet connected (still loading, as at start-up) may serve it.
            raise Unavailable(
                f"no worker serves model `{model}` yet: a worker is still starting; retry shortly"
            )
        if not replicas:
            raise NotFound(f"The model `{model}` does not exist.", param="model")
        ready = [engine for engine in replicas if engine.ready]
        if not ready:
            raise Unavailable(f"no worker for model `{model}` is ready; retry shortly")
        hashes: list[BlockHash] = []
        info = ready[0].info
        if self.picker.wants_hashes and info is not None:
            # All replicas of a model share its weights, so one fingerprint hashes for all.
            hashes = block_hashes(list(prompt), info.block_size, info.model_fingerprint)
        choice = self.picker.pick([_replica(e) for e in ready], hashes, len(prompt))
        return ready[choice.index], hashes, choice


def _replica(engine: Engine) -> Replica:
    """A ready engine as the picker sees it."""
    info, load = engine.info, engine.load()
    assert info is not None and load is not None
    return Replica(worker_key(info.model, engine.address), info.block_size, load)
