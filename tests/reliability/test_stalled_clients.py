"""Issue 17 row 3 on a real stack (null worker): streaming clients that stop reading. Each is
cut off after the gateway's stalled_client_seconds, its request aborted so the scheduler frees
its KV blocks while the client still holds its connection, and the gateway's memory stays
bounded (8 greedy such clients used to cost it +215 to +400 MB, never returned).

What makes a stall visible at all is the gateway's bounded send buffer (--send-buffer-bytes,
default 256 KiB; the stack here runs with 64 KiB): with the kernel's autotuning
(`--send-buffer-bytes 0`), each loopback connection absorbed up to 4 MiB and no write to these
100 clients blocked within 24 s.

Each test runs beside a CPU hog (a spinning process per core): the bound must hold on a
saturated machine. It used not to (+98.7 MiB against 64 on a busy fresh clone; +55 and +68 MiB
here beside the hog): the gateway, starved, read the tokenizer's session behind, and the
tokenizer sent everything queued meanwhile as one message (47,300 outputs, 4 MB), all parsed at
once; and it kept merging what a stalled client had not read until the cut-off. Both grew with
generation rate x lag. Now a message holds at most mux.MAX_BATCH outputs, and a request whose
reader leaves over choice_streams.MAX_UNREAD_TOKENS unread is stopped upstream (+21 MiB beside
the hog). The bound is 48 MiB; the time until the KV blocks are freed is a liveness check, long
on a saturated machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack import Stack
from tests.e2e.conftest import loopback_config, start_stack
from tests.reliability.conftest import API_KEY, MODEL, all_blocks_free, eventually, serves_normally
from tests.reliability.load import rss_mib
from tests.reliability.record import write_record

STALLED_CLIENT_SECONDS = 2
SEND_BUFFER_BYTES = 64 * 1024
STALLED_CLIENTS = 100
GREEDY_CLIENTS = 8  # issue 17's probe: n=16, no max_tokens
GROWTH_BOUND_MIB = 48.0
CUT_OFF = "cut off and aborted"  # what the gateway logs for each


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_args=["--num-blocks", "16384"],
        scheduler_args=["--max-num-seqs", "256"],
        log_dir=Path(tmp_path_factory.mktemp("stalled-client-logs")),
        env={
            "LAYERSERVE_API_KEYS": API_KEY,
            "LAYERSERVE_STALLED_CLIENT_SECONDS": str(STALLED_CLIENT_SECONDS),
            # A quarter of the default: each connection then fills after ~900 chunks instead of
            # ~3,500, and 100 clients' worth of writes fit the suite's time on two cores (the
            # default's 100-client run took 20-30 s here, the greedy probe 3-4 s).
            "LAYERSERVE_SEND_BUFFER_BYTES": str(SEND_BUFFER_BYTES),
        },
        redis="off",
        ready_timeout=120,
        stop_timeout=10,
    )
    stack = start_stack(config)
    yield stack
    try:
        stack.check_alive()
    finally:
        stack.stop()


@pytest.fixture(autouse=True)
def cpu_hog() -> Iterator[None]:
    """Every core busy for the test's duration, as on the busy machine of issue 27."""
    spin = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _stalled_client(port: int, body: dict) -> socket.socket:
    """A streaming chat request whose response is never read, through a 4 KiB receive buffer."""
    payload = json.dumps({"model": MODEL, "stream": True, **body}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sticks
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    )
    return sock


def _stall(stack: Stack, bodies: list[dict], timeout: float) -> dict[str, float]:
    """Starts a stalled client per body; waits (holding every connection open) until every KV
    block is free again. Returns the gateway's RSS before, at its peak and after the clients
    close, the seconds until the blocks were freed, and how many the gateway cut off."""
    gateway = stack.procs["gateway"].pid
    logs = stack.config.log_dir
    cut_before = sum(p.read_text().count(CUT_OFF) for p in logs.glob("gateway*.log"))
    before = peak = rss_mib(gateway)
    started = time.monotonic()
    sockets = [_stalled_client(stack.config.http_port, body) for body in bodies]
    try:
        eventually(lambda: not all_blocks_free(stack), "the requests running", timeout=10)

        def freed() -> bool:
            nonlocal peak
            peak = max(peak, rss_mib(gateway))
            return all_blocks_free(stack)

        eventually(freed, "KV blocks freed with every client still connected", timeout=timeout)
        freed_after = time.monotonic() - started

        def cut_off() -> int:
            return sum(p.read_text().count(CUT_OFF) for p in logs.glob("gateway*.log")) - cut_before

        # A request stopped for what its reader left unread is freed before its writer's
        # stalled_client_seconds are up: the cut-off comes after.
        eventually(lambda: cut_off() >= len(bodies), "every client cut off", timeout=timeout)
        peak = max(peak, rss_mib(gateway))
        cut = cut_off()
    finally:
        for sock in sockets:
            sock.close()
    time.sleep(0.5)  # the closes reach the gateway
    after = rss_mib(gateway)
    return {
        "before": before,
        "peak": peak,
        "after": after,
        "freed_s": freed_after,
        "cut_off": cut,
    }


def _summary(what: str, m: dict[str, float]) -> str:
    return (
        f"{what}: gateway RSS {m['before']:.0f} -> peak {m['peak']:.0f} -> {m['after']:.0f} MiB "
        f"after close; KV freed after {m['freed_s']:.1f}s; {m['cut_off']:.0f} cut off"
    )


def test_greedy_clients_that_stop_reading_cost_bounded_memory(stack: Stack) -> None:
    """n=16 and no max_tokens: 16 x the default completion length each, never read."""
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 16}
    measured = _stall(stack, [body] * GREEDY_CLIENTS, timeout=60)
    summary = _summary(f"{GREEDY_CLIENTS} stalled clients with n=16, no max_tokens", measured)
    print(summary)
    _record("stalled_greedy_clients", summary, measured)
    assert measured["cut_off"] == GREEDY_CLIENTS
    assert measured["peak"] - measured["before"] < GROWTH_BOUND_MIB
    serves_normally(stack)


def test_stalled_clients_are_cut_off_and_memory_stays_bounded(stack: Stack) -> None:
    """Streams of 8,000 tokens (over 1 MB of SSE each): the bounded send buffers fill long
    before the null worker finishes them. (With 20 top logprobs a token the gateway's CPU, not
    the client, is the bottleneck on two shared cores: too slow a probe for the suite.)"""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8000}
    measured = _stall(stack, [body] * STALLED_CLIENTS, timeout=180)
    summary = _summary(f"{STALLED_CLIENTS} stalled clients", measured)
    print(summary)
    _record("stalled_clients", summary, measured)
    assert measured["cut_off"] == STALLED_CLIENTS
    assert measured["peak"] - measured["before"] < GROWTH_BOUND_MIB
    serves_normally(stack)


def _record(name: str, summary: str, m: dict[str, float]) -> None:
    write_record(
        name,
        summary.split(":")[0],
        {
            "load": f"streaming chat requests never read, through a 4 KiB receive buffer; "
            f"stalled_client_seconds {STALLED_CLIENT_SECONDS}, send buffer "
            f"{SEND_BUFFER_BYTES // 1024} KiB",
            "rss_mib": {
                phase: {"gateway": round(m[phase], 1)} for phase in ("before", "peak", "after")
            },
            "notes": [summary],
        },
    )
