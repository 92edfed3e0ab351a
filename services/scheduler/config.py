"""Scheduler configuration: CLI flags over LAYERSERVE_SCHEDULER_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common.env import env_int, env_list, env_str


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    host: str
    port: int
    workers: tuple[str, ...]
    max_num_batched_tokens: int
    max_num_seqs: int

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("give at least one --worker HOST:PORT")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("--max-num-batched-tokens and --max-num-seqs must be positive")

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
        a = p.parse_args(argv)
        workers = a.workers or env_list("SCHEDULER_WORKERS") or ["127.0.0.1:50061"]
        return cls(a.host, a.port, tuple(workers), a.max_num_batched_tokens, a.max_num_seqs)
