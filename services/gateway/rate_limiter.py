"""Per-key rate limits as token buckets: requests per minute and tokens per minute.

With Redis, the buckets live there and one Lua script updates them atomically on Redis's own
clock, so every gateway replica shares one limit. Without Redis, each replica keeps its own
buckets (the same arithmetic, in-process) and the limit is per replica.

A request is admitted when the key's token bucket holds what the request may cost at most,
and admission takes it from the bucket at once, atomically: its prompt (estimated) plus
n x max_tokens. When it ends, the real count is settled: what it did not use goes back, what the
prompt estimate missed is taken (the bucket may then be in debt, by the estimate's miss, and
the key waits until it refills). So concurrent requests cannot all start on one full bucket,
and a key spends no more than its budget. A request whose reservation alone is over the key's
tokens per minute is refused outright (429, "Request too large", as OpenAI does): waiting would
never make it fit.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

from services.common.errors import ResourceExhausted, Unavailable
from services.gateway.api_keys import ApiKey, KeyLimits

log = logging.getLogger(__name__)

# KEYS: the request bucket, the token bucket. ARGV: request capacity, token capacity (per
# minute; 0 = unlimited), tokens to reserve. Returns {1, 0} when admitted (one request and the
# reservation taken), else {0, ms until the bucket holds the reservation}.
_ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl = tonumber(v[1]) or cap
  local ts = tonumber(v[2]) or now
  return math.min(cap, lvl + math.max(0, now - ts) * cap / 60000)
end
local rcap, tcap = tonumber(ARGV[1]), tonumber(ARGV[2])
local r
if rcap > 0 then
  r = level(KEYS[1], rcap)
  if r < 1 then return {0, math.ceil((1 - r) * 60000 / rcap)} end
end
local tk
if tcap > 0 then
  tk = level(KEYS[2], tcap)
  local need = math.max(tonumber(ARGV[3]), 1)
  if tk <= 0 or tk < tonumber(ARGV[3]) then return {0, math.ceil((need - tk) * 60000 / tcap)} end
end
if rcap > 0 then
  redis.call('HSET', KEYS[1], 'level', r - 1, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil((rcap - r + 1) * 60000 / rcap) + 1000)
end
if tcap > 0 then
  tk = tk - tonumber(ARGV[3])
  redis.call('HSET', KEYS[2], 'level', tk, 'ts', now)
  redis.call('PEXPIRE', KEYS[2], math.ceil((tcap - tk) * 60000 / tcap) + 1000)
end
return {1, 0}
"""

# KEYS: the token bucket. ARGV: capacity per minute, tokens to take (negative: to give back).
# No floor: a settlement takes what the prompt estimate missed even into debt.
_SETTLE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'level', 'ts')
local lvl = tonumber(v[1]) or cap
local ts = tonumber(v[2]) or now
lvl = math.min(cap, math.min(cap, lvl + math.max(0, now - ts) * cap / 60000) - cost)
redis.call('HSET', KEYS[1], 'level', lvl, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - lvl) * 60000 / cap) + 1000)
return 1
"""


class Buckets(Protocol):
    async def admit(self, tenant: str, limits: KeyLimits, reserve: int) -> float:
        """Takes one request and `reserve` tokens if the key may start one; returns 0, else
        seconds to wait (and takes nothing)."""
        ...

    async def settle(self, tenant: str, limits: KeyLimits, cost: int) -> None:
        """Takes `cost` more tokens from the bucket; a negative cost gives them back."""
        ...


class RedisBuckets:
    def __init__(self, redis) -> None:  # redis.asyncio.Redis
        self._admit = redis.register_script(_ADMIT_LUA)
        self._settle = redis.register_script(_SETTLE_LUA)

    async def admit(self, tenant: str, limits: KeyLimits, reserve: int) -> float:
        allowed, wait_ms = await self._admit(
            keys=_bucket_keys(tenant),
            args=[limits.requests_per_minute, limits.tokens_per_minute, reserve],
        )
        return 0.0 if allowed else wait_ms / 1000

    async def settle(self, tenant: str, limits: KeyLimits, cost: int) -> None:
        await self._settle(keys=_bucket_keys(tenant)[1:], args=[limits.tokens_per_minute, cost])


def _bucket_keys(tenant: str) -> list[str]:
    # The braces make both keys one hash slot in Redis Cluster (scripts need that).
    return [f"layerserve:rate:{{{tenant}}}:requests", f"layerserve:rate:{{{tenant}}}:tokens"]


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, capacity: int, now: float) -> None:
        self.level = float(capacity)
        self.stamp = now

    def refill(self, capacity: int, now: float) -> float:
        self.level = min(capacity, self.level + (now - self.stamp) * capacity / 60)
        self.stamp = now
        return self.level


class LocalBuckets:
    """The Lua scripts' arithmetic in-process, for a gateway without Redis."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def _bucket(self, tenant: str, kind: str, capacity: int) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.setdefault((tenant, kind), _Bucket(capacity, now))
        bucket.refill(capacity, now)
        return bucket

    async def admit(self, tenant: str, limits: KeyLimits, reserve: int) -> float:
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        requests = self._bucket(tenant, "requests", rpm) if rpm else None
        if requests is not None and requests.level < 1:
            return (1 - requests.level) * 60 / rpm
        tokens = self._bucket(tenant, "tokens", tpm) if tpm else None
        if tokens is not None and (tokens.level <= 0 or tokens.level < reserve):
            return (max(reserve, 1) - tokens.level) * 60 / tpm
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= reserve
        return 0.0

    async def settle(self, tenant: str, limits: KeyLimits, cost: int) -> None:
        tpm = limits.tokens_per_minute
        bucket = self._bucket(tenant, "tokens", tpm)
        bucket.level = min(tpm, bucket.level - cost)


