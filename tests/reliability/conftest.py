"""Stacks for the reliability tests, all on null workers (fake tokens, no model), so they start
in seconds and load costs plumbing only: one for the bad-input tests (`null_stack`), one for
load, slow clients and the soak (`load_stack`), and stacks a fault test owns (`own_stack`).
Never the shared e2e stack: a crash found here must not take other tests down with it.

`--soak-seconds N` (given with a path under tests/reliability, where pytest reads this file
first) or LAYERSERVE_SOAK_SECONDS sets the soak's length. The bad-input tests' results go into
the reliability record (record.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from hypothesis import Phase

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack
from tests.e2e.conftest import loopback_config, start_stack
from tests.reliability.record import write_record

API_KEY = "reliability-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "smollm2-135m-instruct"  # the null worker serves it under this name, without weights
DEFAULT_SOAK_SECONDS = 30.0  # the shortest whose thirds compare; --soak-seconds N for longer
LOAD_NUM_BLOCKS = 4096
# The fuzz tests' phases: no shrinking unless LAYERSERVE_FUZZ_SHRINK is set. Their examples run
# against live processes, and a failing one may be a hang, each replay of it a call timeout:
# shrinking replays it hundreds of times, up to Hypothesis' 5 minutes a test (a CI run lost
# ~10 minutes so). The failure report still shows the example as drawn, and the error.
FUZZ_PHASES = tuple(
    phase
    for phase in Phase
    if phase is not Phase.shrink or os.environ.get("LAYERSERVE_FUZZ_SHRINK")
)


@pytest.fixture(scope="session")
def null_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = Path(tmp_path_factory.mktemp("reliability-logs"))
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_args=["--num-blocks", "256"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY},
        redis="off",
        ready_timeout=120,
    )
    stack = start_stack(config)
    yield stack
    try:
        stack.check_alive()  # every service must have survived everything thrown at it
    finally:
        stack.stop()
        _print_logs(log_dir, only_errors=True)


def _print_logs(log_dir: Path, only_errors: bool = False) -> None:
    for log in sorted(log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        if not only_errors or "Traceback" in text:
            print(f"--- {log.name}\n{text[-4000:]}")


def serves_normally(stack: Stack) -> None:
    """The stack still answers an ordinary request correctly."""
    stack.check_alive()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = httpx.post(
        f"{stack.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


@pytest.fixture(scope="session")
def scheduler_stub(null_stack: Stack) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    with grpc.insecure_channel(f"127.0.0.1:{null_stack.config.scheduler_port}") as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)


def worker_stats(stub: scheduler_pb2_grpc.SchedulerStub) -> scheduler_pb2.WorkerStats:
    return stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=10).workers[0]


def all_worker_stats(stack: Stack) -> dict[str, scheduler_pb2.WorkerStats]:
    """The scheduler's counters for each connected worker of MODEL, by address."""
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.scheduler_port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stats = stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=10)
    return {w.address: w for w in stats.workers}


def all_blocks_free(stack: Stack) -> bool:
    """Whether every connected worker's KV blocks are all free and nothing runs or waits."""
    workers = all_worker_stats(stack).values()
    return bool(workers) and all(
        w.free_blocks == w.num_blocks and w.running == 0 and w.waiting == 0 for w in workers
    )


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> float:
    """Polls `check` until it holds; returns the seconds that took. Fails after `timeout`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"never within {timeout:g}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture(scope="session")
def soak_seconds(request: pytest.FixtureRequest) -> float:
    value = request.config.getoption("--soak-seconds", default=None)
    if value is None:
        value = float(os.environ.get("LAYERSERVE_SOAK_SECONDS", DEFAULT_SOAK_SECONDS))
    if value < 30:
        raise ValueError(f"a soak needs at least 30 seconds to compare thirds, not {value:g}")
    return value


@pytest.fixture(scope="session")
def load_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A null-worker stack for the load, slow-client and soak tests (apart from the fuzzers'):
    KV blocks and a batch size for hundreds of concurrent streams."""
    log_dir = Path(tmp_path_factory.mktemp("load-logs"))
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_args=["--num-blocks", str(LOAD_NUM_BLOCKS)],
        scheduler_args=["--max-num-seqs", "256"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY},
        redis="off",
        ready_timeout=120,
    )
    stack = start_stack(config)
    yield stack
    try:
        stack.check_alive()
    finally:
        stack.stop()
        _print_logs(log_dir, only_errors=True)


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Starts stacks of the test's own (null workers unless told otherwise), stopped after it;
    a failed test prints their logs."""
    stacks: list[Stack] = []

    def start(**fields) -> Stack:
        config = loopback_config(
            **{
                "model_name": MODEL,
                "null_worker": True,
                "log_dir": tmp_path / f"stack{len(stacks)}",
                "env": {"LAYERSERVE_API_KEYS": API_KEY},
                "redis": "off",
                "ready_timeout": 120,
                "stop_timeout": 10,
                **fields,
            }
        )
        stack = start_stack(config)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.stop()
        _print_logs(stack.config.log_dir, only_errors=True)


# The bad-input tests' results, for the reliability record (tests/reliability/report.py).
BAD_INPUT_MODULES = (
    "test_malformed_http.py",
    "test_openapi_fuzz.py",
    "test_grpc_fuzz.py",
    "test_worker_fuzz.py",
)
_bad_input_results: dict[str, dict[str, int]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if module not in BAD_INPUT_MODULES or (report.when != "call" and report.passed):
        return
    counts = _bad_input_results.setdefault(module, {"passed": 0, "failed": 0, "skipped": 0})
    counts[report.outcome] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _bad_input_results:
        write_record(
            "bad_inputs",
            "bad inputs",
            {"tests": {m: _bad_input_results[m] for m in sorted(_bad_input_results)}},
        )
