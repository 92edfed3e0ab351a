"""gRPC plumbing shared by the services: channel and server options, error translation."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from services.common.errors import LayerserveError
from services.common.tls import TlsSettings

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
# The clients above ping every 30 s, idle or not. A server's default policy takes a ping
# sooner than 5 min after the last one without data as abuse, and after two it sends GOAWAY
# "too_many_pings": every stream on the connection dies, a whole session of requests with it
# (seen after an idle minute or two). So servers accept those pings.
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),  # never GOAWAY over pings
]


def new_server(interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """interceptors: e.g. the DrainGate (services/common/drain_gate.py) of a drainable server."""
    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=list(interceptors))


@functools.cache
def process_tls() -> TlsSettings:
    """This process's TLS settings (LAYERSERVE_TLS_*), read once; ValueError if inconsistent."""
    return TlsSettings.from_env()


def add_port(server: grpc.aio.Server, address: str, tls: TlsSettings | None = None) -> int:
    """Binds `address` with TLS when it is configured (mutual under client auth), else in
    plaintext; returns the port bound."""
    tls = process_tls() if tls is None else tls
    tls.require_serving()
    if not tls.can_serve:
        return server.add_insecure_port(address)
    cert, key, ca = tls.read()
    credentials = grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=ca if tls.client_auth else None,
        require_client_auth=tls.client_auth,
    )
    return server.add_secure_port(address, credentials)


def new_channel(address: str, tls: TlsSettings | None = None) -> grpc.aio.Channel:
    """A channel to another service: TLS when configured, else plaintext."""
    tls = process_tls() if tls is None else tls
    if not tls.enabled:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, _credentials(tls), options=_options(tls))


def new_sync_channel(address: str, tls: TlsSettings | None = None) -> grpc.Channel:
    """new_channel for blocking callers (the launcher's probes, the admin CLI)."""
    tls = process_tls() if tls is None else tls
    if not tls.enabled:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(address, _credentials(tls), options=_options(tls))


def _credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    cert, key, ca = tls.read()
    if tls.client_auth:
        return grpc.ssl_channel_credentials(ca, private_key=key, certificate_chain=cert)
    return grpc.ssl_channel_credentials(ca)


def _options(tls: TlsSettings) -> list[tuple[str, object]]:
    if tls.server_name is None:
        return CHANNEL_OPTIONS
    return [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", tls.server_name)]


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
