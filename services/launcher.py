"""`make run`: start the four services as separate processes, wait until each is ready, and
stop them all on Ctrl-C (or when any of them dies).

Also used by the end-to-end tests and benchmarks: `Stack(...).start()` / `.stop()`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.env import env_int, env_str

log = logging.getLogger("layerserve")


@dataclass
class StackConfig:
    http_port: int = 8000
    grpc_port: int = 50051
    tokenizer_port: int = 50059
    scheduler_port: int = 50060
    worker_ports: tuple[int, ...] = (50061,)
    model_name: str = "smollm2-135m-instruct"
    model_path: str | None = None
    null_worker: bool = False
    worker_args: list[str] = field(default_factory=list)
    scheduler_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None  # None: children log to this process's stderr
    env: dict[str, str] = field(default_factory=dict)  # added to the children's environment
    ready_timeout: float = 300.0


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"

    def start(self) -> None:
        c = self.config
        try:
            for i, port in enumerate(c.worker_ports):
                self._spawn(f"worker{i}", "services.worker", self._worker_args(port))
            workers = [arg for p in c.worker_ports for arg in ("--worker", f"127.0.0.1:{p}")]
            self._spawn(
                "scheduler",
                "services.scheduler",
                ["--port", str(c.scheduler_port), *workers, *c.scheduler_args],
            )
            model = c.model_name + (f"={c.model_path}" if c.model_path else "")
            self._spawn(
                "tokenizer",
                "services.tokenizer",
                [
                    "--port",
                    str(c.tokenizer_port),
                    "--model",
                    model,
                    "--scheduler",
                    f"127.0.0.1:{c.scheduler_port}",
                ],
            )
            self._spawn(
                "gateway",
                "services.gateway",
                [
                    "--http-port",
                    str(c.http_port),
                    "--grpc-port",
                    str(c.grpc_port),
                    "--tokenizer",
                    f"127.0.0.1:{c.tokenizer_port}",
                ],
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _worker_args(self, port: int) -> list[str]:
        c = self.config
        args = ["--port", str(port), "--model-name", c.model_name, *c.worker_args]
        if c.model_path:
            args += ["--model-path", c.model_path]
        if c.null_worker:
            args.append("--null")
        return args

    def _spawn(self, name: str, module: str, args: list[str]) -> None:
        out = None
        if self.config.log_dir is not None:
            self.config.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.config.log_dir / f"{name}.log", "w")  # noqa: SIM115 (closed in stop)
            self._logs.append(out)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            env={**os.environ, **self.config.env},
            start_new_session=True,
        )

    def _wait_ready(self) -> None:
        c = self.config
        deadline = time.monotonic() + c.ready_timeout
        checks = [
            ("scheduler", lambda: _serves(_scheduler_models(c.scheduler_port), c.model_name)),
            ("tokenizer", lambda: _serves(_tokenizer_models(c.tokenizer_port), c.model_name)),
            ("gateway", lambda: _http_ok(f"{self.http_url}/health")),
        ]
        for name, check in checks:
            while not _safe(check):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} was not ready within {c.ready_timeout:.0f}s")
                time.sleep(0.2)
            log.info("%s ready", name)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}")

    def kill(self, name: str) -> None:
        """Kills one service abruptly (fault-injection tests)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in self._logs:
            f.close()
        self._logs.clear()


def _safe(check) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _serves(models: list[str], name: str) -> bool:
    return name in models


def _scheduler_models(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        response = stub.ListModels(scheduler_pb2.ListModelsRequest(), timeout=2)
    return [m.id for m in response.models]


def _tokenizer_models(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        response = stub.ListModels(tokenizer_pb2.ListModelsRequest(), timeout=2)
    return [m.id for m in response.models]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def parse_args(argv: list[str] | None = None) -> StackConfig:
    p = argparse.ArgumentParser(
        prog="python -m services.launcher", description="Start the whole layerserve stack."
    )
    p.add_argument("--http-port", type=int, default=env_int("HTTP_PORT", 8000))
    p.add_argument("--grpc-port", type=int, default=env_int("GRPC_PORT", 50051))
    p.add_argument(
        "--internal-port-base",
        type=int,
        default=env_int("INTERNAL_PORT_BASE", 50059),
        help="tokenizer on BASE, scheduler on BASE+1, workers from BASE+2",
    )
    p.add_argument("--workers", type=int, default=1, help="worker replicas of the model")
    p.add_argument("--model-name", default=env_str("MODEL_NAME", "smollm2-135m-instruct"))
    p.add_argument(
        "--model-path",
        default=env_str("MODEL_PATH", "") or None,
        help="a .gguf file or a Llama checkpoint directory (default: SmolLM2-135M)",
    )
    p.add_argument("--null-worker", action="store_true", help="workers without a model")
    a = p.parse_args(argv)
    base = a.internal_port_base
    return StackConfig(
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        tokenizer_port=base,
        scheduler_port=base + 1,
        worker_ports=tuple(base + 2 + i for i in range(a.workers)),
        model_name=a.model_name,
        model_path=a.model_path,
        null_worker=a.null_worker,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s launcher: %(message)s"
    )
    config = parse_args(argv)
    stack = Stack(config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        stack.start()
        log.info(
            "layerserve is up: OpenAI API at http://127.0.0.1:%d/v1, gRPC at 127.0.0.1:%d "
            "(model %s). Ctrl-C stops it.",
            config.http_port,
            config.grpc_port,
            config.model_name,
        )
        while True:
            stack.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        log.info("stopping")
    except RuntimeError as err:
        log.error("%s; stopping the stack", err)
        stack.stop()
        sys.exit(1)
    finally:
        stack.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
