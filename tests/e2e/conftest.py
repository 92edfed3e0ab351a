"""Stacks shared by the end-to-end tests (four processes and more on loopback, the real models):
the main one, and one of SmolLM2 and Gemma 3 at the worker's defaults. Package-scoped: stopped
once the last test under tests/e2e has run, not kept running through tests/reliability."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack, StackConfig
from services.stack_file import ModelSpec
from services.worker.model.packaged import packaged_path
from tests.ports import free_ports

API_KEY = "e2e-test-key"
MODEL = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"
# Gemma's 18 layers form 6 KV cache groups of 3 (1 global, 5 sliding with a 512-token window),
# so a block holds 3 layers: 330 blocks take the memory of 55 blocks of all 18 layers, which
# would hold 880 tokens of one sequence.
GEMMA_NUM_BLOCKS, GEMMA_BLOCK, GEMMA_CHUNK = 330, 16, 128
# SmolLM2's file made greedy by the generation-defaults table: a request that leaves its
# temperature out gets exactly the greedy answer (test_api_model_defaults.py).
GREEDY_DEFAULTS = '[[gguf]]\nfile = "SmolLM2-135M-Instruct*.gguf"\ntemperature = 0.0\n'


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


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
def smollm_and_gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """SmolLM2 (worker0) and Gemma 3 270M (worker1) at the worker's defaults, SmolLM2 greedy
    by its defaults table (Gemma's requests are untouched by it): for test_gemma3_models.py
    and test_api_model_defaults.py, which started a stack each before."""
    log_dir = Path(tmp_path_factory.mktemp("smollm-gemma-logs"))
    table = log_dir / "generation_defaults.toml"
    table.write_text(GREEDY_DEFAULTS)
    config = loopback_config(
        worker_ports=tuple(free_ports(2)),
        models=(ModelSpec(MODEL), ModelSpec(GEMMA, str(packaged_path()))),
        worker_args=["--num-blocks", str(GEMMA_NUM_BLOCKS), "--max-model-len", "2048"],
        # Long prompts prefill in chunks, so Gemma's window passes blocks during the prefill too.
        scheduler_args=["--max-num-batched-tokens", str(GEMMA_CHUNK)],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_GENERATION_DEFAULTS": str(table)},
    )
    s = start_stack(config)
    yield s
    s.stop()


@pytest.fixture(scope="package")
def scheduler_stats(stack: Stack):
    """A function returning the scheduler's counters for the model's worker."""
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.config.scheduler_port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    def stats() -> scheduler_pb2.WorkerStats:
        return stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=5).workers[0]

    yield stats
    channel.close()
