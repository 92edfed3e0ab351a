"""Many streaming completions at once against a running gateway, each classified by how it
ended, and the memory of the stack's processes.

A request *completed* when its stream ended with a finish reason and `[DONE]`; it *errored*
when it ended with a clear error (a non-200 answer with an OpenAI error body, or an SSE `error`
event); anything else (a hang past the timeout, a connection cut without a word, a body that
is neither) is *lost*. The reliability goal is no request lost.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from services.stack import Stack
from tests.reliability.conftest import AUTH, MODEL

COMPLETED, ERRORED, LOST = "completed", "errored", "lost"


@dataclass(slots=True)
class Outcome:
    kind: str  # COMPLETED | ERRORED | LOST
    seconds: float  # from sending the request until it ended
    tokens: int = 0  # completion tokens received
    error: str = ""  # the error's code and message, or why the request counts as lost
    http_status: int = 0


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes if o.kind == kind)

    def counts(self) -> dict[str, int]:
        return {kind: self.count(kind) for kind in (COMPLETED, ERRORED, LOST)}

    def errors(self) -> dict[str, int]:
        """How often each error (or reason for a loss) occurred."""
        return dict(Counter(o.error for o in self.outcomes if o.kind != COMPLETED))

    def latency(self) -> dict[str, float]:
        """p50, p90 and max seconds of the completed requests."""
        seconds = sorted(o.seconds for o in self.outcomes if o.kind == COMPLETED)
        if not seconds:
            return {}
        return {
            "p50_s": round(statistics.median(seconds), 3),
            "p90_s": round(seconds[int(0.9 * (len(seconds) - 1))], 3),
            "max_s": round(seconds[-1], 3),
        }


def completion_body(max_tokens: int, prompt: str = "Count slowly, please.") -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def new_client(timeout: float) -> httpx.AsyncClient:
    """A client with no bound on its connections: each stream gets its own."""
    return httpx.AsyncClient(
        timeout=timeout, limits=httpx.Limits(max_connections=None, max_keepalive_connections=0)
    )


async def stream_once(client: httpx.AsyncClient, url: str, body: dict) -> Outcome:
    """Sends one streaming completion and reads it to the end (timeout: the client's)."""
    started = time.monotonic()
    try:
        async with client.stream("POST", url, json=body, headers=AUTH) as response:
            if response.status_code != 200:
                return _refused(response.status_code, await response.aread(), started)
            return await _read_stream(response, started)
    except httpx.TimeoutException:
        return Outcome(LOST, time.monotonic() - started, error="no answer within the timeout")
    except httpx.HTTPError as err:
        return Outcome(LOST, time.monotonic() - started, error=f"{type(err).__name__}")


def _refused(status: int, body: bytes, started: float) -> Outcome:
    seconds = time.monotonic() - started
    try:
        error = json.loads(body)["error"]
        return Outcome(ERRORED, seconds, error=f"{status} {error['code']}", http_status=status)
    except (ValueError, KeyError, TypeError):
        return Outcome(LOST, seconds, error=f"{status} without an error body", http_status=status)


async def _read_stream(response: httpx.Response, started: float) -> Outcome:
    tokens, finish = 0, None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            seconds = time.monotonic() - started
            if finish is None:
                return Outcome(LOST, seconds, tokens, "[DONE] without a finish reason", 200)
            return Outcome(COMPLETED, seconds, tokens, http_status=200)
        event = json.loads(data)
        if "error" in event:
            error = f"stream error {event['error']['code']}"
            return Outcome(ERRORED, time.monotonic() - started, tokens, error, 200)
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            finish = choice.get("finish_reason") or finish
    return Outcome(LOST, time.monotonic() - started, tokens, "stream ended without [DONE]", 200)


async def run_streams(stack: Stack, bodies: list[dict], timeout: float = 120.0) -> LoadResult:
    """Sends every body at once, each on its own connection, and waits for all to end."""
    url = f"{stack.http_url}/v1/completions"
    async with new_client(timeout) as client:
        outcomes = await asyncio.gather(*(stream_once(client, url, b) for b in bodies))
    return LoadResult(list(outcomes))


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS in /proc/<pid>/status), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def stack_rss(stack: Stack) -> dict[str, float]:
    """Resident MiB of each of the stack's live service processes, by name."""
    return {
        name: round(rss_mib(proc.pid), 1)
        for name, proc in stack.procs.items()
        if proc.poll() is None and name != "redis"
    }
