"""Tokenizer service configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import drain_timeout_setting, metrics_port_setting
from services.common.settings import check_settings, config_from_args, positive, setting
from services.tokenizer.migration import DEFAULT_MAX_MIGRATIONS
from services.tokenizer.sampling_defaults import default_defaults_file
from services.tokenizer.scheduler_addresses import parse_schedulers
from services.tokenizer.tool_format import TOOL_PARSER_CHOICES

DEFAULT_MODEL = "smollm2-135m-instruct"


def _parse_model(spec: str) -> tuple[str, str | None]:
    name, _, path = spec.partition("=")
    if not name:
        raise ValueError(f"--model needs a name: {spec!r}")
    return name, path or None


def _check_schedulers(spec: str) -> str | None:
    parse_schedulers(spec)  # raises ValueError naming what is wrong
    return None


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    host: str = setting("--host", env="TOKENIZER_HOST", default="127.0.0.1")
    port: int = setting("--port", env="TOKENIZER_PORT", default=50059)
    scheduler: str = setting(
        "--scheduler",
        env="SCHEDULER_ADDRESS",
        default="127.0.0.1:50060",
        check=_check_schedulers,
        metavar="HOST:PORT[,...]|dns:///HOST:PORT",
        help="the scheduler replicas: a comma-separated list, or a DNS name resolving to every "
        "replica (e.g. a Kubernetes headless Service), looked up again as replicas come and go",
    )
    redis_url: str = setting(  # "" = no shared prefix index; may hold a secret
        "--redis-url",
        env="REDIS_URL",
        default="",
        repr=False,
        help="the schedulers' Redis prefix-cache index (env LAYERSERVE_REDIS_URL): with several "
        "scheduler replicas, a request goes to the one whose worker caches its prefix (empty = "
        "by load alone)",
    )
    max_migrations: int = setting(
        "--max-migrations",
        env="MAX_MIGRATIONS",
        default=DEFAULT_MAX_MIGRATIONS,
        check=lambda n: None if n >= 0 else f"must be >= 0, got {n}",
        help="times a request may move to another scheduler replica when its own is lost "
        "mid-stream (0 = never: it ends with UNAVAILABLE)",
    )
    # (served name, path or None for the default)
    models: tuple[tuple[str, str | None], ...] = setting(
        "--model",
        env="TOKENIZER_MODELS",
        default=((DEFAULT_MODEL, None),),
        parse=_parse_model,
        metavar="NAME[=PATH]",
        help="a served model and its .gguf file or checkpoint directory; "
        "repeat for several (default: the embedded SmolLM2-135M-Instruct)",
    )
    threads: int = setting(
        "--threads",
        env="TOKENIZER_THREADS",
        default=2,
        check=positive,
        help="threads that tokenize prompts off the event loop",
    )
    catalog_ttl: float = setting(  # seconds between refreshes of the scheduler's models, aliases
        "--catalog-ttl",
        env="TOKENIZER_CATALOG_TTL",
        default=2.0,
        check=positive,
        help="seconds the scheduler's list of models and aliases is cached (an unknown "
        "model name refreshes it at once); a model it serves without a tokenizer here gets "
        "one loaded from the path its workers report",
    )
    tool_parser: str = setting(
        "--tool-parser",
        env="TOOL_PARSER",
        default="auto",
        choices=TOOL_PARSER_CHOICES,
        help="how models write tool calls, and are told about tools when their chat template "
        "ignores them: hermes, smollm2, or auto (per model family: smollm2 for SmolLM2, "
        "hermes otherwise)",
    )
    generation_config: str = setting(
        "--generation-config",
        env="GENERATION_CONFIG",
        default="auto",
        choices=("auto", "off"),
        help="auto: a request that leaves temperature, top_p, top_k, min_p or "
        "repetition_penalty out gets the model's recommended value (its generation_config.json, "
        "or its entry in --generation-defaults for a GGUF file); off: the API's own defaults",
    )
    generation_defaults: str = setting(
        "--generation-defaults",
        env="GENERATION_DEFAULTS",
        default="",
        metavar="FILE",
        help="the recommended sampling settings of GGUF files, by file name (default: "
        "configs/generation_defaults.toml)",
    )
    drain_timeout_s: float = drain_timeout_setting()
    metrics_port: int = metrics_port_setting()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"a model name is given twice: {names}")
        check_settings(self)

    def defaults_file(self) -> str | None:
        """The GGUF defaults table to read, or None when model defaults are off."""
        if self.generation_config == "off":
            return None
        return self.generation_defaults or str(default_defaults_file())

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> TokenizerConfig:
        return config_from_args(cls, argv, "python -m services.tokenizer")
