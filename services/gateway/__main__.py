"""Gateway process: the OpenAI-compatible HTTP API and the public gRPC API, one event loop."""

from __future__ import annotations

import logging

from aiohttp import web

from layerserve.gateway.v1 import gateway_pb2_grpc
from services.common.grpc_util import new_server
from services.common.logs import setup_logging
from services.common.serve import run_service, wait_for_shutdown
from services.gateway.config import GatewayConfig
from services.gateway.grpc_api import GatewayServicer
from services.gateway.http_app import create_app
from services.gateway.tokenizer_client import TokenizerBackend

log = logging.getLogger("services.gateway")


async def main() -> None:
    config = GatewayConfig.from_args()
    setup_logging("gateway")
    if not config.api_keys:
        log.warning(
            "no API keys configured (LAYERSERVE_API_KEYS or --api-keys-file): "
            "accepting every request without authentication"
        )
    backend = TokenizerBackend(config.tokenizer)
    # handler_cancellation: a client that hangs up cancels its handler, which aborts the
    # request in the backend (non-streaming requests too).
    runner = web.AppRunner(
        create_app(backend, api_keys=config.api_keys), access_log=None, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.http_port)
    await site.start()
    grpc_server = new_server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(
        GatewayServicer(backend, config.api_keys), grpc_server
    )
    grpc_server.add_insecure_port(f"{config.host}:{config.grpc_port}")
    await grpc_server.start()
    log.info(
        "OpenAI API at http://%s:%d/v1, gRPC API at %s:%d",
        config.host,
        config.http_port,
        config.host,
        config.grpc_port,
    )
    await wait_for_shutdown()
    await grpc_server.stop(grace=2)
    await runner.cleanup()
    await backend.close()


if __name__ == "__main__":
    run_service(main)
