"""Clients that read slowly, and clients that go away in bulk mid-stream: the gateway's memory
stays bounded, slow readers still get every token, and a request whose client left is aborted
at once, its KV blocks freed."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx

from services.stack import Stack
from tests.reliability.conftest import (
    API_KEY,
    MODEL,
    all_blocks_free,
    eventually,
    serves_normally,
)
from tests.reliability.load import completion_body, new_client, rss_mib, stack_rss
from tests.reliability.record import write_record

SLOW_READERS = 20
SLOW_TOKENS = 2000
READ_BYTES, READ_EVERY_S = 1024, 0.02  # about 50 KB/s per reader
DISCONNECTS = 100
DISCONNECT_WAVES = 3
MIXED_DROPS = 300  # more than the stack's batch (256): some are dropped while queued
FREED_WITHIN_S = 5.0
# The gateway holds what a slow reader has not read yet (at most its max_tokens, coalesced
# into fewer, larger chunks): for 20 readers x 2000 tokens, well under this.
SLOW_GROWTH_BOUND_MIB = 64.0
DISCONNECT_GROWTH_BOUND_MIB = 32.0  # per process, over the waves after the first


async def slow_read(stack: Stack, body: dict) -> tuple[int, bool]:
    """One streaming request over a socket with a small receive buffer, read slowly to the
    end. Returns (completion tokens in the usage chunk, whether [DONE] came)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sticks
    sock.connect(("127.0.0.1", stack.config.http_port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=READ_BYTES)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    )
    await writer.drain()
    received = bytearray()
    while chunk := await reader.read(READ_BYTES):
        received += chunk
        await asyncio.sleep(READ_EVERY_S)
    writer.close()
    head, _, body_bytes = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    events = [
        line[len(b"data: ") :]
        for line in _dechunk(body_bytes).split(b"\n")
        if line.startswith(b"data: ")
    ]
    usage = [json.loads(e)["usage"] for e in events if e != b"[DONE]" and b'"usage"' in e]
    tokens = usage[-1]["completion_tokens"] if usage and usage[-1] else 0
    return tokens, events[-1] == b"[DONE]"


def _dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


async def slow_readers(stack: Stack, gateway_pid: int) -> tuple[list, float]:
    """Runs the slow readers; returns their results and the gateway's peak RSS meanwhile."""
    body = completion_body(SLOW_TOKENS)
    tasks = asyncio.gather(*(slow_read(stack, body) for _ in range(SLOW_READERS)))
    peak = rss_mib(gateway_pid)
    while not tasks.done():
        peak = max(peak, rss_mib(gateway_pid))
        await asyncio.wait([tasks], timeout=0.2)
    return tasks.result(), peak


async def disconnect_in_bulk(stack: Stack, count: int) -> None:
    """Opens `count` long streams, waits for each one's first chunk, then drops them all."""
    url = f"{stack.http_url}/v1/completions"
    started = asyncio.Event()
    ready = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal ready
        async with client.stream(
            "POST", url, json=completion_body(6000), headers={"Authorization": f"Bearer {API_KEY}"}
        ) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                break
            ready += 1
            if ready == count:
                started.set()
            await started.wait()
        # Leaving the block closes the connection: the client is gone.

    async with new_client(60) as client:
        await asyncio.wait_for(asyncio.gather(*(one(client) for _ in range(count))), 60)


async def drop_after(stack: Stack, count: int, seconds: float) -> None:
    """Sends `count` long requests, every other one not streaming, and hangs up on all of them
    after `seconds`, whatever each is doing: tokenizing, queued (more than the scheduler's
    batch), or generating."""
    url = f"{stack.http_url}/v1/completions"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    full = {"model": MODEL, "prompt": "Count.", "max_tokens": 6000}
    async with new_client(60) as client:
        bodies = [completion_body(6000) if i % 2 else full for i in range(count)]
        tasks = [asyncio.ensure_future(client.post(url, json=b, headers=headers)) for b in bodies]
        done, _ = await asyncio.wait(tasks, timeout=seconds)
        assert not done, "a 6000-token request finished: it should still be running"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_slow_readers_get_every_token_with_bounded_gateway_memory(load_stack: Stack):
    stack = load_stack
    serves_normally(stack)
    gateway = stack.procs["gateway"].pid
    before = rss_mib(gateway)
    started = time.monotonic()
    results, peak = asyncio.run(slow_readers(stack, gateway))
    slow_s = time.monotonic() - started
    after = rss_mib(gateway)
    eventually(lambda: all_blocks_free(stack), "every KV block free after the slow readers")

    disconnect_rss = [stack_rss(stack)]
    freed_s = []
    for _ in range(DISCONNECT_WAVES):
        asyncio.run(disconnect_in_bulk(stack, DISCONNECTS))
        freed_s.append(
            eventually(lambda: all_blocks_free(stack), "blocks freed", timeout=FREED_WITHIN_S)
        )
        asyncio.run(drop_after(stack, MIXED_DROPS, 1.0))
        freed_s.append(
            eventually(lambda: all_blocks_free(stack), "blocks freed", timeout=FREED_WITHIN_S)
        )
        disconnect_rss.append(stack_rss(stack))
    serves_normally(stack)
    write_record(
        "slow_clients",
        "slow readers and clients that disconnect in bulk",
        {
            "load": f"{SLOW_READERS} streams of {SLOW_TOKENS} tokens read at ~50 KB/s through a "
            f"4 KiB receive buffer; then {DISCONNECT_WAVES} waves of {DISCONNECTS} streams "
            f"(max_tokens 6000) dropped together after their first chunk, each followed by "
            f"{MIXED_DROPS} requests (half streaming, half not) dropped after 1s",
            "faults": [
                f"{(DISCONNECTS + MIXED_DROPS) * DISCONNECT_WAVES} clients hanging up mid-request"
            ],
            "outcomes": {
                "completed": sum(t == SLOW_TOKENS and done for t, done in results),
                "errored": 0,
                "lost": sum(not (t == SLOW_TOKENS and done) for t, done in results),
            },
            "rss_mib": {
                "gateway before slow readers": {"gateway": round(before, 1)},
                "gateway peak during slow readers": {"gateway": round(peak, 1)},
                "gateway after slow readers": {"gateway": round(after, 1)},
                **{f"after disconnect wave {i}": r for i, r in enumerate(disconnect_rss) if i},
            },
            "notes": [
                f"the slow readers took {slow_s:.1f}s to read their streams",
                "every KV block free again "
                + ", ".join(f"{s:.2f}s" for s in freed_s)
                + " after each bulk hang-up",
                "the hung-up requests asked for 6000 tokens each: their blocks come free this "
                "soon only because they were aborted when their clients left",
                f"bounds: the gateway's peak RSS during the slow readers <= "
                f"{SLOW_GROWTH_BOUND_MIB:g} MiB above its RSS before; each process's RSS after "
                f"the last hang-up wave <= {DISCONNECT_GROWTH_BOUND_MIB:g} MiB above the first's",
            ],
        },
    )
    assert results == [(SLOW_TOKENS, True)] * SLOW_READERS
    assert peak - before < SLOW_GROWTH_BOUND_MIB, (before, peak)
    for name, first in disconnect_rss[1].items():
        assert disconnect_rss[-1][name] - first < DISCONNECT_GROWTH_BOUND_MIB, name
