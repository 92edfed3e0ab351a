"""Gateway process: the OpenAI-compatible HTTP API and the public gRPC API, one event loop."""

from __future__ import annotations

import logging

from aiohttp import web
from redis.asyncio import Redis

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.common.drain_gate import DrainGate
from services.common.grammar_pool import grammar_pool
from services.common.grpc_util import add_port, process_tls
from services.common.health import Health, service_name
from services.common.logs import setup_logging
from services.common.serve import drain_server, run_service, wait_for_shutdown
from services.common.tracing import setup_tracing, shutdown_tracing
from services.gateway.concurrency import ConcurrencyLimiter, RedisLeases
from services.gateway.config import GatewayConfig
from services.gateway.console_routes import RING
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, public_server
from services.gateway.http_app import create_app
from services.gateway.lifecycle import Lifecycle
from services.gateway.listen_socket import listening_sockets
from services.gateway.prompt_log import PromptLoggingBackend
from services.gateway.rate_limiter import LocalBuckets, RateLimiter, RedisBuckets
from services.gateway.responses_store import ResponseStore
from services.gateway.tokenizer_client import TokenizerBackend
from services.gateway.usage import UsageLedger

log = logging.getLogger("services.gateway")


async def main() -> None:
    config = GatewayConfig.from_args()
    setup_logging("gateway")
    grammar_pool()  # reads its settings now: a bad one stops the start, not a request
    setup_tracing("gateway")  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    front_door = _front_door(config)
    tokenizer = TokenizerBackend(config.tokenizer)
    backend = PromptLoggingBackend(tokenizer) if config.log_prompts else tokenizer
    if config.log_prompts:
        log.warning("LAYERSERVE_LOG_PROMPTS is on: prompts and completions go to this log")
    lifecycle = Lifecycle(tokenizer.readiness)
    app = create_app(
        backend,
        front_door=front_door,
        limits=config.limits,
        lifecycle=lifecycle,
        responses=_response_store(config),
    )
    # handler_cancellation: a client that hangs up cancels its handler, which aborts the
    # request in the backend (non-streaming requests too).
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    # Public ports: TLS when configured, but never a client certificate (API keys
    # authenticate callers there; mutual TLS is for the internal hops).
    public_tls = process_tls().without_client_auth()
    ssl_context = public_tls.server_ssl_context() if public_tls.can_serve else None
    for sock in listening_sockets(config.host, config.http_port, config.send_buffer_bytes):
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    gate = DrainGate("the gateway")
    grpc_server = public_server(config.limits, [gate])
    gateway_pb2_grpc.add_GatewayServicer_to_server(
        GatewayServicer(backend, front_door, config.limits, app[RING]), grpc_server
    )
    health = Health(
        [service_name(gateway_pb2, "Gateway")], lifecycle.problem, interval=1.0, name="gateway"
    )
    health.add_to(grpc_server)
    health.start()
    add_port(grpc_server, f"{config.host}:{config.grpc_port}", public_tls, public=True)
    await grpc_server.start()
    log.info(
        "OpenAI API at %s://%s:%d/v1, gRPC API at %s:%d%s",
        "https" if ssl_context else "http",
        config.host,
        config.http_port,
        config.host,
        config.grpc_port,
        " (TLS)" if ssl_context else "",
    )
    await wait_for_shutdown()
    await drain_server(
        grpc_server,
        health,
        gate,
        timeout=config.drain_timeout_s,
        name="gateway",
        stop_taking=[lifecycle.begin_drain],
        busy=lambda: gate.in_flight + lifecycle.in_flight,
    )
    await runner.cleanup()
    await tokenizer.close()
    shutdown_tracing()  # after the drain: the last requests' spans go out too


def _front_door(config: GatewayConfig) -> FrontDoor:
    if not config.keys.enabled:
        log.warning(
            "no API keys configured (LAYERSERVE_API_KEYS or --api-keys-file): "
            "accepting every request without authentication"
        )
    else:
        log.info("%d API keys configured", len(config.keys))
    if config.redis_url:
        redis = Redis.from_url(config.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        buckets = RedisBuckets(redis)
        log.info("rate limits and usage kept in Redis, shared by every gateway replica")
    else:
        redis = None
        buckets = LocalBuckets()
        log.info("no Redis: rate limits and usage are per gateway replica")
    fail_open = config.rate_limit_fail_open
    limiter = RateLimiter(buckets, fail_open=fail_open)
    leases = RedisLeases(redis) if redis is not None else None
    return FrontDoor(
        config.keys,
        limiter,
        UsageLedger(redis),
        max_inflight=config.max_inflight,
        concurrency=ConcurrencyLimiter(leases, fail_open=fail_open),
    )


def _response_store(config: GatewayConfig) -> ResponseStore:
    """The Responses API's stored responses: in Redis when the gateway has one."""
    if not config.redis_url:
        return ResponseStore()
    return ResponseStore(
        Redis.from_url(config.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
    )


if __name__ == "__main__":
    run_service(main)
