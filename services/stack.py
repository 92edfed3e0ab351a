"""The whole stack as child processes: start the four services (and a redis-server when
needed), wait until each is ready, stop them front to back. With num_schedulers > 1, that
many scheduler processes on consecutive ports: the workers register themselves, worker j of
each model at scheduler j mod N (its home) with the others as fallbacks, and the tokenizer
routes across them all. Used by `make run`
(services/launcher.py), the end-to-end tests and the benchmarks: `Stack(...).start()` /
`.stop()`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2
from layerserve.worker.v1 import worker_pb2
from services.common.grpc_util import new_sync_channel
from services.common.health import service_name
from services.common.internal_auth import InternalAuth, new_token
from services.common.tls import TlsSettings
from services.stack_file import ModelSpec

log = logging.getLogger("layerserve")

_WORKER = service_name(worker_pb2, "Worker")
_SCHEDULER = service_name(scheduler_pb2, "Scheduler")
_TOKENIZER = service_name(tokenizer_pb2, "Tokenizer")


@dataclass
class StackConfig:
    http_port: int = 8000
    grpc_port: int = 50051
    tokenizer_port: int = 50059
    scheduler_port: int = 50060  # the first scheduler's
    num_schedulers: int = 1
    # The other schedulers' ports (num_schedulers - 1 of them); empty: those after the first's.
    other_scheduler_ports: tuple[int, ...] = ()
    worker_ports: tuple[int, ...] = (50061,)  # one per worker, models in order
    model_name: str = "smollm2-135m-instruct"
    model_path: str | None = None
    null_worker: bool = False
    worker_args: list[str] = field(default_factory=list)  # for every worker
    # Workers register themselves with the scheduler (--register-with; the scheduler runs with
    # --worker-registration and no --worker). Needs LAYERSERVE_ADMIN_KEY in `env`.
    worker_registration: bool = False
    # Several models: replaces model_name/model_path (worker_ports then has one port per
    # replica, in order). Empty: the one model above, one worker per port.
    models: tuple[ModelSpec, ...] = ()
    aliases_file: Path | None = None  # a TOML file with an [aliases] table, for the scheduler
    scheduler_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None  # None: children log to this process's stderr
    env: dict[str, str] = field(default_factory=dict)  # added to the children's environment
    ready_timeout: float = 300.0
    # Seconds each service gets after SIGTERM to drain before it is killed (the services'
    # own --drain-timeout-s defaults to 30).
    stop_timeout: float = 40.0
    # "auto": LAYERSERVE_REDIS_URL if set, else a redis-server from PATH on a free port, else
    # none (said at start-up). "off": no Redis.
    redis: str = "auto"
    # Prometheus /metrics ports by process name ("tokenizer", "scheduler", "worker0", ...);
    # a process not named serves none. The gateway's are on its HTTP port. Each process gets
    # its own --metrics-port, so a LAYERSERVE_METRICS_PORT in the environment (one port for
    # every service, as in a container) cannot make them collide.
    metrics_ports: dict[str, int] = field(default_factory=dict)

    @property
    def scheduler_ports(self) -> tuple[int, ...]:
        others = self.other_scheduler_ports
        if not others:
            others = tuple(self.scheduler_port + k for k in range(1, self.num_schedulers))
        if len(others) != self.num_schedulers - 1:
            raise ValueError(f"{self.num_schedulers} schedulers but {len(others) + 1} ports")
        return (self.scheduler_port, *others)

    def scheduler_names(self) -> list[str]:
        """Process names: "scheduler" alone, else scheduler0, scheduler1, ..."""
        if self.num_schedulers == 1:
            return ["scheduler"]
        return [f"scheduler{k}" for k in range(self.num_schedulers)]

    def scheduler_orders(self) -> list[list[int]]:
        """Each worker's schedulers (indexes), models in order: replica j's home is j mod N,
        then the others, rotated by j // N so that a lost scheduler's workers spread over the
        survivors instead of all moving to the next one."""
        n = self.num_schedulers
        orders = []
        for spec in self.model_specs():
            for j in range(spec.replicas):
                home, turn = j % n, j // n
                others = [k for k in range(n) if k != home]
                if others:
                    turn %= len(others)
                    others = others[turn:] + others[:turn]
                orders.append([home, *others])
        return orders

    def model_specs(self) -> tuple[ModelSpec, ...]:
        if self.models:
            return self.models
        return (ModelSpec(self.model_name, self.model_path, len(self.worker_ports)),)

    def metrics_args(self, process: str) -> list[str]:
        """The --metrics-port flag of a tokenizer, scheduler or worker process."""
        names = {"tokenizer", *self.scheduler_names()}
        names |= {f"worker{i}" for i in range(len(self.worker_ports))}
        unknown = set(self.metrics_ports) - names
        if unknown:
            raise ValueError(f"metrics_ports names no such process: {sorted(unknown)}")
        return ["--metrics-port", str(self.metrics_ports.get(process, 0))]

    def placements(self) -> list[tuple[ModelSpec, int]]:
        """(model, port) of every worker process."""
        specs = [spec for spec in self.model_specs() for _ in range(spec.replicas)]
        if len(specs) != len(self.worker_ports):
            raise ValueError(
                f"{len(specs)} worker replicas but {len(self.worker_ports)} worker ports"
            )
        return list(zip(specs, self.worker_ports, strict=True))


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, tuple[str, list[str]]] = {}  # name -> (module, args)
        self._redis_argv: list[str] = []
        self._logs: list = []
        # The children's LAYERSERVE_TLS_* and internal token: the readiness probes must speak
        # what they serve.
        children_env = {**os.environ, **config.env}
        self.tls = TlsSettings.from_env(children_env)
        self.auth = InternalAuth.from_env(children_env)
        if config.num_schedulers > 1 and not children_env.get("LAYERSERVE_ADMIN_KEY"):
            # Workers register themselves through the schedulers' Admin API.
            config.env["LAYERSERVE_ADMIN_KEY"] = new_token()

    @property
    def registering(self) -> bool:
        """Workers register themselves (and move between schedulers) rather than being
        listed on the scheduler's command line."""
        return self.config.worker_registration or self.config.num_schedulers > 1

    @property
    def http_url(self) -> str:
        scheme = "https" if self.tls.can_serve else "http"
        return f"{scheme}://127.0.0.1:{self.config.http_port}"

    def start(self) -> None:
        c = self.config
        try:
            orders = c.scheduler_orders()
            for i, (spec, port) in enumerate(c.placements()):
                args = [*self._worker_args(spec, port, orders[i]), *c.metrics_args(f"worker{i}")]
                self._spawn(f"worker{i}", "services.worker", args)
            workers = [arg for p in c.worker_ports for arg in ("--worker", f"127.0.0.1:{p}")]
            if self.registering:
                workers = ["--worker-registration"]
            aliases = ["--aliases", str(c.aliases_file)] if c.aliases_file else []
            redis_url = self._start_redis()
            redis = ["--redis-url", redis_url] if redis_url else []
            for name, port in zip(c.scheduler_names(), c.scheduler_ports, strict=True):
                self._spawn(
                    name,
                    "services.scheduler",
                    [
                        "--port",
                        str(port),
                        *workers,
                        *aliases,
                        *redis,
                        *c.metrics_args(name),
                        *c.scheduler_args,
                    ],
                )
            schedulers = ",".join(f"127.0.0.1:{p}" for p in c.scheduler_ports)
            prefix_index = redis if c.num_schedulers > 1 else []
            models = [
                arg
                for spec in c.model_specs()
                for arg in ("--model", spec.name + (f"={spec.path}" if spec.path else ""))
            ]
            self._spawn(
                "tokenizer",
                "services.tokenizer",
                [
                    "--port",
                    str(c.tokenizer_port),
                    *models,
                    "--scheduler",
                    schedulers,
                    *prefix_index,  # routing across schedulers by their workers' caches
                    *c.metrics_args("tokenizer"),
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
                    *redis,  # rate limits and usage, shared by gateway replicas
                    *c.gateway_args,
                ],
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _worker_args(self, spec: ModelSpec, port: int, order: list[int]) -> list[str]:
        c = self.config
        args = ["--port", str(port), "--model-name", spec.name, *c.worker_args, *spec.worker_args]
        if spec.path:
            args += ["--model-path", spec.path]
        if c.null_worker:
            args.append("--null")
        if self.registering:
            # Home first, then the others: it moves to one while home is away.
            ports = [c.scheduler_ports[k] for k in order]
            args += ["--register-with", ",".join(f"127.0.0.1:{p}" for p in ports)]
            if c.num_schedulers > 1:
                args += ["--register-heartbeat-s", "1"]  # a lost scheduler's workers move fast
        return args

    def _start_redis(self) -> str | None:
        """The Redis URL to hand the scheduler, starting a redis-server if one is needed."""
        if self.config.redis == "off" or "LAYERSERVE_REDIS_URL" in {
            **os.environ,
            **self.config.env,
        }:
            return None  # off, or the scheduler reads LAYERSERVE_REDIS_URL itself
        exe = shutil.which("redis-server")
        if exe is None:
            log.warning(
                "no Redis (LAYERSERVE_REDIS_URL unset, no redis-server on PATH): the prefix-cache "
                "index stays inside the scheduler (other scheduler replicas cannot see it and a "
                "restart loses it), and rate limits and usage are per gateway replica"
            )
            return None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._redis_argv = [exe, "--port", str(port), "--bind", "127.0.0.1"]
        self._redis_argv += ["--save", "", "--appendonly", "no"]
        self._spawn_redis()
        deadline = time.monotonic() + 10
        while not _safe(lambda: _redis_ping(port)):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server did not answer within 10s")
            time.sleep(0.05)
        log.info(
            "started redis-server on 127.0.0.1:%d for the prefix-cache index, rate limits and "
            "usage",
            port,
        )
        return f"redis://127.0.0.1:{port}/0"

    def _spawn_redis(self) -> None:
        self.procs["redis"] = subprocess.Popen(
            self._redis_argv, stdout=subprocess.DEVNULL, start_new_session=True
        )

    def _spawn(self, name: str, module: str, args: list[str], mode: str = "w") -> None:
        out = None
        if self.config.log_dir is not None:
            self.config.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.config.log_dir / f"{name}.log", mode)  # noqa: SIM115 (closed in stop)
            self._logs.append(out)
        self._commands[name] = (module, args)
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
        tls = self.tls
        # Each service's own readiness (grpc.health.v1, the gateway's /ready); the scheduler
        # is SERVING with one live worker, so it is also asked for every configured model.
        auth = self.auth
        checks = [
            (f"worker{i}", partial(_serving, port, _WORKER, tls))
            for i, port in enumerate(c.worker_ports)
        ]
        homes = [order[0] for order in c.scheduler_orders()]
        specs = [spec.name for spec in c.model_specs() for _ in range(spec.replicas)]
        for k, (name, port) in enumerate(zip(c.scheduler_names(), c.scheduler_ports, strict=True)):
            # A scheduler serves the models of the workers whose home it is (none: it waits
            # for workers to fall back to it, and is not checked).
            mine = sorted({m for m, home in zip(specs, homes, strict=True) if home == k})
            if not mine:
                continue
            checks.append((name, partial(_scheduler_serves, port, mine, tls, auth)))
        checks += [
            ("tokenizer", partial(_serving, c.tokenizer_port, _TOKENIZER, tls)),
            ("gateway", partial(_http_ok, c.http_port, "/ready", tls)),
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

    def restart(self, name: str) -> None:
        """Starts a killed (or exited) service, or Redis, again with its arguments, port
        included; its log goes on in the same file. Returns at once: the caller waits for
        readiness."""
        if self.procs[name].poll() is None:
            self.kill(name)
        if name == "redis":
            self._spawn_redis()
            return
        module, args = self._commands[name]
        self._spawn(name, module, args, mode="a")

    def stop(self) -> None:
        """Drains the stack front to back: SIGTERM to the gateway, and once it has finished
        what it had in flight and exited, the tokenizer, then the scheduler, then the workers,
        Redis last. A service still running after stop_timeout is killed."""
        for group in self._stop_order():
            running = [name for name in group if self.procs[name].poll() is None]
            for name in running:
                self.procs[name].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.config.stop_timeout
            for name in running:
                proc = self.procs[name]
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning(
                        "%s did not exit %gs after SIGTERM; killing it",
                        name,
                        self.config.stop_timeout,
                    )
                    proc.kill()
                    proc.wait()
        for f in self._logs:
            f.close()
        self._logs.clear()

    def _stop_order(self) -> list[list[str]]:
        front = [["gateway"], ["tokenizer"], self.config.scheduler_names()]
        front = [[n for n in group if n in self.procs] for group in front]
        front = [group for group in front if group]
        workers = [name for name in self.procs if name.startswith("worker")]
        ahead = {name for group in front for name in group}
        rest = [name for name in self.procs if name not in ahead and name not in workers]
        return [*front, workers, rest]


def _safe(check) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _scheduler_serves(port: int, names: list[str], tls: TlsSettings, auth: InternalAuth) -> bool:
    """Whether the scheduler on `port` is SERVING and serves each of `names`."""
    if not _serving(port, _SCHEDULER, tls):
        return False
    return set(names) <= set(_scheduler_models(port, tls, auth))


def _scheduler_models(port: int, tls: TlsSettings, auth: InternalAuth) -> list[str]:
    with new_sync_channel(f"127.0.0.1:{port}", tls, auth) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        response = stub.ListModels(scheduler_pb2.ListModelsRequest(), timeout=2)
    return [m.id for m in response.models]


def _serving(port: int, service: str, tls: TlsSettings) -> bool:
    """Whether the service on `port` reports SERVING (grpc.health.v1 Check)."""
    with new_sync_channel(f"127.0.0.1:{port}", tls, InternalAuth()) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    return response.status == health_pb2.HealthCheckResponse.SERVING


def _redis_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(16).startswith(b"+PONG")


def _http_ok(port: int, path: str, tls: TlsSettings) -> bool:
    """Whether the gateway's `path` answers 200, over HTTPS when it serves TLS."""
    if not tls.can_serve:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status == 200
    # By hand, since urllib cannot expect another name (LAYERSERVE_TLS_SERVER_NAME) than the
    # host it dials.
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
        tls.client_ssl_context().wrap_socket(
            raw, server_hostname=tls.server_name or "127.0.0.1"
        ) as conn,
    ):
        conn.sendall(request)
        return conn.recv(64).split(b" ", 2)[1:2] == [b"200"]
