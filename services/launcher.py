"""`make run`: start the four services as separate processes, wait until each is ready, start
again any that exits (services/launcher_supervisor.py), and stop them all on Ctrl-C or
SIGTERM. Internal calls carry a token generated for the run (services/common/internal_auth.py)
unless LAYERSERVE_INTERNAL_TOKEN(_FILE) gives one. By default the chat model and, when
installed, a sentence-embedding model beside it (services/launcher_embedding.py); any models,
with replicas and aliases, from a config file (`--config FILE`, see services/stack_file.py).
`layerserve doctor` checks the platform instead (services/worker/serving/doctor.py);
`layerserve bench` runs the benchmarks (benchmarks/cli.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from typing import NoReturn

from services.common.env import PREFIX, env_int, env_str
from services.common.internal_auth import new_token
from services.common.settings import SettingError, exit_for_setting
from services.launcher_embedding import AUTO, choose_embedding_model
from services.launcher_supervisor import Supervisor
from services.stack import Stack, StackConfig
from services.stack_file import ModelSpec, read_stack_file

log = logging.getLogger("layerserve")


PROG = "python -m services.launcher"


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line and exit status 2, as for every service (settings.py)."""

    def error(self, message: str) -> NoReturn:
        exit_for_setting(self.prog, message)


def parse_args(argv: list[str] | None = None) -> StackConfig:
    """Raises SettingError for a bad LAYERSERVE_* variable; exits 2 for a bad flag."""
    p = _Parser(
        prog=PROG,
        description="Start the whole layerserve stack. "
        "`layerserve doctor` checks the GPU, driver, torch and triton without starting it.",
    )
    p.add_argument("--http-port", type=int, default=env_int("HTTP_PORT", 8000))
    p.add_argument("--grpc-port", type=int, default=env_int("GRPC_PORT", 50051))
    p.add_argument(
        "--internal-port-base",
        type=int,
        default=env_int("INTERNAL_PORT_BASE", 50059),
        help="tokenizer on BASE, schedulers from BASE+1, workers after the schedulers",
    )
    p.add_argument(
        "--schedulers",
        type=int,
        default=env_int("SCHEDULERS", 1),
        help="scheduler processes (default 1); each model's workers are spread among them "
        "(worker j's home is scheduler j mod N), move to another when theirs is gone and come "
        "back when it returns; the tokenizer routes across them and moves the requests of a "
        "lost one to another",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of models (name, path, replicas, worker_args) and aliases; "
        "replaces --workers, --model-name and --model-path (see configs/two-models.toml)",
    )
    p.add_argument("--workers", type=int, help="worker replicas of the model (default 1)")
    p.add_argument("--model-name", help="default: smollm2-135m-instruct")
    p.add_argument(
        "--model-path", help="a .gguf file or a Llama checkpoint directory (default: SmolLM2-135M)"
    )
    p.add_argument(
        "--embedding-model",
        metavar="auto|off|DIR",
        help="a sentence-embedding model served beside the chat model, one more worker "
        "(LAYERSERVE_EMBEDDING_MODEL; default auto: all-minilm-l6-v2 when installed, unless "
        "--model-path or --null-worker)",
    )
    p.add_argument("--null-worker", action="store_true", help="workers without a model")
    p.add_argument(
        "--metrics-port-base",
        type=int,
        default=env_int("METRICS_PORT_BASE", 0),
        help="Prometheus /metrics of the tokenizer on BASE, the schedulers from BASE+1, workers "
        "after them (0: none; the gateway's are always at http-port/metrics)",
    )
    a = p.parse_args(argv)
    if a.schedulers < 1:
        p.error(f"--schedulers must be at least 1, got {a.schedulers}")
    base = a.internal_port_base
    n = a.schedulers
    config = StackConfig(
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        tokenizer_port=base,
        scheduler_port=base + 1,
        num_schedulers=n,
        null_worker=a.null_worker,
    )
    if a.config:
        if a.workers is not None or a.model_name or a.model_path or a.embedding_model:
            p.error("--config takes the models from the file: drop --workers/--*model*")
        try:
            file = read_stack_file(a.config)
        except (OSError, ValueError) as err:
            p.error(str(err))
        config.models = file.models
        config.aliases_file = file.path
        config.model_name = file.models[0].name
        num_workers = sum(m.replicas for m in file.models)
    else:
        config.model_name = a.model_name or env_str("MODEL_NAME", "smollm2-135m-instruct")
        config.model_path = a.model_path or env_str("MODEL_PATH", "") or None
        try:
            config.models = _with_embedding_model(a, config)
        except ValueError as err:
            p.error(str(err))
        num_workers = (a.workers or 1) + max(0, len(config.models) - 1)
    config.worker_ports = tuple(base + 1 + n + i for i in range(num_workers))
    if a.metrics_port_base:
        metrics = a.metrics_port_base
        config.metrics_ports = {"tokenizer": metrics}
        config.metrics_ports |= {s: metrics + 1 + k for k, s in enumerate(config.scheduler_names())}
        config.metrics_ports |= {f"worker{i}": metrics + 1 + n + i for i in range(num_workers)}
    return config


