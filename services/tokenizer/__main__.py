"""Tokenizer process: `python -m services.tokenizer [--model NAME[=PATH]] [--scheduler ADDR]`."""

from __future__ import annotations

import logging
import time

from layerserve.tokenizer.v1 import tokenizer_pb2_grpc
from services.common.grpc_util import new_server
from services.common.logs import setup_logging
from services.common.serve import run_service, wait_for_shutdown
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.server import TokenizerServicer
from services.tokenizer.text_model import TextModel

log = logging.getLogger("services.tokenizer")


async def main() -> None:
    config = TokenizerConfig.from_args()
    setup_logging("tokenizer")
    models = {}
    by_path: dict[str | None, TextModel] = {}  # a tokenizer is immutable: names may share one
    for name, path in config.models:
        started = time.perf_counter()
        if path not in by_path:
            by_path[path] = load_tokenizer(path)
        models[name] = by_path[path]
        log.info("loaded the tokenizer of %s in %.1fs", name, time.perf_counter() - started)
    server = new_server()
    servicer = TokenizerServicer(models, config.scheduler, config.threads, config.catalog_ttl)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    address = f"{config.host}:{config.port}"
    server.add_insecure_port(address)
    await server.start()
    log.info("tokenizer serving on %s, scheduler at %s", address, config.scheduler)
    await wait_for_shutdown()
    await server.stop(grace=2)


if __name__ == "__main__":
    run_service(main)
