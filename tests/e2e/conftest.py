"""One real stack for the end-to-end tests: four processes on loopback, the real model."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack, StackConfig

API_KEY = "e2e-test-key"
MODEL = "smollm2-135m-instruct"


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def loopback_config(**fields) -> StackConfig:
    """A one-worker StackConfig on free loopback ports; `fields` set the rest."""
    http, grpc_port, tok, sched, worker = free_ports(5)
    ports = {
        "http_port": http,
        "grpc_port": grpc_port,
        "tokenizer_port": tok,
        "scheduler_port": sched,
        "worker_ports": (worker,),
    }
    return StackConfig(**{**ports, **fields})


def start_stack(config: StackConfig) -> Stack:
    """Starts the stack; when that fails, prints the end of each service's log first."""
    stack = Stack(config)
    try:
        stack.start()
    except Exception:
        for log in sorted((config.log_dir or Path("/nonexistent")).glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        raise
    return stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = Path(tmp_path_factory.mktemp("stack-logs"))
    config = loopback_config(
        model_name=MODEL,
        # A small step budget splits long prompts across steps (chunked prefill) and mixes
        # them with running decodes, so the tests exercise both.
        scheduler_args=["--max-num-batched-tokens", "96", "--max-num-seqs", "16"],
        # float32 dense weights, not the CPU's default (the file's 4-bit weights through
        # int4pack, which rounds activations to bfloat16): test_reference.py wants the float32
        # dense reference's greedy tokens exactly, under batching.
        worker_args=["--num-blocks", "512", "--dtype", "float32", "--quantization", "none"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY},
    )
    s = start_stack(config)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def scheduler_stats(stack: Stack):
    """A function returning the scheduler's counters for the model's worker."""
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.config.scheduler_port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    def stats() -> scheduler_pb2.WorkerStats:
        return stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=5).workers[0]

    yield stats
    channel.close()