def _with_embedding_model(a: argparse.Namespace, config: StackConfig) -> tuple[ModelSpec, ...]:
    """The chat model and the embedding model beside it, or () for the chat model alone (the
    StackConfig of one model, as before issue 30)."""
    choice = a.embedding_model or env_str("EMBEDDING_MODEL", AUTO)
    embedding = choose_embedding_model(choice, config.model_path, a.null_worker)
    if embedding.note:
        log.info("%s", embedding.note)
    if embedding.spec is None:
        return ()
    if embedding.spec.name == config.model_name:
        raise ValueError(f"the chat and embedding models are both named {config.model_name}")
    chat = ModelSpec(config.model_name, config.model_path, a.workers or 1)
    return (chat, embedding.spec)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["doctor"]:
        # Its own process: the doctor imports torch, which the launcher never needs.
        doctor = [sys.executable, "-m", "services.worker.serving.doctor", *args[1:]]
        sys.exit(subprocess.call(doctor))
    if args[:1] == ["bench"]:
        # Its own process too: benchmarks/cli.py loads torch and transformers.
        sys.exit(subprocess.call([sys.executable, "-m", "benchmarks.cli", *args[1:]]))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s launcher: %(message)s"
    )
    try:
        config = parse_args(argv)
    except SettingError as err:
        exit_for_setting(PROG, err)
    config.env.update(internal_token_env(os.environ))
    config.env.update(console_env(os.environ, config))
    stack = Stack(config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        stack.start()  # a process that fails to start stops the launcher: a bad setting
        log.info(
            "layerserve is up: console at %s/, OpenAI API at %s/v1 (metrics at /metrics), gRPC "
            "at 127.0.0.1:%d (models %s). Ctrl-C stops it.",
            stack.http_url,
            stack.http_url,
            config.grpc_port,
            ", ".join(spec.name for spec in config.model_specs()),
        )
        supervisor = Supervisor(stack)
        while True:
            supervisor.poll()
            time.sleep(0.5)
    except KeyboardInterrupt:
        log.info("stopping")
    except (RuntimeError, TimeoutError) as err:
        log.error("%s; stopping the stack", err)
        stack.stop()
        # A service that refused its settings exits 2 (settings.py): so does the launcher.
        sys.exit(2 if any(p.returncode == 2 for p in stack.procs.values()) else 1)
    finally:
        stack.stop()


def console_env(environ: dict[str, str] | os._Environ, config: StackConfig) -> dict[str, str]:
    """What the gateway's console needs (services/gateway/console_routes.py): the schedulers to
    ask for the stack's state and, unless the operator has a collector (OTEL_EXPORTER_OTLP_*),
    the gateway's own trace receiver on the port below the tokenizer's, which every service
    then exports its spans to."""
    env = {f"{PREFIX}SCHEDULER_ADDRESS": ",".join(f"127.0.0.1:{p}" for p in config.scheduler_ports)}
    collector = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not collector and not environ.get(f"{PREFIX}TRACE_RECEIVER"):
        env[f"{PREFIX}TRACE_RECEIVER"] = f"127.0.0.1:{config.tokenizer_port - 1}"
    return env


def internal_token_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The children's internal token: the operator's when set (they inherit it), else one
    made for this run, so that no process of the stack takes calls from outside it."""
    if environ.get(f"{PREFIX}INTERNAL_TOKEN") or environ.get(f"{PREFIX}INTERNAL_TOKEN_FILE"):
        return {}
    log.info("internal calls carry a token generated for this run")
    return {f"{PREFIX}INTERNAL_TOKEN": new_token()}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
