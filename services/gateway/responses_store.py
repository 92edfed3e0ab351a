"""Stored Responses API responses: what GET /v1/responses/{id} returns and what a request's
`previous_response_id` continues.

With Redis (the gateway's --redis-url), responses are kept there for `ttl_seconds`, shared by
every gateway replica; without it, in this process, the newest `max_local` of them, each for
`ttl_seconds` too. A response belongs to the API key that made it: another key gets the same
404 as for an id that never existed. A store that cannot be reached fails the requests that
need it (503), never the ones that only add to it: their answer is already out.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from services.common.errors import NotFound, Unavailable
from services.gateway.log_text import excerpt

log = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS = 24 * 3600
DEFAULT_MAX_LOCAL = 1000
_KEY_PREFIX = "layerserve:response:"


@dataclass(slots=True)
class StoredResponse:
    tenant: str  # the API key's non-secret id ("" without keys)
    response: dict[str, Any]  # the response object, as returned
    # The conversation as chat messages, this response's output last (instructions left out:
    # a later request gives its own).
    messages: list[dict[str, Any]]

    def to_json(self) -> str:
        return json.dumps(
            {"tenant": self.tenant, "response": self.response, "messages": self.messages}
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredResponse:
        data = json.loads(text)
        return cls(data["tenant"], data["response"], data["messages"])


class ResponseStore:
    def __init__(
        self,
        redis: Any = None,  # redis.asyncio.Redis, or None: this process's memory
        *,
        ttl_seconds: int = DEFAULT_TTL_SECONDS,
        max_local: int = DEFAULT_MAX_LOCAL,
    ) -> None:
        self._redis = redis
        self._ttl = ttl_seconds
        self._max_local = max_local
        self._local: OrderedDict[str, tuple[float, str]] = OrderedDict()  # id -> (expiry, json)

    async def put(self, stored: StoredResponse) -> None:
        """Keeps a response; a failure is logged, not raised (the client has its answer)."""
        response_id = stored.response["id"]
        text = stored.to_json()
        if self._redis is None:
            self._local[response_id] = (time.monotonic() + self._ttl, text)
            while len(self._local) > self._max_local:
                self._local.popitem(last=False)
            return
        try:
            await self._redis.set(_KEY_PREFIX + response_id, text, ex=self._ttl)
        except Exception as err:  # redis.RedisError, OSError, timeouts
            log.warning("response %s not stored: Redis failed: %s", response_id, err)

    async def get(self, response_id: str, tenant: str) -> StoredResponse:
        """The stored response; NotFound when there is none for this key."""
        text = await self._read(response_id)
        stored = StoredResponse.from_json(text) if text is not None else None
        if stored is None or stored.tenant != tenant:
            raise NotFound(
                f"Response with id {excerpt(response_id)} not found.", param="response_id"
            )
        return stored

    async def delete(self, response_id: str, tenant: str) -> None:
        await self.get(response_id, tenant)  # another key's response is not there for it
        if self._redis is None:
            self._local.pop(response_id, None)
            return
        try:
            await self._redis.delete(_KEY_PREFIX + response_id)
        except Exception as err:
            raise Unavailable(f"the response store is unavailable: {err}") from None

    async def _read(self, response_id: str) -> str | bytes | None:
        if self._redis is None:
            entry = self._local.get(response_id)
            if entry is None or entry[0] < time.monotonic():
                self._local.pop(response_id, None)
                return None
            return entry[1]
        try:
            return await self._redis.get(_KEY_PREFIX + response_id)
        except Exception as err:
            raise Unavailable(f"the response store is unavailable: {err}") from None
