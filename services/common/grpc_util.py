"""gRPC plumbing shared by the services: channel and server options, error translation, and
internal authentication (services/common/internal_auth.py) on every internal server and
channel built here."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from services.common.env import env_float
from services.common.errors import LayerserveError
from services.common.grpc_status import grpc_code
from services.common.internal_auth import InternalAuth
from services.common.settings import SettingError, exit_for_setting
from services.common.tls import TlsSettings
from services.common.token_channel import TokenChannel
from services.common.token_check import TokenCheck

log = logging.getLogger(__name__)

T = TypeVar("T")

# Long prompts and big step batches exceed gRPC's 4 MiB default.
MESSAGE_LIMIT = 64 * 1024 * 1024
# A peer that stops answering without closing its connections (a stopped process, a host gone
# from the network) is found by keepalive pings: one unanswered for KEEPALIVE_TIMEOUT_S closes
# the connection, and its calls end UNAVAILABLE as if the peer had died (a worker's requests
# fail over, its link reconnects). gRPC core answers pings off the Python thread, so a long
# model step never looks hung. LAYERSERVE_GRPC_KEEPALIVE_S / _TIMEOUT_S: tests shorten them.
try:  # read at import: a bad value stops the process before it starts (one line, status 2)
    KEEPALIVE_S = env_float("GRPC_KEEPALIVE_S", 10.0)
    KEEPALIVE_TIMEOUT_S = env_float("GRPC_KEEPALIVE_TIMEOUT_S", 10.0)
except SettingError as _err:
    exit_for_setting("layerserve", _err)
RECONNECT_BACKOFF_MS = (500, 2_000)  # first and longest wait between dials
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    # Newer gRPC cores time pings out on this instead (60 s by default).
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ("grpc.keepalive_permit_without_calls", 1),
    # Keep pinging while a call waits for an answer that does not come (no data either way):
    # by default a client stops after two pings without data, and a hang would go unseen.
    ("grpc.http2.max_pings_without_data", 0),
    # Redial a peer that is not there yet (a worker loading its model, a service restarting)
    # every 0.5-2 s: gRPC's default backoff grows 1.6x a try up to 2 min, so a scheduler that
    # started dialling a loading worker connected 4-27 s after the worker was ready.
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
]
# The clients above ping every KEEPALIVE_S, idle or not. A server's default policy takes a ping
# sooner than 5 min after the last one without data as abuse, and after two it sends GOAWAY
# "too_many_pings": every stream on the connection dies, a whole session of requests with it
# (seen after an idle minute or two). So servers accept those pings.
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),  # never GOAWAY over pings
]


def new_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    *,
    public: bool = False,
    auth: InternalAuth | None = None,
) -> grpc.aio.Server:
    """interceptors: e.g. the DrainGate (services/common/drain_gate.py) of a drainable server.
    An internal server (not `public`, the gateway's API) refuses calls without the internal
    token when one is configured, before any other interceptor sees them."""
    checks: list[grpc.aio.ServerInterceptor] = []
    auth = process_auth() if auth is None else auth
    if not public and auth.token:
        checks.append(TokenCheck(auth))
    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=[*checks, *interceptors])


@functools.cache
def process_tls() -> TlsSettings:
    """This process's TLS settings (LAYERSERVE_TLS_*), read once; ValueError if inconsistent."""
    return TlsSettings.from_env()


@functools.cache
def process_auth() -> InternalAuth:
    """This process's internal token settings (LAYERSERVE_INTERNAL_TOKEN*), read once."""
    return InternalAuth.from_env()


def add_port(
    server: grpc.aio.Server,
    address: str,
    tls: TlsSettings | None = None,
    *,
    public: bool = False,
    auth: InternalAuth | None = None,
) -> int:
    """Binds `address` with TLS when it is configured (mutual under client auth), else in
    plaintext; returns the port bound. An internal port beyond loopback needs the internal
    token or mutual TLS (or LAYERSERVE_ALLOW_INSECURE_INTERNAL=1): ValueError otherwise."""
    tls = process_tls() if tls is None else tls
    tls.require_serving()
    if not public:
        (process_auth() if auth is None else auth).check_bind(address, tls)
    if not tls.can_serve:
        return server.add_insecure_port(address)
    cert, key, ca = tls.read()
    credentials = grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=ca if tls.client_auth else None,
        require_client_auth=tls.client_auth,
    )
    return server.add_secure_port(address, credentials)


def new_channel(
    address: str, tls: TlsSettings | None = None, auth: InternalAuth | None = None
) -> grpc.aio.Channel:
    """A channel to another service: TLS when configured, else plaintext; every call carries
    the internal token when there is one."""
    tls = process_tls() if tls is None else tls
    if not tls.enabled:
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.aio.secure_channel(address, _credentials(tls), options=_options(tls))
    return _with_token(channel, auth)


def new_sync_channel(
    address: str, tls: TlsSettings | None = None, auth: InternalAuth | None = None
) -> grpc.Channel:
    """new_channel for blocking callers (the launcher's probes, the admin CLI)."""
    tls = process_tls() if tls is None else tls
    if not tls.enabled:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.secure_channel(address, _credentials(tls), options=_options(tls))
    return _with_token(channel, auth)


def _with_token(channel: T, auth: InternalAuth | None) -> T:
    auth = process_auth() if auth is None else auth
    if not auth.token:
        return channel
    return TokenChannel(channel, auth.metadata)  # type: ignore[return-value] (a proxy of it)


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
        await context.abort(grpc_code(err), err.message)
    except grpc.aio.AbortError:
        raise
    except Exception:
        log.exception("unexpected error in %s", fn)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")
    raise AssertionError("unreachable")
