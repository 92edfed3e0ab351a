"""The HTTP door's bounds on a connection and on a request body.

Connections (`connection_options`, the application's handler_args, so every server of
create_app has them): a connection that has not sent a whole request head http_idle_timeout_s
after it opened, or after its last response, is closed: an idle keep-alive connection as much
as one that sends its headers a byte a second (aiohttp's keep-alive timer, which counts from
those two moments and is not reset by arriving bytes).

Bodies (`read_body`): the whole body must arrive within http_body_timeout_s of the head (408).
aiohttp's own inflation is off: it inflates as bytes arrive, on the event loop, and goes on
inflating what a refused request still sends while it drains the connection. Here a body sent
with `Content-Encoding: gzip` or `deflate` is read as sent (at most max_body_bytes of it), only
by a handler (so after the key was checked: a bad key gets its 401 without any inflating), then
inflated in a worker thread in steps of at most _STEP bytes, and refused (413) as soon as the
inflated size passes max_body_bytes: a 1 MB body that would inflate to 1 GiB costs at most
max_body_bytes of output. Any other coding (br, zstd, several stacked) is a 415 naming those
accepted.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from aiohttp import web

from services.common.errors import InvalidArgument
from services.gateway.log_text import excerpt
from services.gateway.request_limits import RequestLimits

ACCEPTED_ENCODINGS = ("gzip", "deflate", "identity")
_STEP = 256 * 1024  # the most one inflating step writes before the size is checked again


def connection_options(limits: RequestLimits) -> dict[str, Any]:
    """aiohttp's per-connection settings (web.Application's handler_args)."""
    return {"auto_decompress": False, "keepalive_timeout": limits.http_idle_timeout_s}


async def read_body(request: web.Request, limits: RequestLimits) -> bytes:
    """The request's body, inflated; raises 408, 413, 415 or a 400 for a broken coding."""
    encoding = _content_encoding(request)
    try:
        async with asyncio.timeout(limits.http_body_timeout_s):
            raw = await request.read()  # client_max_size (max_body_bytes) bounds what is sent
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {limits.http_body_timeout_s:g} s"
        ) from None
    if encoding == "identity":
        return raw
    return await asyncio.to_thread(inflate, raw, encoding, limits.max_body_bytes)


def _content_encoding(request: web.Request) -> str:
    given = request.headers.get("Content-Encoding", "identity").strip().lower()
    encoding = "gzip" if given == "x-gzip" else given or "identity"
    if encoding not in ACCEPTED_ENCODINGS:
        raise web.HTTPUnsupportedMediaType(
            text=f"Content-Encoding {excerpt(given)} is not supported; send one of "
            f"{', '.join(ACCEPTED_ENCODINGS)}"
        )
    return encoding


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` inflated, at most `limit` bytes of it: 413 past that, 400 when it is broken.
    deflate is zlib-wrapped (RFC 9110) or, as some clients send it, raw."""
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    else:
        wbits = zlib.MAX_WBITS if data[:1] and data[0] & 0x0F == 8 else -zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    parts, size = [], 0
    try:
        while not inflater.eof:
            part = inflater.decompress(data, _STEP)
            data = inflater.unconsumed_tail
            size += len(part)
            if size > limit:
                raise web.HTTPRequestEntityTooLarge(
                    limit,
                    text=f"the request body inflates to more than {limit} bytes, the body limit",
                )
            if not part and not data:
                break  # no more input, no more output: cut short
            parts.append(part)
    except zlib.error:
        inflater = None
    if inflater is None or not inflater.eof or inflater.unused_data:
        raise InvalidArgument(f"the request body is not valid {encoding} data")
    return b"".join(parts)
