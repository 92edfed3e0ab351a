"""Per-key concurrency limits (`max_concurrent`), across every gateway replica.

Each replica counts its own requests in flight per key; with Redis, a request also holds a
lease: a member of the key's sorted set, scored by when it expires. Admission counts the
unexpired leases and adds one in one Lua script, on Redis's clock. A request refreshes its
lease while it runs and removes it when it ends; a lease whose gateway died expires after
LEASE_SECONDS, so a crashed replica cannot hold a key's places forever.

When Redis is unreachable the replica's own count still holds, and the gateway's
rate-limit-on-redis-failure policy decides the rest: open admits on that count alone, closed
refuses with 503.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

from services.common.errors import ResourceExhausted, Unavailable
from services.gateway.api_keys import ApiKey

log = logging.getLogger(__name__)

LEASE_SECONDS = 30.0
_REFRESH_EVERY_S = LEASE_SECONDS / 3

# KEYS: the key's lease set. ARGV: the limit, the lease id, the lease time in ms.
# Returns 1 with the lease taken, else 0.
_ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""

# KEYS: the key's lease set. ARGV: the lease id, the lease time in ms. Extends a live lease.
_REFRESH_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


class RedisLeases:
    def __init__(self, redis, lease_seconds: float = LEASE_SECONDS) -> None:
        self._redis = redis
        self._acquire = redis.register_script(_ACQUIRE_LUA)
        self._refresh = redis.register_script(_REFRESH_LUA)
        self._lease_ms = int(lease_seconds * 1000)

    async def acquire(self, tenant: str, limit: int, lease_id: str) -> bool:
        return bool(
            await self._acquire(keys=[_key(tenant)], args=[limit, lease_id, self._lease_ms])
        )

    async def refresh(self, tenant: str, lease_id: str) -> None:
        await self._refresh(keys=[_key(tenant)], args=[lease_id, self._lease_ms])

    async def release(self, tenant: str, lease_id: str) -> None:
        await self._redis.zrem(_key(tenant), lease_id)


def _key(tenant: str) -> str:
    return f"layerserve:concurrency:{{{tenant}}}"


@dataclass(slots=True)
class Lease:
    key: ApiKey
    lease_id: str = ""  # "" = no Redis lease held (this replica's count only)
    refresher: asyncio.Task[None] | None = field(default=None, repr=False)


class ConcurrencyLimiter:
    def __init__(
        self,
        leases: RedisLeases | None = None,
        *,
        fail_open: bool = True,
        refresh_every_s: float = _REFRESH_EVERY_S,
    ) -> None:
        self._leases = leases
        self._fail_open = fail_open
        self._refresh_every_s = refresh_every_s
        self._local: Counter[str] = Counter()  # requests in flight per key, this replica
        self._failing = False

    async def acquire(self, key: ApiKey) -> Lease:
        """A place for one request of the key; ResourceExhausted when it has none left."""
        limit = key.limits.max_concurrent
        if limit and self._local[key.tenant] >= limit:
            raise _over_limit(key, limit)
        self._local[key.tenant] += 1
        lease = Lease(key)
        try:
            if limit and self._leases is not None:
                await self._take_lease(lease, limit)
        except BaseException:
            self._local[key.tenant] -= 1
            raise
        return lease

    async def release(self, lease: Lease) -> None:
        self._local[lease.key.tenant] -= 1
        if lease.refresher is not None:
            lease.refresher.cancel()
        if lease.lease_id and self._leases is not None:
            try:
                await self._leases.release(lease.key.tenant, lease.lease_id)
            except Exception as err:  # it expires on its own
                self._outage(err)

    async def _take_lease(self, lease: Lease, limit: int) -> None:
        assert self._leases is not None
        lease_id = uuid.uuid4().hex
        try:
            taken = await self._leases.acquire(lease.key.tenant, limit, lease_id)
        except Exception as err:  # redis.RedisError, OSError, timeouts
            self._outage(err)
            if self._fail_open:
                return
            raise Unavailable("concurrency limiting is unavailable; try again shortly") from None
        self._recovered()
        if not taken:
            raise _over_limit(lease.key, limit)
        lease.lease_id = lease_id
        lease.refresher = asyncio.create_task(self._refresh(lease), name=f"lease {lease_id}")

    async def _refresh(self, lease: Lease) -> None:
        assert self._leases is not None
        while True:
            await asyncio.sleep(self._refresh_every_s)
            try:
                await self._leases.refresh(lease.key.tenant, lease.lease_id)
            except Exception as err:
                self._outage(err)

    def _outage(self, err: Exception) -> None:
        if not self._failing:
            log.error("concurrency limits cannot reach Redis (%s); counting per replica", err)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.warning("concurrency limits reach Redis again")
        self._failing = False


def _over_limit(key: ApiKey, limit: int) -> ResourceExhausted:
    error = ResourceExhausted(
        f"API key {key.name!r} already has {limit} requests in flight, its limit; "
        "retry when one finishes"
    )
    error.retry_after = 1
    return error
