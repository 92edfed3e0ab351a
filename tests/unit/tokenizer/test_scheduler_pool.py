"""The tokenizer's scheduler pool: a shared prefix goes to the replica whose worker caches it
in the Redis index (by that worker's key and block geometry), whichever replica owns it; a
replica that is not serving gets nothing."""

from __future__ import annotations

import pytest

from services.common.block_hash import block_hashes
from services.common.errors import Unavailable
from services.tokenizer import scheduler_pool
from services.tokenizer.model_catalog import ServedModel, StackView
from services.tokenizer.scheduler_link import WorkerView
from services.tokenizer.scheduler_pool import SchedulerPool

PROMPT = list(range(100, 420))  # 20 blocks of 16


class Index:
    """The prefix index's answer: worker key -> the hashes it holds."""

    def __init__(self, held: dict[str, list[bytes]]) -> None:
        self.held = held
        self.asked: list[list[str]] = []

    async def cached_blocks(self, workers: list[str], hashes: list[bytes]) -> dict[str, int]:
        self.asked.append(workers)
        counts = {}
        for w in workers:
            n = 0
            while n < len(hashes) and hashes[n] in self.held.get(w, []):
                n += 1
            counts[w] = n
        return counts

    async def close(self) -> None:
        pass


def pool(index: Index, serving: tuple[bool, ...] = (True, True, True)) -> SchedulerPool:
    schedulers = SchedulerPool("s0:1,s1:1,s2:1", prefix=index)
    for k, link in enumerate(schedulers.links.values()):
        link.health.serving = serving[k]
        link.view = StackView(models={"m": ServedModel("m", 2048, "")})
        link.workers = tuple(WorkerView(f"w{k}{j}:1", "m", 0, 0, 1000, 16, "fp") for j in range(2))
    return schedulers


async def test_the_prefix_finds_the_replica_whose_worker_caches_it() -> None:
    for owner in ("s0:1", "s1:1", "s2:1"):
        worker = f"m@w{owner[1]}1:1"
        index = Index({worker: block_hashes(PROMPT, 16, "fp")[:18]})
        chosen = await pool(index).choose("m", PROMPT)
        assert chosen.address == owner
        assert worker in index.asked[0]


async def test_only_serving_replicas_of_the_model_are_chosen() -> None:
    index = Index({"m@w01:1": block_hashes(PROMPT, 16, "fp")})
    schedulers = pool(index, serving=(False, True, True))
    assert (await schedulers.choose("m", PROMPT)).address != "s0:1"
    # A model none lists yet (a worker just added): a replica that is up answers for it.
    assert (await schedulers.choose("other", PROMPT)).address == "s1:1"
    with pytest.raises(Unavailable, match="model `m`"):  # the only one left is down
        await schedulers.choose("m", PROMPT, avoid=frozenset({"s1:1", "s2:1"}))


async def test_a_dns_name_follows_replicas_as_they_come_and_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = ["10.0.0.1:50060", "10.0.0.2:50060"]

    async def resolve(entries):
        assert entries == ("dns:///scheduler-headless:50060",)
        return list(found)

    monkeypatch.setattr(scheduler_pool, "resolve_schedulers", resolve)
    schedulers = SchedulerPool("dns:///scheduler-headless:50060")
    await schedulers._follow_replicas()
    assert sorted(schedulers.links) == found
    busy = schedulers.links["10.0.0.1:50060"]
    busy.requests.add("r1")  # a replica gone from DNS keeps its link while it runs requests
    found[:] = ["10.0.0.3:50060"]
    await schedulers._follow_replicas()
    assert sorted(schedulers.links) == ["10.0.0.1:50060", "10.0.0.3:50060"]
    busy.requests.clear()
    await schedulers._follow_replicas()
    assert sorted(schedulers.links) == ["10.0.0.3:50060"]
    await schedulers.close()
