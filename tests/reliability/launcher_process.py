"""`python -m services.launcher` (what `make run` runs) as a child of the test, on free ports,
with its own redis-server and null workers; its processes found through /proc."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.reliability.conftest import API_KEY

_NAMES = ("gateway", "tokenizer", "scheduler", "worker")


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free loopback ports (the launcher's
    --internal-port-base takes the tokenizer, the scheduler and the workers in a row)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


class Launcher:
    def __init__(self, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        self.http_port, self.grpc_port = free_port_block(1), free_port_block(1)
        self.base = free_port_block(3)
        self.tokenizer_port, self.scheduler_port, self.worker_port = range(self.base, self.base + 3)
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERSERVE_")}
        env |= {"LAYERSERVE_API_KEYS": API_KEY, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        command = [sys.executable, "-m", "services.launcher", "--null-worker"]
        command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        command += ["--internal-port-base", str(self.base)]
        self._log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            assert self.proc.poll() is None, f"the launcher exited:\n{self.log()[-3000:]}"
            if "layerserve is up" in self.log():
                return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"not up within {timeout:g}s:\n{self.log()[-3000:]}")

    def children(self) -> dict[str, int]:
        """pid of each live process the launcher started, by name (worker, redis, ...)."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # The fields after the command's ")": state, ppid, ...
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) != self.proc.pid or fields[0] == "Z":
                continue
            name = _name_of([part.decode(errors="replace") for part in cmdline])
            if name:
                found[name] = int(entry)
        return found

    def wait_for_new(self, name: str, old_pid: int, timeout: float = 30.0) -> int:
        """Waits until the launcher has started `name` again; returns the new pid."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            pid = self.children().get(name)
            if pid and pid != old_pid:
                return pid
            time.sleep(0.1)
        raise AssertionError(f"{name} not started again within {timeout:g}s")

    def ok(self, max_tokens: int = 3) -> int:
        body = {"model": "smollm2-135m-instruct", "prompt": "hi", "max_tokens": max_tokens}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        try:
            url = f"{self.http_url}/v1/completions"
            return httpx.post(url, json=body, headers=headers, timeout=30).status_code
        except httpx.HTTPError:
            return 0

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, as a service manager would; returns the exit status (None: killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self._log.close()
                return None
        self._log.close()
        return self.proc.returncode


def _name_of(cmdline: list[str]) -> str | None:
    if cmdline and "redis-server" in cmdline[0]:  # it retitles itself "redis-server HOST:PORT"
        return "redis"
    if len(cmdline) >= 3 and cmdline[1] == "-m":
        module = cmdline[2].removeprefix("services.")
        return module if module in _NAMES else None
    return None
