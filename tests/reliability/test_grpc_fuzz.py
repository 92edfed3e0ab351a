"""Arbitrary protobuf messages to every service of a running stack: each call ends OK or with a
clean status (never INTERNAL or UNKNOWN, never a hang), each request inside a session ends with
a clean per-request status, and afterwards the stack still serves and the scheduler holds no
KV block for a request that is gone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.stack import Stack
from tests.reliability.conftest import API_KEY, MODEL, serves_normally, worker_stats
from tests.reliability.grpc_checks import (
    CALL_TIMEOUT,
    FUZZ,
    MAX_TOKENS,
    MODEL_NAMES,
    REQUEST_IDS,
    SAMPLING,
    TOKEN_IDS,
    assert_clean_error,
    assert_clean_status,
    clean_call,
)
from tests.reliability.proto_strategies import messages

_ERROR = common_pb2.FINISH_REASON_ERROR


@pytest.fixture(scope="module")
def tokenizer_stub(null_stack: Stack) -> Iterator[tokenizer_pb2_grpc.TokenizerStub]:
    with grpc.insecure_channel(f"127.0.0.1:{null_stack.config.tokenizer_port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)


@pytest.fixture(scope="module")
def gateway_stub(null_stack: Stack) -> Iterator[gateway_pb2_grpc.GatewayStub]:
    with grpc.insecure_channel(f"127.0.0.1:{null_stack.config.grpc_port}") as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="module")
def free_blocks_at_start(scheduler_stub: scheduler_pb2_grpc.SchedulerStub) -> int:
    return worker_stats(scheduler_stub).free_blocks


def _session(stub_method, batches: list) -> list:
    """Every output of a session that sends `batches` and then half-closes; the session must
    end by itself (the server closes it once every request it took has ended)."""
    responses = clean_call(lambda: list(stub_method(iter(batches), timeout=CALL_TIMEOUT)))
    assert responses is not None, "the session stream itself failed"
    outputs = [output for response in responses for output in response.outputs]
    for output in outputs:
        if output.finish_reason == _ERROR:
            assert_clean_status(output.error.code, output.error.message)
    return outputs


@FUZZ
@given(
    tokenize=messages(tokenizer_pb2.TokenizeRequest, {"TokenizeRequest.model": MODEL_NAMES}),
    listing=messages(tokenizer_pb2.ListModelsRequest),
)
def test_tokenizer_unary_calls_end_cleanly(tokenizer_stub, tokenize, listing):
    clean_call(lambda: tokenizer_stub.Tokenize(tokenize, timeout=CALL_TIMEOUT))
    assert clean_call(lambda: tokenizer_stub.ListModels(listing, timeout=CALL_TIMEOUT))


TOKENIZER_SESSION = {
    "GenerateRequest.request_id": REQUEST_IDS,
    "GenerateRequest.model": MODEL_NAMES,
    "GenerateRequest.max_tokens": MAX_TOKENS,
    "GenerateRequest.sampling": SAMPLING,
    "TokenIds.ids": TOKEN_IDS,
    "SessionRequest.aborts": st.lists(REQUEST_IDS, max_size=2),
}


@FUZZ
@given(st.lists(messages(tokenizer_pb2.SessionRequest, TOKENIZER_SESSION), min_size=1, max_size=3))
def test_tokenizer_session_ends_every_request_cleanly(
    tokenizer_stub, free_blocks_at_start, batches
):
    _session(tokenizer_stub.Session, batches)


def test_tokenizer_refuses_a_duplicate_request_id_as_invalid(tokenizer_stub, free_blocks_at_start):
    twice = tokenizer_pb2.SessionRequest()
    for _ in range(2):
        twice.requests.add(request_id="dup", model=MODEL, prompt="hi", max_tokens=2)
    outputs = _session(tokenizer_stub.Session, [twice])
    errors = [o.error for o in outputs if o.finish_reason == _ERROR]
    assert [(e.code, e.message) for e in errors] == [(3, "duplicate request_id")]
    finished = [o for o in outputs if o.finish_reason == common_pb2.FINISH_REASON_LENGTH]
    assert len(finished) == 1 and finished[0].completion_tokens == 2


def test_tokenizer_ends_an_echo_of_an_empty_prompt_with_an_error(
    tokenizer_stub, free_blocks_at_start
):
    # Found by the fuzz above: the echo of an empty prompt asked for its first token's
    # logprob, and the exception left the request (and so the session) open for ever.
    empty = tokenizer_pb2.SessionRequest()
    for request_id, kind in (("echo", {"echo": True}), ("embed", {"embed": True})):
        request = empty.requests.add(request_id=request_id, model=MODEL, max_tokens=1, **kind)
        request.sampling.prompt_logprobs = 1
    outputs = _session(tokenizer_stub.Session, [empty])
    errors = {o.request_id: o.error for o in outputs if o.finish_reason == _ERROR}
    assert set(errors) == {"echo", "embed"}
    assert all(e.code == 3 and "at least one token" in e.message for e in errors.values())


SCHEDULER_SESSION = {
    "Submit.request_id": REQUEST_IDS,
    "Submit.model": MODEL_NAMES,
    "Submit.max_tokens": MAX_TOKENS,
    "Submit.prompt_token_ids": TOKEN_IDS,
    "Submit.sampling": SAMPLING,
    "SessionRequest.aborts": st.lists(REQUEST_IDS, max_size=2),
}


@FUZZ
@given(
    batches=st.lists(
        messages(scheduler_pb2.SessionRequest, SCHEDULER_SESSION), min_size=1, max_size=3
    ),
    stats=messages(scheduler_pb2.GetStatsRequest, {"GetStatsRequest.model": MODEL_NAMES}),
    listing=messages(scheduler_pb2.ListModelsRequest),
)
def test_scheduler_calls_end_cleanly(scheduler_stub, free_blocks_at_start, batches, stats, listing):
    _session(scheduler_stub.Session, batches)
    assert clean_call(lambda: scheduler_stub.GetStats(stats, timeout=CALL_TIMEOUT)) is not None
    assert clean_call(lambda: scheduler_stub.ListModels(listing, timeout=CALL_TIMEOUT))


GATEWAY_GENERATE = {
    "GenerateRequest.model": MODEL_NAMES,
    "GenerateRequest.max_tokens": MAX_TOKENS,
    "GenerateRequest.sampling": SAMPLING,
}


@FUZZ
@given(
    generate=messages(gateway_pb2.GenerateRequest, GATEWAY_GENERATE),
    authorized=st.booleans(),
)
def test_gateway_generate_ends_cleanly(gateway_stub, free_blocks_at_start, generate, authorized):
    metadata = [("authorization", f"Bearer {API_KEY}")] if authorized else []
    try:
        list(gateway_stub.Generate(generate, metadata=metadata, timeout=CALL_TIMEOUT))
    except grpc.RpcError as err:
        assert_clean_error(err)
        assert authorized or err.code() == grpc.StatusCode.UNAUTHENTICATED
        return
    assert authorized, "generated without an API key"


@FUZZ
@given(describe=messages(worker_pb2.DescribeRequest))
def test_worker_describe_answers(null_stack, describe):
    with grpc.insecure_channel(f"127.0.0.1:{null_stack.config.worker_ports[0]}") as channel:
        info = worker_pb2_grpc.WorkerStub(channel).Describe(describe, timeout=CALL_TIMEOUT)
    assert info.num_blocks > 0


def test_no_kv_block_leaked_and_stack_still_serves(
    null_stack, scheduler_stub, free_blocks_at_start
):
    deadline = time.monotonic() + 30
    while True:
        stats = worker_stats(scheduler_stub)
        idle = stats.running == 0 and stats.waiting == 0
        if idle and stats.free_blocks == free_blocks_at_start or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (stats.running, stats.waiting) == (0, 0)
    assert stats.free_blocks == free_blocks_at_start
    serves_normally(null_stack)
