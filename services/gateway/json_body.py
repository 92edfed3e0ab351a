"""A request body's JSON, parsed without holding the event loop.

json.loads holds the GIL from start to end (so does orjson, and it is no faster where the time
goes: allocating millions of small containers), so a thread does not help: an 8 MiB body of
2.8 million empty lists held the loop, and every other client, for over half a second. A body
up to INLINE_BYTES is parsed on the loop (at most a few milliseconds); a bigger one in a child
process, which refuses it (400) when it holds more than MAX_VALUES JSON values, so what comes
back to be unpickled here is bounded too (about 50 ms at the bound, on the pool's thread). A
legitimate body stays well under it: a 128k-token prompt as token ids is 128k values.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from services.common.errors import InvalidArgument, Unavailable
from services.gateway.http_json import has_lone_surrogate

JsonObject = dict[str, Any]

INLINE_BYTES = 64 * 1024
MAX_VALUES = 1 << 18  # 262,144
_pool: ProcessPoolExecutor | None = None


def parse_object(raw: bytes) -> JsonObject:
    """The body's JSON object, or an InvalidArgument naming what is wrong with it."""
    return _checked(_parse(raw, None), raw)


async def parse_object_off_loop(raw: bytes) -> JsonObject:
    """parse_object(), in a child process when the body is bigger than INLINE_BYTES."""
    if len(raw) <= INLINE_BYTES:
        return parse_object(raw)
    try:
        parsed = await asyncio.wrap_future(_executor().submit(_parse, raw, MAX_VALUES))
    except BrokenProcessPool:  # a child died (killed, out of memory): a new pool next time
        global _pool
        _pool = None
        raise Unavailable("the request body could not be parsed; retry") from None
    return _checked(parsed, raw)


def _checked(parsed: tuple[Any, str], raw: bytes) -> JsonObject:
    body, error = parsed
    if error:
        raise InvalidArgument(error)
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    # JSON may spell half a UTF-16 pair (\ud800), which no UTF-8 encoder (protobuf's
    # included) accepts; raw UTF-8 cannot hold one, so only an escape can bring it in.
    if b"\\u" in raw and has_lone_surrogate(body):
        raise InvalidArgument("request body contains an unpaired UTF-16 surrogate escape")
    return body


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:  # spawned, not forked: the gateway runs gRPC threads
        _pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    return _pool


def _parse(raw: bytes, max_values: int | None) -> tuple[Any, str]:
    """(value, "") or (None, why it is refused). Runs in the child for big bodies."""
    try:
        value = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both derive from it
        return None, f"request body is not valid JSON: {exc}"
    except RecursionError:
        return None, "request body is nested too deeply"
    if max_values is not None and _count_values(value, max_values) > max_values:
        return None, f"request body holds more than {max_values} JSON values"
    return value, ""


def _count_values(value: Any, limit: int) -> int:
    """JSON values in `value` (keys aside), counted with its own stack; stops past `limit`."""
    count, stack = 0, [value]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count
