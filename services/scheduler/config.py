"""Scheduler configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import drain_timeout_setting, metrics_port_setting
from services.common.settings import (
    at_least,
    check_settings,
    config_from_args,
    positive,
    setting,
)
from services.scheduler.spec_decode import NgramProposer

ROUTING_MODES = ("prefix", "load", "round-robin")
# Without registration, no --worker means the one worker of `make run`'s defaults.
DEFAULT_WORKER = "127.0.0.1:50061"


def _routing_mode(mode: str) -> str | None:
    return None if mode in ROUTING_MODES else f"must be one of {', '.join(ROUTING_MODES)}"


ASYNC_SCHEDULING_CHOICES = ("auto", "on", "off")
AUTO_SPECULATIVE_TOKENS = 8  # --num-speculative-tokens auto: the k issue 21 measured


def _speculative_tokens(value: str) -> str | None:
    if value == "auto" or value.isdigit():
        return None
    return f"must be auto or an integer >= 0, got {value!r}"


DEFAULT_MAX_MIGRATIONS = 3  # as the tokenizer's
DEFAULT_MIGRATION_WAIT_S = 15.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    host: str = setting("--host", env="SCHEDULER_HOST", default="127.0.0.1")
    port: int = setting("--port", env="SCHEDULER_PORT", default=50060)
    workers: tuple[str, ...] = setting(
        "--worker",
        env="SCHEDULER_WORKERS",
        default=(),  # from_args: DEFAULT_WORKER unless --worker-registration
        help=f"a worker's HOST:PORT; repeat for replicas (default {DEFAULT_WORKER})",
    )
    max_num_batched_tokens: int = setting(
        "--max-num-batched-tokens", env="MAX_NUM_BATCHED_TOKENS", default=1024
    )
    max_num_seqs: int = setting("--max-num-seqs", env="MAX_NUM_SEQS", default=64)
    max_waiting: int = setting(
        "--max-waiting",
        env="MAX_WAITING",
        default=1024,
        check=positive,
        help="requests queued per worker before submits are refused (RESOURCE_EXHAUSTED)",
    )
    max_queue_wait_s: float = setting(
        "--max-queue-wait-s",
        env="MAX_QUEUE_WAIT_S",
        default=600.0,
        check=positive,
        help="a request not started after this many seconds ends with DEADLINE_EXCEEDED",
    )
    enable_prefix_caching: bool = setting(
        "--prefix-caching",
        env="PREFIX_CACHING",
        default=True,
        help="reuse the KV blocks of shared prompt prefixes (env LAYERSERVE_PREFIX_CACHING=0)",
    )
    # engine.py: the scheduler's host work per step overlaps the worker's step instead of
    # adding to it (docs/benchmarks.md "Asynchronous scheduling").
    # auto: on for a worker that computes on a GPU, whose steps run while the host schedules;
    # off on the CPU, where the worker's step and the host's work share the same cores and L3
    # measured slower with it (docs/benchmarks.md "Asynchronous scheduling").
    async_scheduling: str = setting(
        "--async-scheduling",
        env="ASYNC_SCHEDULING",
        default="auto",
        choices=ASYNC_SCHEDULING_CHOICES,
        help="send each engine step to the worker before the last one's result is back, so "
        "scheduling overlaps the worker's step: on, off, or auto (on for a GPU worker) "
        "(env LAYERSERVE_ASYNC_SCHEDULING)",
    )

    def steps_ahead(self) -> bool | None:
        """async_scheduling for an Engine: True, False, or None (by the worker's device)."""
        return {"on": True, "off": False}.get(self.async_scheduling)

    # Speculative decoding with n-gram lookup (spec_decode.py). A number turns it on and makes
    # steps synchronous whatever async_scheduling says. auto turns it on only where steps are
    # synchronous anyway (a CPU worker): there the adaptive policy measured 1.00x-1.22x on open
    # prompts and up to 1.88x on grounded ones (docs/benchmarks.md "Issue 21"); where the
    # engine schedules ahead (a GPU worker) it stays off rather than cost that overlap.
    num_speculative_tokens: str = setting(
        "--num-speculative-tokens",
        env="NUM_SPECULATIVE_TOKENS",
        default="auto",
        check=_speculative_tokens,
        help="speculative decoding: tokens proposed per decode step by n-gram lookup in the "
        "request's prompt and output, verified by the worker in the same step; 0 = off; auto: "
        f"{AUTO_SPECULATIVE_TOKENS} where the engine steps its worker synchronously (a CPU "
        "worker, or --async-scheduling off), off where it schedules ahead (a GPU worker) "
        "(env LAYERSERVE_NUM_SPECULATIVE_TOKENS)",
    )
    # 3..6 (not 2..4): in the benchmark, 2-token matches in text that does not repeat its
    # input proposed tokens that were mostly rejected; 3-token ones were right more often, on
    # copied text too (docs/benchmarks.md, issue 21).
    spec_ngram_min: int = setting(
        "--spec-ngram-min",
        env="SPEC_NGRAM_MIN",
        default=3,
        check=positive,
        help="the shortest suffix of a request's tokens looked up for a proposal",
    )
    spec_ngram_max: int = setting(
        "--spec-ngram-max",
        env="SPEC_NGRAM_MAX",
        default=6,
        check=positive,
        help="the longest suffix looked up (the longest one found decides)",
    )

    speculation_policy: str = setting(
        "--speculation-policy",
        env="SPECULATION_POLICY",
        default="adaptive",
        choices=("adaptive", "fixed"),
        help="adaptive: each request proposes only as many tokens as pay for themselves, from "
        "its acceptance so far and the step time per token measured (none where proposals are "
        "rejected or the step is already compute-bound); fixed: every match, up to "
        "--num-speculative-tokens, every step",
    )

    @property
    def speculation_auto(self) -> bool:
        """--num-speculative-tokens auto: the proposer only where steps are synchronous."""
        return self.num_speculative_tokens == "auto"

    def proposer(self) -> NgramProposer | None:
        """Speculative decoding's proposer; None when off. With auto, the Engine drops it for
        a worker it schedules ahead of (speculation_auto)."""
        auto = self.speculation_auto
        k = AUTO_SPECULATIVE_TOKENS if auto else int(self.num_speculative_tokens)
        if not k:
            return None
        return NgramProposer(self.spec_ngram_min, self.spec_ngram_max, k)

    aliases_file: str | None = setting(  # its [aliases] table is loaded at start
        "--aliases",
        env="SCHEDULER_ALIASES",
        metavar="FILE",
        help="a TOML file whose [aliases] table defines model aliases (a stack config file)",
    )
    # "" = the Admin API refuses every call. From the environment only: a flag would show the
    # key in `ps`.
    admin_key: str = setting(env="ADMIN_KEY", default="", repr=False)
    routing: str = setting(  # see routing.py
        "--routing",
        env="ROUTING",
        default="prefix",
        choices=ROUTING_MODES,
        check=_routing_mode,
        help="how a model's replicas share requests: prefix (where the prompt's prefix is "
        "cached, weighed against load; the default), load, or round-robin",
    )
    redis_url: str = setting(  # "" = no shared prefix index; may hold a secret
        "--redis-url",
        env="REDIS_URL",
        default="",
        repr=False,
        help="Redis holding the prefix-cache index shared by scheduler replicas, e.g. "
        "redis://127.0.0.1:6379/0 (env LAYERSERVE_REDIS_URL; empty = in-process only)",
    )
    prefix_index_ttl_s: float = setting(
        "--prefix-index-ttl",
        env="PREFIX_INDEX_TTL_S",
        default=10.0,
        check=positive,
        help="seconds a worker's Redis entries outlive its last heartbeat",
    )
    # Workers register themselves (Admin API AddWorker; services/worker/serving/registration.py),
    # so --worker may be left out: the scheduler then starts with none and is not ready until
    # one has registered.
    worker_registration: bool = setting(
        "--worker-registration",
        env="WORKER_REGISTRATION",
        default=False,
        help="accept workers that register themselves (python -m services.worker "
        "--register-with); no --worker needed (env LAYERSERVE_WORKER_REGISTRATION=1)",
    )
    # Request migration when a worker is lost (migration.py). One setting name and one count
    # across services: the tokenizer's --max-migrations bounds the same total.
    max_migrations: int = setting(
        "--max-migrations",
        env="MAX_MIGRATIONS",
        default=DEFAULT_MAX_MIGRATIONS,
        check=at_least(0),
        help="moves a request may make in all: to another worker of its model when its own is "
        "lost mid-stream (killed, connection reset, silent past the keepalive timeout), the "
        "tokenizer's moves between schedulers counted too; 0 = never: it ends with UNAVAILABLE",
    )
    migration_wait_s: float = setting(
        "--migration-wait-s",
        env="MIGRATION_WAIT_S",
        default=DEFAULT_MIGRATION_WAIT_S,
        check=at_least(0),
        help="how long a request whose worker was lost waits for another worker of its model "
        "to be ready (the lost one may come back) before it ends with UNAVAILABLE",
    )
    drain_timeout_s: float = drain_timeout_setting()
    metrics_port: int = metrics_port_setting()

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
        if self.spec_ngram_min > self.spec_ngram_max:
            raise ValueError(
                f"--spec-ngram-min {self.spec_ngram_min} exceeds --spec-ngram-max "
                f"{self.spec_ngram_max}"
            )
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("--max-num-batched-tokens and --max-num-seqs must be positive")
        check_settings(self)

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> SchedulerConfig:
        return config_from_args(cls, argv, "python -m services.scheduler", _default_worker)


def _default_worker(values: dict) -> dict:
    if not values["workers"] and not values["worker_registration"]:
        values["workers"] = (DEFAULT_WORKER,)
    return values
