"""gRPC plumbing shared by the services: channel and server options, error translation."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from services.common.errors import LayerserveError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Long prompts and big step batches exceed gRPC's 4 MiB default.
MESSAGE_LIMIT = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def new_server() -> grpc.aio.Server:
    return grpc.aio.server(options=CHANNEL_OPTIONS)


def new_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


async def call_domain(context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
    """Runs a domain call; a LayerserveError becomes its gRPC status, anything else INTERNAL."""
    try:
        return await fn()
    except LayerserveError as err:
        await context.abort(err.grpc_code, err.message)
    except grpc.aio.AbortError:
        raise
    except Exception:
        log.exception("unexpected error in %s", fn)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")
    raise AssertionError("unreachable")
