"""Usage counters per API key: requests, prompt, completion and cached tokens.

Kept in this process always, and added to a Redis hash per key when there is a Redis, so the
totals cover every gateway replica. `GET /v1/usage` shows a caller its own counters.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger(__name__)

FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass(slots=True)
class Usage:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELDS}


class UsageLedger:
    def __init__(self, redis=None) -> None:  # redis.asyncio.Redis or None
        self._redis = redis
        self._local: dict[str, Counter] = {}

    async def record(self, tenant: str, usage: Usage) -> None:
        counts = {name: value for name, value in usage.as_dict().items() if value}
        self._local.setdefault(tenant, Counter()).update(counts)
        if self._redis is None or not counts:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, value in counts.items():
                    pipe.hincrby(_key(tenant), name, value)
                await pipe.execute()
        except Exception as err:  # redis.RedisError, OSError
            log.warning(
                "usage of %s not added to Redis (%s); this replica still counts it", tenant, err
            )

    async def totals(self, tenant: str) -> tuple[Usage, str]:
        """The key's counters and their scope: "all replicas" (Redis) or "this replica"."""
        if self._redis is not None:
            try:
                stored = await self._redis.hgetall(_key(tenant))
                return Usage(**{name: int(stored.get(name.encode(), 0)) for name in FIELDS}), (
                    "all replicas"
                )
            except Exception as err:
                log.warning("usage of %s not read from Redis (%s)", tenant, err)
        local = self._local.get(tenant, Counter())
        return Usage(**{name: local[name] for name in FIELDS}), "this replica"


def _key(tenant: str) -> str:
    return f"layerserve:usage:{tenant}"
