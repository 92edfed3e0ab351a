"""Redis killed and restarted (empty) while the stack serves: every request goes on being
served (rate limits fail open, the prefix index falls back to the scheduler's own view), and
once Redis is back the stack writes to it again."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import httpx

from services.stack import Stack
from tests.e2e.conftest import free_ports
from tests.redis_server import RedisServer
from tests.reliability.conftest import API_KEY, AUTH, MODEL
from tests.reliability.in_flight import http_stream
from tests.reliability.load import COMPLETED, ERRORED, LOST
from tests.reliability.record import write_record

PHASE_S = 3.0  # seconds before the kill, with Redis away, and after the restart
CLIENTS = 4
LONG = 3000  # tokens of a stream that spans the whole fault
# Limits far above the test's rate: each request still goes through the Redis rate limiter.
LIMIT_ARGS = ["--default-requests-per-minute", "1000000", "--default-tokens-per-minute", "10000000"]


def redis_keys(server: RedisServer) -> int:
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as conn:
        conn.sendall(b"DBSIZE\r\n")
        return int(conn.recv(64).strip().lstrip(b":"))


class RequestLoop:
    """Clients sending short chat requests back to back until stopped; records statuses."""

    def __init__(self, stack: Stack, clients: int) -> None:
        self.statuses: list[tuple[float, int]] = []  # (time.monotonic(), HTTP status)
        self._stop = threading.Event()
        url = f"{stack.http_url}/v1/chat/completions"
        self._threads = [
            threading.Thread(target=self._run, args=(url, i), daemon=True) for i in range(clients)
        ]

    def _run(self, url: str, client: int) -> None:
        body = {"model": MODEL, "max_tokens": 4}
        with httpx.Client(headers=AUTH, timeout=30) as http:
            for i in range(10**9):
                if self._stop.is_set():
                    return
                # A prompt shared by every client: the prefix index in Redis has work to do.
                content = f"Shared instructions for everyone. Client {client}, request {i}."
                messages = [{"role": "user", "content": content}]
                try:
                    status = http.post(url, json={**body, "messages": messages}).status_code
                except httpx.HTTPError:
                    status = 0  # no answer at all
                self.statuses.append((time.monotonic(), status))

    def __enter__(self) -> RequestLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def test_serving_continues_while_redis_is_killed_and_restarted(
    own_stack: Callable[..., Stack], redis_server: RedisServer
):
    stack = own_stack(
        worker_ports=tuple(free_ports(2)),
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_REDIS_URL": redis_server.url},
        gateway_args=LIMIT_ARGS,
    )
    stream = http_stream(stack, LONG)
    assert stream.started.wait(60)
    with RequestLoop(stack, CLIENTS) as loop:
        time.sleep(PHASE_S)
        assert redis_keys(redis_server) > 0  # rate-limit buckets, usage, the prefix index
        redis_server.stop()
        killed_at = time.monotonic()
        time.sleep(PHASE_S)
        redis_server.start()
        restarted_at = time.monotonic()
        time.sleep(PHASE_S)
    streamed = stream.wait()
    written_again = redis_keys(redis_server)

    during = [s for t, s in loop.statuses if killed_at <= t < restarted_at]
    failed = [s for _, s in loop.statuses if s != 200]
    write_record(
        "redis_restart",
        "Redis killed and restarted",
        {
            "load": f"{CLIENTS} clients sending short chat requests back to back, and one "
            f"{LONG}-token stream spanning the fault; two null-worker replicas, rate limits "
            "and the prefix index in Redis",
            "faults": [f"SIGKILL to redis-server, {PHASE_S:g}s away, restarted empty"],
            "outcomes": {
                COMPLETED: len(loop.statuses) - len(failed) + (streamed.kind == COMPLETED),
                ERRORED: len([s for s in failed if s]) + (streamed.kind == ERRORED),
                LOST: failed.count(0) + (streamed.kind == LOST),
            },
            "notes": [
                f"{len(during)} requests answered while Redis was away",
                f"the stack wrote {written_again} keys to the new Redis within {PHASE_S:g}s",
            ],
        },
    )
    assert failed == [], failed
    assert len(during) >= CLIENTS  # the loop kept going while Redis was away
    assert streamed.kind == COMPLETED, streamed
    assert written_again > 0  # the stack reconnected to the restarted Redis
