"""Worker process: `python -m services.worker [--model-path PATH] [--null]`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from layerserve.worker.v1 import worker_pb2_grpc
from services.common.grpc_util import new_server
from services.common.logs import setup_logging
from services.common.serve import run_service, wait_for_shutdown
from services.worker.config import WorkerConfig
from services.worker.server import Runner, WorkerServicer

log = logging.getLogger("services.worker")


def build_runner(config: WorkerConfig) -> Runner:
    if config.null:
        from services.worker.null_runner import NullRunner

        return NullRunner(block_size=config.block_size, num_blocks=config.num_blocks or 65536)
    import torch

    from services.worker.model_runner import ModelRunner

    if config.threads:
        torch.set_num_threads(config.threads)
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return ModelRunner.create(
        path=config.model_path,
        dtype=config.dtype,
        device=device,
        block_size=config.block_size,
        num_blocks=config.num_blocks,
        kv_cache_bytes=int(config.kv_cache_gb * 2**30),
        max_model_len=config.max_model_len,
    )


async def main() -> None:
    config = WorkerConfig.from_args()
    setup_logging("worker")
    started = time.perf_counter()
    runner = build_runner(config)
    log.info(
        "loaded %s on %s (%s) in %.1fs: %d KV blocks of %d tokens, max length %d",
        config.model_name + (" (null worker)" if config.null else ""),
        runner.device,
        runner.dtype,
        time.perf_counter() - started,
        runner.num_blocks,
        runner.block_size,
        runner.max_model_len,
    )
    server = new_server()
    # Absolute, so that the tokenizer service (another process, maybe another working
    # directory) can load the model's tokenizer from it.
    model_path = str(Path(config.model_path).resolve()) if config.model_path else ""
    servicer = WorkerServicer(runner, config.model_name, model_path)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    address = f"{config.host}:{config.port}"
    server.add_insecure_port(address)
    await server.start()
    log.info("worker serving on %s", address)
    await wait_for_shutdown()
    await server.stop(grace=2)


if __name__ == "__main__":
    run_service(main)
