"""Alias routes and the tokenizer service's catalog of models and aliases."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from services.common.errors import NotFound, Unavailable
from services.tokenizer.alias_route import LengthRoute, WeightedRoute
from services.tokenizer.model_catalog import ModelCatalog, ServedModel, StackView


def test_weighted_route_splits_every_window_exactly() -> None:
    route = WeightedRoute([("a", 90), ("b", 10)])
    picks = [route.pick() for _ in range(50)]
    for start in range(41):  # any 10 consecutive picks, wherever the round robin stands
        assert Counter(picks[start : start + 10]) == {"a": 9, "b": 1}
    route = WeightedRoute([("a", 2), ("b", 1), ("c", 1)])
    picks = [route.pick() for _ in range(8)]
    assert Counter(picks[:4]) == Counter(picks[4:]) == {"a": 2, "b": 1, "c": 1}
    assert picks[0] != picks[1]  # interleaved, not bunched


def test_length_route_tiers() -> None:
    route = LengthRoute(((8, "small"), (64, "mid"), (0, "big")))
    assert route.first == "small"
    assert [route.pick(n) for n in (1, 8, 9, 64, 65, 10_000)] == [
        "small", "small", "mid", "mid", "big", "big",
    ]  # fmt: skip


class FakeScheduler:
    """Stands in for the scheduler's ListModels: a view that the test edits."""

    def __init__(self) -> None:
        self.view = StackView()
        self.fetches = 0
        self.down = False

    async def fetch(self) -> StackView:
        self.fetches += 1
        await asyncio.sleep(0.01)
        if self.down:
            raise ConnectionError("scheduler down")
        return StackView(dict(self.view.models), dict(self.view.aliases))

    def serve(self, name: str, length: int = 2048, path: str = "") -> None:
        self.view.models[name] = ServedModel(name, length, path)


class Loads:
    def __init__(self) -> None:
        self.paths: list[str | None] = []
        self.fail = False

    async def __call__(self, path: str | None) -> object:
        self.paths.append(path)
        await asyncio.sleep(0.01)
        if self.fail:
            raise FileNotFoundError(f"no tokenizer at {path}")
        return object()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def catalog(scheduler: FakeScheduler, loads: Loads, clock: Clock | None = None) -> ModelCatalog:
    startup = {"small": object()}
    return ModelCatalog(startup, scheduler.fetch, loads, ttl=2.0, clock=clock or Clock())


async def test_alias_added_later_resolves_on_the_next_request() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    scheduler.serve("small")
    scheduler.serve("big")
    cat = catalog(scheduler, Loads(), clock)
    assert await cat.lookup("small") == "small"
    with pytest.raises(NotFound, match="`canary` does not exist"):
        await cat.lookup("canary")
    scheduler.view.aliases["canary"] = WeightedRoute([("small", 1), ("big", 1)])
    clock.now += 0.1  # well within the TTL: the miss itself refreshes
    assert [await cat.resolve("canary", _no_measure) for _ in range(4)] == ["small", "big"] * 2


async def _no_measure(model: str) -> int:
    raise AssertionError("a weighted alias never measures the prompt")


async def test_round_robin_survives_refreshes_until_redefined() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    scheduler.serve("small")
    scheduler.serve("big")
    scheduler.view.aliases["canary"] = WeightedRoute([("small", 3), ("big", 1)])
    cat = catalog(scheduler, Loads(), clock)
    picks = []
    for _ in range(8):
        picks.append(await cat.resolve("canary", _no_measure))
        clock.now += 5  # past the TTL: every request triggers a background refresh
        await asyncio.sleep(0.02)
    assert scheduler.fetches >= 8
    assert Counter(picks) == {"small": 6, "big": 2}
    scheduler.view.aliases["canary"] = WeightedRoute([("big", 1)])
    clock.now += 5
    await cat.refresh()
    assert await cat.resolve("canary", _no_measure) == "big"


async def test_length_alias_measures_with_its_first_model() -> None:
    scheduler = FakeScheduler()
    scheduler.serve("small")
    scheduler.serve("big")
    scheduler.view.aliases["auto"] = LengthRoute(((16, "small"), (0, "big")))
    cat = catalog(scheduler, Loads())
    measured: list[str] = []

    def measure_as(length: int):
        async def measure(model: str) -> int:
            measured.append(model)
            return length

        return measure

    assert await cat.resolve("auto", measure_as(16)) == "small"
    assert await cat.resolve("auto", measure_as(17)) == "big"
    assert measured == ["small", "small"]


async def test_new_model_gets_its_tokenizer_loaded_once() -> None:
    scheduler, loads = FakeScheduler(), Loads()
    scheduler.serve("small", path="/models/small")
    scheduler.serve("late", path="/models/late")
    scheduler.serve("small-too", path="/models/small")
    cat = catalog(scheduler, loads)
    assert await cat.lookup("late") == "late"
    first, second = await asyncio.gather(cat.text_model("late"), cat.text_model("late"))
    assert first is second and loads.paths == ["/models/late"]
    # The same path as a loaded model: its tokenizer is shared, nothing is loaded.
    assert await cat.text_model("small-too") is await cat.text_model("small")
    assert loads.paths == ["/models/late"]


async def test_failed_load_is_not_retried_at_once() -> None:
    scheduler, loads, clock = FakeScheduler(), Loads(), Clock()
    scheduler.serve("late", path="/missing")
    cat = catalog(scheduler, loads, clock)
    await cat.refresh()
    loads.fail = True
    for _ in range(3):
        with pytest.raises(Unavailable, match="cannot load the tokenizer of `late` from /missing"):
            await cat.text_model("late")
    assert loads.paths == ["/missing"]
    clock.now += 60
    loads.fail = False
    await cat.text_model("late")
    assert loads.paths == ["/missing", "/missing"]


async def test_unknown_name_with_the_scheduler_down_is_unavailable() -> None:
    scheduler = FakeScheduler()
    scheduler.down = True
    cat = catalog(scheduler, Loads())
    assert await cat.lookup("small") == "small"  # loaded at start: no need to ask
    with pytest.raises(Unavailable, match="scheduler is unavailable"):
        await cat.lookup("other")


async def test_a_burst_of_misses_costs_at_most_two_fetches() -> None:
    scheduler = FakeScheduler()
    cat = catalog(scheduler, Loads())
    results = await asyncio.gather(
        *(cat.lookup(f"nope-{i}") for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, NotFound) for r in results)
    assert scheduler.fetches <= 2


async def test_listing_has_models_and_complete_aliases() -> None:
    scheduler = FakeScheduler()
    scheduler.serve("small", 1024)
    scheduler.serve("big", 4096)
    scheduler.view.aliases["canary"] = WeightedRoute([("small", 9), ("big", 1)])
    scheduler.view.aliases["broken"] = WeightedRoute([("small", 1), ("gone", 1)])
    cat = catalog(scheduler, Loads())
    assert await cat.listing() == [("big", 4096), ("canary", 1024), ("small", 1024)]
