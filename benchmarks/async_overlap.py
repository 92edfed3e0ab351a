"""Asynchronous scheduling on the CPU: steps per second of the scheduler's engine loop against a
null worker whose every step sleeps a set time on its model thread (--null-step-seconds, a
stand-in for a device busy while the host is free), synchronous and one step ahead, side by
side in one run.

    PYTHONPATH=. python -m benchmarks.async_overlap [--device-ms 5] [--host-ms 0,2.5,5,10]

The host's share of a step is the scheduler's real work (scheduling, protobuf, the gRPC hop,
applying tokens) plus a busy wait of --host-ms holding the GIL, as Python host work does. Per
row: the device time d (the worker's forward_ns) and the host time h (wall per step less d, in
the synchronous run), then steps/s of each mode beside what it should approach:
1 / (h + d) step by step, 1 / max(h, d) overlapped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from benchmarks.machine import load_average
from benchmarks.routing import free_ports
from services.common.sampling import SamplingOptions
from services.scheduler.engine import Engine
from services.scheduler.output import Output
from services.scheduler.request import Request
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.step import ScheduledStep, StepResult

REQUESTS = 32
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 120


class HostWork(SchedulerObserver):
    """Busy-waits `seconds` on every step scheduled: host work that holds the GIL."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


class TimedEngine(Engine):
    """An Engine that adds host work and sums the worker's reported step times."""

    def __init__(self, address: str, host_s: float, async_scheduling: bool, emit) -> None:
        limits = SchedulerLimits(max_num_batched_tokens=1024, max_num_seqs=REQUESTS)
        super().__init__(address, limits, emit, async_scheduling=async_scheduling)
        self.host_work = HostWork(host_s)
        self.forward_ns = 0

    def _observers(self) -> list[SchedulerObserver]:
        return [*super()._observers(), self.host_work]

    async def _receive(self) -> StepResult:
        result = await super()._receive()
        self.forward_ns += result.forward_ns
        return result


@dataclass(slots=True)
class Run:
    steps: int
    wall_s: float
    device_s: float  # summed forward_ns

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s


async def run_once(address: str, host_s: float, async_scheduling: bool) -> Run:
    finished = asyncio.Event()
    done: set[str] = set()

    def emit(outputs: list[Output]) -> None:
        done.update(o.request_id for o in outputs if o.finish_reason is not None)
        if len(done) == REQUESTS:
            finished.set()

    engine = TimedEngine(address, host_s, async_scheduling, emit)
    engine.start()
    try:
        while engine.scheduler is None:
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        steps_before = engine.scheduler.stats.num_steps
        for i in range(REQUESTS):
            prompt = [100 + (i * 7 + j) % 500 for j in range(PROMPT_TOKENS)]
            options = SamplingOptions()
            engine.submit(Request(f"q{i}", prompt, OUTPUT_TOKENS, options, frozenset()))
        await asyncio.wait_for(finished.wait(), 300)
        wall = time.perf_counter() - started
        return Run(engine.scheduler.stats.num_steps - steps_before, wall, engine.forward_ns / 1e9)
    finally:
        await engine.stop()


def start_worker(port: int, device_s: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "services.worker", "--null", "--port", str(port)]
    cmd += ["--null-step-seconds", str(device_s)]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(device_ms: float, host_ms: list[float], repeats: int) -> list[dict]:
    rows = []
    (port,) = free_ports(1)
    worker = start_worker(port, device_ms / 1e3)
    address = f"127.0.0.1:{port}"
    try:
        await run_once(address, 0.0, False)  # warm-up: the worker's start, the channel
        for host in host_ms:
            runs: dict[bool, list[Run]] = {False: [], True: []}
            for _ in range(repeats):  # interleaved: the machine's load hits both alike
                for mode in (False, True):
                    runs[mode].append(await run_once(address, host / 1e3, mode))
            rows.append(_row(device_ms, host, runs))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        worker.terminate()
        worker.wait(10)
    return rows


def _row(device_ms: float, host_ms: float, runs: dict[bool, list[Run]]) -> dict:
    sync = sorted(runs[False], key=lambda r: r.steps_per_s)[len(runs[False]) // 2]
    ahead = statistics.median(r.steps_per_s for r in runs[True])
    d = sync.device_s / sync.steps
    h = sync.wall_s / sync.steps - d
    return {
        "device_ms_set": device_ms,
        "host_ms_added": host_ms,
        "d_ms": round(d * 1e3, 2),
        "h_ms": round(h * 1e3, 2),
        "sync_steps_per_s": round(sync.steps_per_s, 1),
        "bound_sync": round(1 / (h + d), 1),
        "async_steps_per_s": round(ahead, 1),
        "bound_async": round(1 / max(h, d), 1),
        "speedup": round(ahead / sync.steps_per_s, 2),
        "steps": sync.steps,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| device d (ms) | host h (ms) | sync steps/s | 1/(h+d) | async steps/s | 1/max(h,d) "
        "| async / sync |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['d_ms']} | {r['h_ms']} | {r['sync_steps_per_s']} | {r['bound_sync']} | "
            f"{r['async_steps_per_s']} | {r['bound_async']} | {r['speedup']}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-ms", type=float, default=5.0)
    parser.add_argument("--host-ms", default="0,2.5,5,10", help="busy host work added per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    host_ms = [float(x) for x in args.host_ms.split(",")]
    print(f"load average before: {load_average()}", flush=True)
    rows = asyncio.run(measure(args.device_ms, host_ms, args.repeats))
    print(f"load average after: {load_average()}")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
