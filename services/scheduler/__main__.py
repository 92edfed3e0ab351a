"""Scheduler process: `python -m services.scheduler --worker HOST:PORT [...]`."""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY

from layerserve.scheduler.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.common.drain_gate import DrainGate
from services.common.grpc_util import add_port, new_server, process_tls
from services.common.health import Health, service_name
from services.common.logs import setup_logging
from services.common.metrics import serve_metrics
from services.common.serve import drain_server, run_service, wait_for_shutdown
from services.common.tracing import setup_tracing, shutdown_tracing
from services.scheduler.admin_server import AdminServicer
from services.scheduler.aliases import AliasTable, load_alias_file
from services.scheduler.cache_feed import CacheFeed
from services.scheduler.config import SchedulerConfig
from services.scheduler.engine import Engine
from services.scheduler.migration import Migrator
from services.scheduler.request_trace import RequestTraces
from services.scheduler.router import Router
from services.scheduler.routing import ReplicaPicker, RoutingMode
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.scheduler_metrics import SchedulerCollector
from services.scheduler.server import SchedulerServicer
from services.scheduler.worker_admin import WorkerAdmin

log = logging.getLogger("services.scheduler")


async def main() -> None:
    config = SchedulerConfig.from_args()
    setup_logging("scheduler")
    setup_tracing("scheduler")  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    limits = SchedulerLimits(
        config.max_num_batched_tokens,
        config.max_num_seqs,
        max_waiting=config.max_waiting,
        max_queue_wait_s=config.max_queue_wait_s,
        enable_prefix_caching=config.enable_prefix_caching,
    )
    aliases = AliasTable(load_alias_file(config.aliases_file) if config.aliases_file else [])
    engines: list[Engine] = []
    router = Router(engines)
    traces = RequestTraces()  # each request's spans, while it runs (when tracing is on)
    servicer = SchedulerServicer(router, aliases, traces)
    # A lost worker's requests move to another replica of their model (migration.py).
    migrator = Migrator(
        router, servicer.emit, traces, config.max_migrations, config.migration_wait_s
    )
    feed = CacheFeed(lambda: router.all_engines, config.redis_url, config.prefix_index_ttl_s)
    router.picker = ReplicaPicker(RoutingMode(config.routing), feed.view)

    def make_engine(address: str) -> Engine:
        engine = Engine(
            address,
            limits,
            servicer.emit,
            traces=traces,
            async_scheduling=config.steps_ahead(),
            proposer=config.proposer(),
            adaptive_speculation=config.speculation_policy == "adaptive",
            on_lost=migrator.lost,
            speculate_when_synchronous=config.speculation_auto,
        )
        engine.cache_events = feed.listener(engine)
        return engine

    engines.extend(make_engine(address) for address in config.workers)
    feed.start()
    for engine in engines:
        engine.start()
    gate = DrainGate("the scheduler")
    server = new_server([gate])
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    # Ready once a worker is live; the Admin API serves regardless (it adds workers).
    health = Health(
        [service_name(scheduler_pb2, "Scheduler")],
        servicer.readiness,
        always=[service_name(admin_pb2, "Admin")],
        name="scheduler",
    )
    health.add_to(server)
    admin = AdminServicer(
        WorkerAdmin(router, make_engine, servicer.emit), router, aliases, config.admin_key
    )
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    address = f"{config.host}:{config.port}"
    add_port(server, address)
    REGISTRY.register(SchedulerCollector(lambda: router.all_engines))
    serve_metrics(config.metrics_port, config.host, process_tls())
    health.start()
    await server.start()
    log.info(
        "scheduler serving on %s for workers %s%s",
        address,
        ", ".join(config.workers) or "(none yet)",
        " and those that register themselves" if config.worker_registration else "",
    )
    if not config.admin_key:
        log.info("the admin API is disabled (set LAYERSERVE_ADMIN_KEY to enable it)")
    await wait_for_shutdown()
    await drain_server(
        server,
        health,
        gate,
        timeout=config.drain_timeout_s,
        name="scheduler",
        stop_taking=[servicer.stop_taking],
    )
    for engine in router.all_engines:
        await engine.stop()
    await migrator.stop()
    await feed.stop()
    shutdown_tracing()  # after the drain: the last requests' spans go out too


if __name__ == "__main__":
    run_service(main)
