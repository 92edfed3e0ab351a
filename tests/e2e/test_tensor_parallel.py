"""A worker split over two CPU processes (--tensor-parallel-size 2, gloo) behind the real stack:
it answers exactly like a one-process worker of the same model, and its ranks fail together."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.stack import Stack, StackConfig
from services.stack_file import ModelSpec
from tests.e2e.conftest import API_KEY, free_ports
from tests.e2e.multi_model import complete, eventually, stop_process

ONE, TWO = "tiny-tp1", "tiny-tp2"
PROMPTS = ["Hello", "The capital of France is", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12", "a b"]
RANK_DIED_EXIT_CODE = 70  # tp_launch.py
# float32: split across ranks, each matmul sums its halves in another order, and bfloat16 (the
# CPU default where it is fast) rounds those sums differently enough to flip greedy tokens.
WORKER_ARGS = [
    "--num-blocks",
    "128",
    "--threads",
    "1",
    "--dtype",
    "float32",
    "--quantization",
    "none",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Stack]:
    http, grpc_port, tok, sched, w0, w1 = free_ports(6)
    log_dir = tmp_path_factory.mktemp("tp-logs")
    config = StackConfig(
        http_port=http,
        grpc_port=grpc_port,
        tokenizer_port=tok,
        scheduler_port=sched,
        worker_ports=(w0, w1),
        models=(
            ModelSpec(ONE, str(tiny_dir)),
            ModelSpec(TWO, str(tiny_dir), worker_args=("--tensor-parallel-size", "2")),
        ),
        worker_args=WORKER_ARGS,
        log_dir=log_dir,
        redis="off",
        env={"LAYERSERVE_API_KEYS": API_KEY},
    )
    s = Stack(config)
    try:
        s.start()
    except Exception:
        for log in sorted(log_dir.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
        raise
    yield s
    s.stop()


def _answers(stack: Stack, model: str) -> list[str]:
    """Greedy completions of every prompt, sent at once so that the worker batches them."""

    def one(prompt: str) -> str:
        response = complete(stack, model, prompt, max_tokens=12)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def test_two_ranks_answer_like_one_then_fail_together(stack: Stack) -> None:
    answers = _answers(stack, TWO)
    assert answers == _answers(stack, ONE)
    assert all(answers) and len(set(answers)) == len(PROMPTS)

    log = stack.config.log_dir / "worker1.log"
    rank1 = _rank1_pid(log.read_text())
    os.kill(rank1, signal.SIGKILL)
    worker = stack.procs["worker1"]
    assert worker.wait(timeout=30) == RANK_DIED_EXIT_CODE
    assert f"tensor-parallel rank 1 (pid {rank1}) died (killed by SIGKILL)" in log.read_text()
    # The scheduler sees the worker gone: a clear error for its model, no hang.
    response = eventually(lambda: _failed(complete(stack, TWO, "Hello")), timeout=30)
    assert response.status_code == 503, response.text
    assert _answers(stack, ONE)  # the other worker serves on


def _failed(response: httpx.Response) -> httpx.Response | None:
    return response if response.status_code != 200 else None


def test_rank_1_exits_when_rank_0_dies(tiny_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    args = ["--port", str(free_ports(1)[0]), "--model-path", str(tiny_dir), *WORKER_ARGS]
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "services.worker", "--tensor-parallel-size", "2", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually(lambda: "tensor-parallel rank 1 ready" in log.read_text(), timeout=120)
        rank1 = _rank1_pid(log.read_text())
        worker.kill()  # SIGKILL: no chance to stop rank 1 itself
        worker.wait()
        eventually(lambda: not _alive(rank1), timeout=15)
    finally:
        stop_process(worker)
    assert re.search(r"worker-rank1 .*rank 0", log.read_text())  # it said why it exited


def _rank1_pid(log: str) -> int:
    match = re.search(r"tensor-parallel rank 1 of 2 started \(pid (\d+)\)", log)
    assert match, "the worker did not start rank 1"
    return int(match.group(1))


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie, exited but not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
