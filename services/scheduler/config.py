"""Scheduler configuration: CLI flags over LAYERSERVE_SCHEDULER_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from services.common.env import env_float, env_int, env_list, env_str
from services.common.metrics import add_metrics_port_flag, check_metrics_port
from services.common.serve import (
    DEFAULT_DRAIN_TIMEOUT_S,
    add_drain_timeout_flag,
    check_drain_timeout,
)

ROUTING_MODES = ("prefix", "load", "round-robin")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    host: str
    port: int
    workers: tuple[str, ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    max_waiting: int = 1024
    max_queue_wait_s: float = 600.0
    enable_prefix_caching: bool = True
    aliases_file: str | None = None  # a TOML file whose [aliases] table is loaded at start
    admin_key: str = field(default="", repr=False)  # "" = the Admin API refuses every call
    routing: str = "prefix"  # round-robin | load | prefix (see routing.py)
    redis_url: str = field(default="", repr=False)  # "" = no shared prefix index; may hold a secret
    prefix_index_ttl_s: float = 10.0  # a worker's Redis entries outlive its last heartbeat by this
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, for requests in flight
    metrics_port: int = 0  # Prometheus /metrics on --host; 0 = none
    # Workers register themselves (Admin API AddWorker; services/worker/registration.py), so
    # --worker may be left out: the scheduler then starts with none and is not ready until one
    # has registered.
    worker_registration: bool = False

    def __post_init__(self) -> None:
        if not self.workers and not self.worker_registration:
            raise ValueError(
                "give at least one --worker HOST:PORT, or --worker-registration to start "
                "without workers and wait for workers started with --register-with"
            )
        if self.worker_registration and not self.admin_key:
            raise ValueError(
                "--worker-registration needs LAYERSERVE_ADMIN_KEY: workers register through "
                "the Admin API, with that key"
            )
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("--max-num-batched-tokens and --max-num-seqs must be positive")
        if self.max_waiting < 1:
            raise ValueError(f"--max-waiting must be positive, got {self.max_waiting}")
        if not self.max_queue_wait_s > 0:
            raise ValueError(f"--max-queue-wait-s must be positive, got {self.max_queue_wait_s}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"--routing must be one of {', '.join(ROUTING_MODES)}")
        if not self.prefix_index_ttl_s > 0:
            raise ValueError(f"--prefix-index-ttl must be positive, got {self.prefix_index_ttl_s}")
        check_drain_timeout(self.drain_timeout_s)
        check_metrics_port(self.metrics_port)

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> SchedulerConfig:
        p = argparse.ArgumentParser(prog="python -m services.scheduler")
        p.add_argument("--host", default=env_str("SCHEDULER_HOST", "127.0.0.1"))
        p.add_argument("--port", type=int, default=env_int("SCHEDULER_PORT", 50060))
        p.add_argument(
            "--worker",
            action="append",
            dest="workers",
            help="a worker's HOST:PORT; repeat for replicas (default 127.0.0.1:50061)",
        )
        p.add_argument(
            "--max-num-batched-tokens", type=int, default=env_int("MAX_NUM_BATCHED_TOKENS", 1024)
        )
        p.add_argument("--max-num-seqs", type=int, default=env_int("MAX_NUM_SEQS", 64))
        p.add_argument(
            "--max-waiting",
            type=int,
            default=env_int("MAX_WAITING", 1024),
            help="requests queued per worker before submits are refused (RESOURCE_EXHAUSTED)",
        )
        p.add_argument(
            "--max-queue-wait-s",
            type=float,
            default=env_float("MAX_QUEUE_WAIT_S", 600.0),
            help="a request not started after this many seconds ends with DEADLINE_EXCEEDED",
        )
        p.add_argument(
            "--prefix-caching",
            action=argparse.BooleanOptionalAction,
            default=env_int("PREFIX_CACHING", 1) != 0,
            help="reuse the KV blocks of shared prompt prefixes (env LAYERSERVE_PREFIX_CACHING=0)",
        )
        p.add_argument(
            "--aliases",
            default=env_str("SCHEDULER_ALIASES", "") or None,
            metavar="FILE",
            help="a TOML file whose [aliases] table defines model aliases (a stack config file)",
        )
        p.add_argument(
            "--routing",
            choices=ROUTING_MODES,
            default=env_str("ROUTING", "prefix"),
            help="how a model's replicas share requests: prefix (where the prompt's prefix is "
            "cached, weighed against load; the default), load, or round-robin",
        )
        p.add_argument(
            "--redis-url",
            default=env_str("REDIS_URL", ""),
            help="Redis holding the prefix-cache index shared by scheduler replicas, e.g. "
            "redis://127.0.0.1:6379/0 (env LAYERSERVE_REDIS_URL; empty = in-process only)",
        )
        p.add_argument(
            "--prefix-index-ttl",
            type=float,
            default=env_float("PREFIX_INDEX_TTL_S", 10.0),
            help="seconds a worker's Redis entries outlive its last heartbeat",
        )
        p.add_argument(
            "--worker-registration",
            action=argparse.BooleanOptionalAction,
            default=env_int("WORKER_REGISTRATION", 0) != 0,
            help="accept workers that register themselves (python -m services.worker "
            "--register-with); no --worker needed (env LAYERSERVE_WORKER_REGISTRATION=1)",
        )
        add_drain_timeout_flag(p)
        add_metrics_port_flag(p)
        a = p.parse_args(argv)
        # Without registration, no --worker means the one worker of `make run`'s defaults.
        default = [] if a.worker_registration else ["127.0.0.1:50061"]
        workers = a.workers or env_list("SCHEDULER_WORKERS") or default
        return cls(
            a.host,
            a.port,
            tuple(workers),
            a.max_num_batched_tokens,
            a.max_num_seqs,
            max_waiting=a.max_waiting,
            max_queue_wait_s=a.max_queue_wait_s,
            enable_prefix_caching=a.prefix_caching,
            aliases_file=a.aliases,
            # From the environment only: a flag would show the key in `ps`.
            admin_key=env_str("ADMIN_KEY", ""),
            routing=a.routing,
            redis_url=a.redis_url,
            prefix_index_ttl_s=a.prefix_index_ttl,
            drain_timeout_s=a.drain_timeout_s,
            metrics_port=a.metrics_port,
            worker_registration=a.worker_registration,
        )
