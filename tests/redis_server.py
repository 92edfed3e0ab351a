"""A real redis-server on a free loopback port, for tests: start, wait for PING, stop (and
kill or restart it mid-test to inject faults)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

from tests.ports import free_ports


def free_port() -> int:
    return free_ports(1)[0]


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH")
        self._proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not self.answers_ping():
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {self._proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer PING within {timeout_s:.0f}s")
            time.sleep(0.02)

    def answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kills it abruptly (as a crash would): nothing is saved, every client is cut off."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """A fresh, empty server on the same port."""
        self.stop()
        self.start()