class RateLimiter:
    """Admits or refuses a key's next request, and charges its tokens afterwards.

    fail_open decides what a Redis outage means: True lets requests through unlimited, False
    refuses them with 503. Either way the outage is logged once, and its end too.
    """

    def __init__(self, buckets: Buckets, *, fail_open: bool) -> None:
        self._buckets = buckets
        self._fail_open = fail_open
        self._failing = False

    async def admit(self, key: ApiKey, reserve: int = 0) -> int:
        """Admits the key's next request, reserving `reserve` tokens; returns the tokens
        reserved (0 without a token limit, or admitted unlimited through a Redis outage), which
        settle() is given back at the end."""
        limits = key.limits
        if not (limits.requests_per_minute or limits.tokens_per_minute):
            return 0
        reserve = reserve if limits.tokens_per_minute else 0
        if reserve > limits.tokens_per_minute > 0:
            error = ResourceExhausted(_too_large_message(key, limits, reserve))
            error.retry_after = None  # no Retry-After: waiting never makes it fit
            raise error
        try:
            wait = await self._buckets.admit(key.tenant, limits, reserve)
        except Exception as err:  # redis.RedisError, OSError, timeouts
            self._outage(err)
            if self._fail_open:
                return 0
            raise Unavailable("rate limiting is unavailable; try again shortly") from None
        self._recovered()
        if wait > 0:
            error = ResourceExhausted(_over_limit_message(key, limits))
            error.retry_after = max(1, math.ceil(wait))
            raise error
        return reserve

    async def settle(self, key: ApiKey, reserved: int, used: int) -> None:
        """Charges what the request used against what it reserved at admission."""
        if not key.limits.tokens_per_minute or used == reserved:
            return
        try:
            await self._buckets.settle(key.tenant, key.limits, used - reserved)
        except Exception as err:
            self._outage(err)  # the difference goes uncounted; nothing else to do about it
        else:
            self._recovered()

    def _outage(self, err: Exception) -> None:
        if not self._failing:
            policy = "letting requests through" if self._fail_open else "refusing requests"
            log.error("rate limiter cannot reach Redis (%s); %s until it is back", err, policy)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.warning("rate limiter reaches Redis again")
        self._failing = False


def _too_large_message(key: ApiKey, limits: KeyLimits, reserve: int) -> str:
    return (
        f"Request too large for API key {key.name!r} on tokens per minute: limit "
        f"{limits.tokens_per_minute}, requested {reserve} (the prompt, estimated, plus n x "
        "max_tokens); lower max_tokens or shorten the prompt"
    )


def _over_limit_message(key: ApiKey, limits: KeyLimits) -> str:
    parts = []
    if limits.requests_per_minute:
        parts.append(f"{limits.requests_per_minute} requests per minute")
    if limits.tokens_per_minute:
        parts.append(f"{limits.tokens_per_minute} tokens per minute")
    return f"rate limit reached for API key {key.name!r} ({' and '.join(parts)})"
