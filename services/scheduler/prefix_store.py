"""The prefix-cache metadata in Redis: which block hashes each worker holds.

Per worker (model + address), three keys that expire together unless a heartbeat renews them,
so a dead worker's entries vanish on their own:

- `{ns}:{worker}:blocks`  SET of the 16-byte block hashes the worker holds (the full state);
- `{ns}:{worker}:meta`    HASH epoch, seq: the writer's epoch (new at every full republish)
                          and the number of its last write batch;
- `{ns}:{worker}:events`  STREAM of write batches {e: epoch, s: seq, add: hashes, del: hashes}.

A write batch changes all three in one MULTI/EXEC, so a snapshot (read in one MULTI too) is
consistent with a stream position. A reader applies events whose epoch is its own and whose
seq follows the last it applied; anything else (a gap, a trimmed stream, a republish after
Redis or the writer restarted) sends it back to a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis

from services.common.block_hash import BlockHash
from services.scheduler.prefix_index import WorkerKey

HASH_BYTES = 16  # block_hash.chain_hash digests
STREAM_START = "0-0"


@dataclass(slots=True)
class Batch:
    """One write of one worker: what changed since its previous batch."""

    worker: WorkerKey
    epoch: str
    seq: int
    stored: list[BlockHash] = field(default_factory=list)
    removed: list[BlockHash] = field(default_factory=list)
    full: bool = False  # `stored` is the worker's whole state: it replaces the set


@dataclass(slots=True)
class Event:
    worker: WorkerKey
    stream_id: str
    epoch: str
    seq: int
    stored: list[BlockHash]
    removed: list[BlockHash]


@dataclass(slots=True)
class Snapshot:
    epoch: str | None  # None: the worker has no entries (never written, or expired)
    seq: int
    hashes: list[BlockHash]
    stream_id: str  # the last event the snapshot includes


def _pack(hashes: list[BlockHash]) -> bytes:
    return b"".join(hashes)


def _unpack(raw: bytes) -> list[BlockHash]:
    if len(raw) % HASH_BYTES:
        raise ValueError(f"a packed hash list of {len(raw)} bytes")
    return [raw[i : i + HASH_BYTES] for i in range(0, len(raw), HASH_BYTES)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PrefixStore:
    def __init__(
        self,
        client: aioredis.Redis,
        ttl_s: float,
        namespace: str = "layerserve:prefix",
        max_events: int = 10_000,
    ) -> None:
        self.client = client  # decode_responses=False: hashes are raw bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.namespace = namespace
        self.max_events = max_events  # per worker; a reader further behind resyncs

    def key(self, worker: WorkerKey, part: str) -> str:
        return f"{self.namespace}:{worker}:{part}"

    # -- writer ------------------------------------------------------------------------------

    async def write(self, batches: list[Batch]) -> None:
        """Applies batches (of several workers) in one transaction: one round trip."""
        pipe = self.client.pipeline(transaction=True)
        for batch in batches:
            blocks = self.key(batch.worker, "blocks")
            if batch.full:
                pipe.delete(blocks)
            for start in range(0, len(batch.stored), 4096):
                pipe.sadd(blocks, *batch.stored[start : start + 4096])
            if batch.removed:
                pipe.srem(blocks, *batch.removed)
            meta = {"epoch": batch.epoch, "seq": batch.seq}
            pipe.hset(self.key(batch.worker, "meta"), mapping=meta)
            fields = {"e": batch.epoch, "s": batch.seq, "add": b"", "del": b""}
            if not batch.full:  # a reader takes a full batch as a cue to snapshot
                fields["add"] = _pack(batch.stored)
                fields["del"] = _pack(batch.removed)
            events = self.key(batch.worker, "events")
            pipe.xadd(events, fields, maxlen=self.max_events, approximate=True)
            self._expire(pipe, batch.worker)
        await pipe.execute()

    async def refresh(self, workers: list[WorkerKey]) -> list[WorkerKey]:
        """The heartbeat: renews the workers' expiry. Returns those with no entries any more
        (Redis restarted, or they expired): the writer must republish them."""
        pipe = self.client.pipeline(transaction=False)
        for worker in workers:
            self._expire(pipe, worker)
        results = await pipe.execute()
        # Three results per worker; the meta key (the second) exists whenever entries do.
        return [w for i, w in enumerate(workers) if not results[3 * i + 1]]

    def _expire(self, pipe, worker: WorkerKey) -> None:
        for part in ("blocks", "meta", "events"):
            pipe.pexpire(self.key(worker, part), self.ttl_ms)

    # -- reader ------------------------------------------------------------------------------

    async def snapshot(self, worker: WorkerKey) -> Snapshot:
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.key(worker, "meta"))
        pipe.smembers(self.key(worker, "blocks"))
        pipe.xrevrange(self.key(worker, "events"), count=1)
        meta, members, last = await pipe.execute()
        stream_id = _text(last[0][0]) if last else STREAM_START
        if not meta:
            return Snapshot(None, 0, [], stream_id)
        epoch = _text(meta[b"epoch"])
        return Snapshot(epoch, int(meta[b"seq"]), list(members), stream_id)

    async def epochs(self, workers: list[WorkerKey]) -> dict[WorkerKey, str | None]:
        """Each worker's current epoch (None: no entries)."""
        if not workers:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for worker in workers:
            pipe.hget(self.key(worker, "meta"), "epoch")
        values = await pipe.execute()
        return {
            w: (_text(v) if v is not None else None) for w, v in zip(workers, values, strict=True)
        }

    async def read(
        self, cursors: dict[WorkerKey, str], block_ms: int, count: int = 1000
    ) -> list[Event]:
        """Events after each worker's cursor, waiting up to block_ms for the first."""
        if not cursors:
            return []
        by_key = {self.key(w, "events"): w for w in cursors}
        streams = {self.key(w, "events"): cursor for w, cursor in cursors.items()}
        reply = await self.client.xread(streams, count=count, block=block_ms)
        if isinstance(reply, dict):  # RESP3 answers a map, RESP2 a list of pairs
            reply = list(reply.items())
        events: list[Event] = []
        for key, entries in reply or []:
            worker = by_key[_text(key)]
            for stream_id, fields in entries:
                events.append(
                    Event(
                        worker,
                        _text(stream_id),
                        _text(fields[b"e"]),
                        int(fields[b"s"]),
                        _unpack(fields[b"add"]),
                        _unpack(fields[b"del"]),
                    )
                )
        return events
