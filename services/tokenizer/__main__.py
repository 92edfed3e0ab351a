"""Tokenizer process: `python -m services.tokenizer [--model NAME[=PATH]] [--scheduler A,B]`."""

from __future__ import annotations

import logging
import time

from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.drain_gate import DrainGate
from services.common.grammar_pool import grammar_pool
from services.common.grpc_util import add_port, new_server, process_tls
from services.common.health import Health, service_name
from services.common.logs import setup_logging
from services.common.metrics import serve_metrics
from services.common.serve import drain_server, run_service, wait_for_shutdown
from services.common.tracing import setup_tracing, shutdown_tracing
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.server import TokenizerServicer
from services.tokenizer.text_model import TextModel

log = logging.getLogger("services.tokenizer")


async def main() -> None:
    config = TokenizerConfig.from_args()
    setup_logging("tokenizer")
    grammar_pool()  # reads its settings now: a bad one stops the start, not a request
    setup_tracing("tokenizer")  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    if config.defaults_file() is None:
        log.info("model sampling defaults off (--generation-config off): the APIs' own apply")
    models = {}
    by_path: dict[str | None, TextModel] = {}  # a tokenizer is immutable: names may share one
    for name, path in config.models:
        started = time.perf_counter()
        if path not in by_path:
            by_path[path] = load_tokenizer(path, config.defaults_file())
        models[name] = by_path[path]
        log.info("loaded the tokenizer of %s in %.1fs", name, time.perf_counter() - started)
    gate = DrainGate("the tokenizer service")
    server = new_server([gate])
    servicer = TokenizerServicer(
        models,
        config.scheduler,
        config.threads,
        config.catalog_ttl,
        tool_parser=config.tool_parser,
        redis_url=config.redis_url,
        max_migrations=config.max_migrations,
        defaults_file=config.defaults_file(),
    )
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    # Ready: its tokenizers are loaded (above) and its scheduler is serving.
    health = Health(
        [service_name(tokenizer_pb2, "Tokenizer")], servicer.readiness, name="tokenizer"
    )
    health.add_to(server)
    address = f"{config.host}:{config.port}"
    add_port(server, address)
    serve_metrics(config.metrics_port, config.host, process_tls())
    servicer.start()
    health.start()
    await server.start()
    log.info("tokenizer serving on %s, schedulers at %s", address, config.scheduler)
    await wait_for_shutdown()
    await drain_server(
        server,
        health,
        gate,
        timeout=config.drain_timeout_s,
        name="tokenizer",
        stop_taking=[servicer.stop_taking],
    )
    await servicer.close()
    shutdown_tracing()  # after the drain: the last requests' spans go out too


if __name__ == "__main__":
    run_service(main)
