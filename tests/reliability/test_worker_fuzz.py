"""Arbitrary StepRequests to a worker of its own (the real model, small limits, no scheduler
driving it): every step gets a StepResult, an inconsistent one a clean INVALID_ARGUMENT in it,
the stream never ends with INTERNAL or UNKNOWN, and a sane step still samples afterwards."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import free_ports
from tests.reliability.grpc_checks import (
    CALL_TIMEOUT,
    FUZZ,
    REQUEST_IDS,
    SAMPLING,
    TOKEN_IDS,
    assert_clean_status,
    clean_call,
)
from tests.reliability.proto_strategies import messages

NUM_BLOCKS = 16
BLOCK_SIZE = 16
MAX_MODEL_LEN = 128
_COUNTS = st.one_of(st.integers(0, 40), st.sampled_from([-1, -(2**31), 2**31 - 1]))
_BLOCK_IDS = st.lists(
    st.one_of(st.integers(0, NUM_BLOCKS + 1), st.sampled_from([-1, 2**31 - 1])), max_size=4
)
STEP = {
    "NewSequence.request_id": REQUEST_IDS,
    "NewSequence.token_ids": TOKEN_IDS,
    "NewSequence.num_prompt_tokens": _COUNTS,
    "NewSequence.num_computed_tokens": _COUNTS,
    "NewSequence.num_new_tokens": _COUNTS,
    "BlockTable.block_ids": _BLOCK_IDS,
    "RunningSequence.request_id": REQUEST_IDS,
    "RunningSequence.num_new_tokens": _COUNTS,
    "StepRequest.finished_ids": st.lists(REQUEST_IDS, max_size=2),
}

_FIELDS = ["token_ids", "num_prompt_tokens", "num_computed_tokens", "num_new_tokens", "block_ids"]
_BREAKS = st.sampled_from([None] * len(_FIELDS) + _FIELDS)  # half the steps left intact


@st.composite
def plausible_steps(draw: st.DrawFn) -> list[worker_pb2.StepRequest]:
    """What a scheduler could send (one or two new sequences, then decode steps), with at most
    one field of one step broken: consistent steps reach the model and the sampler."""
    first = worker_pb2.StepRequest(step_id=1)
    free = draw(st.permutations(range(NUM_BLOCKS)))
    names = draw(st.lists(st.sampled_from(["s0", "s1", "s2"]), min_size=1, max_size=2))
    for name in names:
        length = draw(st.integers(1, 40))
        seq = first.new_sequences.add(
            request_id=name,
            token_ids=draw(st.lists(st.integers(0, 49151), min_size=length, max_size=length)),
            num_prompt_tokens=draw(st.integers(1, length)),
            num_new_tokens=length,
        )
        seq.block_tables.add(block_ids=[free.pop() for _ in range(-(-(length + 3) // BLOCK_SIZE))])
        sampling = draw(SAMPLING)
        if sampling is not None:
            seq.sampling.CopyFrom(sampling)
    steps = [first]
    for step_id in range(2, draw(st.integers(1, 4)) + 1):
        step = worker_pb2.StepRequest(step_id=step_id)
        for name in dict.fromkeys(names):
            step.running.add(request_id=name, num_new_tokens=1).new_block_tables.add()
        steps.append(step)
    broken = draw(_BREAKS)
    if broken is not None:
        seq = first.new_sequences[0]
        # block_ids: the table of the worker's one KV cache group.
        target = seq.block_tables[0] if broken == "block_ids" else seq
        target.ClearField(broken)
        value = draw(_COUNTS)
        if broken.endswith("_ids"):
            getattr(target, broken).append(value)
        else:
            setattr(target, broken, value)
    return steps


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[worker_pb2_grpc.WorkerStub]:
    (port,) = free_ports(1)
    log = (tmp_path_factory.mktemp("worker-fuzz") / "worker.log").open("w")
    args = ["--port", str(port), "--num-blocks", str(NUM_BLOCKS)]
    args += ["--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN)]
    # float32: the steps' checks and sampling are under test, not a dtype's kernels; on a CPU
    # with native bfloat16 the default packs the file's 4-bit weights first: on a busy
    # machine the load took 1.5-2x as long (71.5 s against 44.8 s in float32).
    args += ["--dtype", "float32", "--quantization", "none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.worker", *args], stdout=log, stderr=subprocess.STDOUT
    )
    # Redialled at least every second while the worker loads its model: gRPC's default
    # backoff (1 s, x1.6 a try) let the first call wait up to ~15 s past the worker's start.
    options = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 1000)]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    try:
        grpc.channel_ready_future(channel).result(timeout=120)
        yield worker_pb2_grpc.WorkerStub(channel)
        assert proc.poll() is None, "the worker died"
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _run_steps(worker, steps: list[worker_pb2.StepRequest]) -> list[worker_pb2.StepResult]:
    results = clean_call(lambda: list(worker.Execute(iter(steps), timeout=CALL_TIMEOUT)))
    assert results is not None, "the Execute stream itself failed"
    return results


@FUZZ
@given(plausible_steps() | st.lists(messages(worker_pb2.StepRequest, STEP), min_size=1, max_size=3))
def test_worker_answers_every_step_cleanly(worker, steps):
    results = _run_steps(worker, steps)
    assert len(results) == len(steps)
    for step, result in zip(steps, results, strict=True):
        assert result.step_id == step.step_id
        if result.HasField("error"):
            assert_clean_status(result.error.code, result.error.message)
            assert not result.sampled, "a failed step sampled tokens"


def test_worker_still_samples_after_fuzzing(worker):
    step = worker_pb2.StepRequest(step_id=1)
    step.new_sequences.add(
        request_id="sane", token_ids=[1, 2, 3], num_prompt_tokens=3, num_new_tokens=3
    ).block_tables.add(block_ids=[0])
    (result,) = _run_steps(worker, [step])
    assert not result.HasField("error"), result.error.message
    assert [s.request_id for s in result.sampled] == ["sane"]
