"""What model names the tokenizer service can serve: one tokenizer per model, and the
scheduler's view of the stack (its served models, with where their weights are, and its alias
table), cached for a short TTL.

A name resolves to a model when a tokenizer is loaded for it or the scheduler serves it, else
to an alias. An unknown name refreshes the cache at once (an alias or worker just added must
work on the next request), and a model the scheduler serves without a tokenizer here gets one
loaded from the path its workers report: models added at run time need no restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.common.errors import NotFound, Unavailable
from services.tokenizer.alias_route import AliasRoute, WeightedRoute
from services.tokenizer.text_model import TextModel

log = logging.getLogger(__name__)

# A failed tokenizer load is not retried for this long (each request would pay seconds).
LOAD_RETRY_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    max_model_len: int
    path: str  # "" = the embedded default model


@dataclass(slots=True)
class StackView:
    """The scheduler's ListModels, as domain objects."""

    models: dict[str, ServedModel] = field(default_factory=dict)
    aliases: dict[str, AliasRoute] = field(default_factory=dict)


Fetch = Callable[[], Awaitable[StackView]]  # raises on failure
Load = Callable[[str | None], Awaitable[TextModel]]  # a path (None: the default model)
Measure = Callable[[str], Awaitable[int]]  # a model name -> the prompt's length in its tokens


class ModelCatalog:
    def __init__(
        self,
        tokenizers: dict[str, TextModel],
        fetch: Fetch,
        load: Load,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tokenizers = dict(tokenizers)
        self._fetch = fetch
        self._load = load
        self._ttl = ttl
        self._clock = clock
        self.view = StackView()
        self._fetched_at = -float("inf")  # when the applied view's fetch started
        self._fetch_task: asyncio.Task[bool] | None = None
        self._fetch_started = -float("inf")
        self._loading: dict[str, asyncio.Task[TextModel]] = {}
        self._failed: dict[str, tuple[float, str]] = {}  # name -> (when, why)

    # -- names -----------------------------------------------------------------------------

    async def lookup(self, name: str) -> str | AliasRoute:
        """The model `name` is, or the alias route it names. Raises NotFound (Unavailable if
        the scheduler could not be asked)."""
        self._refresh_if_stale()
        found = self._find(name)
        if found is None:
            fresh = await self.refresh()
            found = self._find(name)
            if found is None and not fresh:
                raise Unavailable("the scheduler is unavailable; retry shortly")
        if found is None:
            raise NotFound(f"The model `{name}` does not exist.", param="model")
        return found

    async def resolve(self, name: str, measure: Measure) -> str:
        """The model that serves a request for `name`. A length-rule alias measures the prompt
        with `measure(its first model)`."""
        found = await self.lookup(name)
        if isinstance(found, str):
            return found
        if isinstance(found, WeightedRoute):
            return found.pick()
        return found.pick(await measure(found.first))

    def _find(self, name: str) -> str | AliasRoute | None:
        if name in self._tokenizers or name in self.view.models:
            return name
        return self.view.aliases.get(name)

    # -- tokenizers ------------------------------------------------------------------------

    async def text_model(self, name: str) -> TextModel:
        """The tokenizer of model `name`, loaded from its path on first use. Raises NotFound
        for a model the scheduler does not serve, Unavailable when loading failed."""
        model = self._tokenizers.get(name)
        if model is not None:
            return model
        failed = self._failed.get(name)
        if failed is not None and self._clock() - failed[0] < LOAD_RETRY_SECONDS:
            raise Unavailable(failed[1])
        served = self.view.models.get(name)
        if served is None:
            raise NotFound(f"The model `{name}` does not exist.", param="model")
        task = self._loading.get(name)
        if task is None:
            task = asyncio.ensure_future(self._load_tokenizer(served))
            self._loading[name] = task
        return await asyncio.shield(task)

    async def _load_tokenizer(self, served: ServedModel) -> TextModel:
        where = served.path or "the embedded default model"
        started = time.perf_counter()
        try:
            model = self._loaded_from(served.path) or await self._load(served.path or None)
        except Exception as err:  # FileNotFoundError, ValueError, or a parse failure
            message = f"cannot load the tokenizer of `{served.name}` from {where}: {err}"
            log.error("%s", message)
            self._failed[served.name] = (self._clock(), message)
            raise Unavailable(message) from None
        finally:
            self._loading.pop(served.name, None)
        self._tokenizers[served.name] = model
        self._failed.pop(served.name, None)
        log.info(
            "loaded the tokenizer of %s from %s in %.1fs",
            served.name,
            where,
            time.perf_counter() - started,
        )
        return model

    def _loaded_from(self, path: str) -> TextModel | None:
        """A tokenizer already loaded for another model of the same path (a TextModel is
        immutable, so names share it)."""
        for other in self.view.models.values():
            if other.path == path and other.name in self._tokenizers:
                return self._tokenizers[other.name]
        return None

    # -- listing ---------------------------------------------------------------------------

    async def listing(self) -> list[tuple[str, int]]:
        """(name, max_model_len) of every servable model and alias, sorted by name: models the
        scheduler serves whose tokenizer loads, and aliases whose targets are all among them
        (their max_model_len is the smallest of their targets')."""
        if not await self.refresh():
            raise Unavailable("the scheduler is unavailable; retry shortly")
        lengths: dict[str, int] = {}
        for served in list(self.view.models.values()):
            try:
                await self.text_model(served.name)
            except (NotFound, Unavailable):
                continue  # logged where it failed
            lengths[served.name] = served.max_model_len
        for name, route in self.view.aliases.items():
            if name not in lengths and all(m in lengths for m in route.models):
                lengths[name] = min(lengths[m] for m in route.models)
        return sorted(lengths.items())

    # -- the scheduler's view --------------------------------------------------------------

    async def refresh(self) -> bool:
        """Makes the view at least as new as this call: joins a fetch started since, else
        starts one (after any older fetch in flight, so that a burst of misses costs at most
        two fetches). Returns whether that fetch succeeded."""
        since = self._clock()
        while True:
            task = self._fetch_task
            if task is not None and self._fetch_started >= since:
                return await asyncio.shield(task)
            if task is not None and not task.done():
                await asyncio.wait([task])
                continue
            self._start_fetch()

    def _refresh_if_stale(self) -> None:
        in_flight = self._fetch_task is not None and not self._fetch_task.done()
        if not in_flight and self._clock() - self._fetched_at > self._ttl:
            self._start_fetch()

    def _start_fetch(self) -> None:
        self._fetch_started = self._clock()
        self._fetch_task = asyncio.ensure_future(self._fetch_and_apply(self._fetch_started))

    async def _fetch_and_apply(self, started: float) -> bool:
        try:
            view = await self._fetch()
        except Exception as err:  # the scheduler is down or restarting: keep the old view
            log.warning("could not refresh models and aliases from the scheduler: %s", err)
            return False
        if started >= self._fetched_at:
            self._apply(view)
            self._fetched_at = started
        return True

    def _apply(self, view: StackView) -> None:
        """Keeps each alias's route object while its definition is unchanged, so a canary's
        round robin goes on where it was instead of restarting at every refresh."""
        for name, route in view.aliases.items():
            old = self.view.aliases.get(name)
            if old is not None and old.same_as(route):
                view.aliases[name] = old
        self.view = view
