"""Tokenizer service configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common.env import env_float, env_int, env_list, env_str
from services.common.metrics import add_metrics_port_flag, check_metrics_port
from services.common.serve import (
    DEFAULT_DRAIN_TIMEOUT_S,
    add_drain_timeout_flag,
    check_drain_timeout,
)

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    host: str
    port: int
    scheduler: str
    models: tuple[tuple[str, str | None], ...]  # (served name, path or None for the default)
    threads: int
    catalog_ttl: float = 2.0  # seconds between refreshes of the scheduler's models and aliases
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, for requests in flight
    metrics_port: int = 0  # Prometheus /metrics on --host; 0 = none

    def __post_init__(self) -> None:
        names = [name for name, _ in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"a model name is given twice: {names}")
        if self.threads < 1:
            raise ValueError(f"--threads must be positive, got {self.threads}")
        if not self.catalog_ttl > 0:
            raise ValueError(f"--catalog-ttl must be positive, got {self.catalog_ttl}")
        check_drain_timeout(self.drain_timeout_s)
        check_metrics_port(self.metrics_port)

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> TokenizerConfig:
        p = argparse.ArgumentParser(prog="python -m services.tokenizer")
        p.add_argument("--host", default=env_str("TOKENIZER_HOST", "127.0.0.1"))
        p.add_argument("--port", type=int, default=env_int("TOKENIZER_PORT", 50059))
        p.add_argument("--scheduler", default=env_str("SCHEDULER_ADDRESS", "127.0.0.1:50060"))
        p.add_argument(
            "--model",
            action="append",
            dest="models",
            metavar="NAME[=PATH]",
            help="a served model and its .gguf file or checkpoint directory; "
            "repeat for several (default: the embedded SmolLM2-135M-Instruct)",
        )
        p.add_argument(
            "--threads",
            type=int,
            default=env_int("TOKENIZER_THREADS", 2),
            help="threads that tokenize prompts off the event loop",
        )
        p.add_argument(
            "--catalog-ttl",
            type=float,
            default=env_float("TOKENIZER_CATALOG_TTL", 2.0),
            help="seconds the scheduler's list of models and aliases is cached (an unknown "
            "model name refreshes it at once); a model it serves without a tokenizer here gets "
            "one loaded from the path its workers report",
        )
        add_drain_timeout_flag(p)
        add_metrics_port_flag(p)
        a = p.parse_args(argv)
        specs = a.models or env_list("TOKENIZER_MODELS") or [DEFAULT_MODEL]
        models = tuple(_parse_model(s) for s in specs)
        return cls(
            a.host,
            a.port,
            a.scheduler,
            models,
            a.threads,
            a.catalog_ttl,
            a.drain_timeout_s,
            a.metrics_port,
        )


def _parse_model(spec: str) -> tuple[str, str | None]:
    name, _, path = spec.partition("=")
    if not name:
        raise ValueError(f"--model needs a name: {spec!r}")
    return name, path or None
