"""A worker that stalls mid-step (its model thread wedged, its process and gRPC server alive;
injected by stall_hook/sitecustomize.py): after --step-timeout-s it reports NOT_SERVING, the
scheduler sends new requests to the other replica, and once the step returns the stalled
worker's streams go on to the end; nothing is lost."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from services.stack import Stack
from tests.e2e.conftest import free_ports
from tests.reliability.conftest import API_KEY, AUTH, MODEL, all_blocks_free, eventually
from tests.reliability.in_flight import http_stream
from tests.reliability.load import COMPLETED, LoadResult
from tests.reliability.record import write_record

HOOK = Path(__file__).parent / "stall_hook"
LONG = 2000
STEP_TIMEOUT_S = 1.0
STALL_S = 5.0


def complete(stack: Stack) -> tuple[int, float]:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    started = time.monotonic()
    url = f"{stack.http_url}/v1/completions"
    status = httpx.post(url, json=body, headers=AUTH, timeout=60).status_code
    return status, time.monotonic() - started


def test_a_worker_stalled_mid_step_is_routed_around_and_its_streams_finish(
    own_stack: Callable[..., Stack], tmp_path: Path
):
    stack = own_stack(
        worker_ports=tuple(free_ports(2)),
        worker_args=["--step-timeout-s", str(STEP_TIMEOUT_S)],
        scheduler_args=["--routing", "round-robin"],
        env={
            "LAYERSERVE_API_KEYS": API_KEY,
            "LAYERSERVE_TEST_STALL_DIR": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]),
        },
    )
    flag = tmp_path / f"stall-{stack.config.worker_ports[0]}"
    flights = [http_stream(stack, LONG) for _ in range(6)]
    for flight in flights:
        assert flight.started.wait(60)
    flag.touch()
    stalled_at = time.monotonic()
    time.sleep(STEP_TIMEOUT_S + 1.0)  # past the bound: the worker says NOT_SERVING
    during = []
    while time.monotonic() - stalled_at < STALL_S:
        during.append(complete(stack))
    flag.unlink()
    outcomes = [f.wait() for f in flights]
    last_s = max(f.ended_at - stalled_at for f in flights)
    eventually(lambda: all_blocks_free(stack), "every KV block free")
    stalled_log = (stack.config.log_dir / "worker0.log").read_text()
    write_record(
        "stalled_worker",
        "a worker stalled mid-step",
        {
            "load": f"6 streams of {LONG} tokens on two null-worker replicas, round-robin; "
            "then requests one after another",
            "faults": [
                f"worker0's engine step held for {STALL_S:g}s (--step-timeout-s "
                f"{STEP_TIMEOUT_S:g}), its process and gRPC server alive"
            ],
            "outcomes": LoadResult(outcomes).counts(),
            "notes": [
                f"all {len(outcomes)} streams completed, the last {last_s:.1f}s after the stall "
                "began (the stalled replica's resumed once its step returned)",
                f"{sum(s == 200 for s, _ in during)} of {len(during)} requests during the stall "
                f"answered 200 by the other replica, the slowest in "
                f"{max(t for _, t in during):.2f}s",
            ],
        },
    )
    assert "NOT_SERVING: the engine step has not returned" in stalled_log
    assert LoadResult(outcomes).count(COMPLETED) == len(flights), LoadResult(outcomes).errors()
    assert during and all(s == 200 for s, _ in during), during
    assert max(t for _, t in during) < 2.0
