"""Scheduler process: `python -m services.scheduler --worker HOST:PORT [...]`."""

from __future__ import annotations

import logging

from layerserve.scheduler.v1 import scheduler_pb2_grpc
from services.common.grpc_util import new_server
from services.common.logs import setup_logging
from services.common.serve import run_service, wait_for_shutdown
from services.scheduler.config import SchedulerConfig
from services.scheduler.router import Router
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.server import SchedulerServicer
from services.scheduler.worker_link import WorkerLink

log = logging.getLogger("services.scheduler")


async def main() -> None:
    config = SchedulerConfig.from_args()
    setup_logging("scheduler")
    limits = SchedulerLimits(config.max_num_batched_tokens, config.max_num_seqs)
    links: list[WorkerLink] = []
    router = Router(links)
    servicer = SchedulerServicer(router)
    links.extend(WorkerLink(address, limits, servicer.emit) for address in config.workers)
    for link in links:
        link.start()
    server = new_server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    address = f"{config.host}:{config.port}"
    server.add_insecure_port(address)
    await server.start()
    log.info("scheduler serving on %s for workers %s", address, ", ".join(config.workers))
    await wait_for_shutdown()
    await server.stop(grace=2)
    for link in links:
        await link.stop()


if __name__ == "__main__":
    run_service(main)
