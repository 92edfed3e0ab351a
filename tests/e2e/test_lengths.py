"""A request without max_tokens gets the gateway's default, cut to what fits after its prompt; a
max_tokens the client set is never cut: when it does not fit, the error names max_tokens. Each
is sent through the stack once, its prompt tokenized once (the scheduler resolves the length).

The stack runs the real tokenizer and a null worker whose KV cache holds 8 blocks of 16 tokens,
so a short prompt leaves less room than the default of 1024."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import chat_body, grpc_generate, post

pytestmark = pytest.mark.e2e
QUESTION = "Count the words of this sentence, please."


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    (metrics,) = free_ports(1)
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_args=["--num-blocks", "8", "--block-size", "16"],
        log_dir=Path(tmp_path_factory.mktemp("lengths-stack")),
        env={"LAYERSERVE_API_KEYS": API_KEY},
        redis="off",
        metrics_ports={"tokenizer": metrics},
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def _prompts_tokenized(stack: Stack) -> float:
    port = stack.config.metrics_ports["tokenizer"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if "tokenize_time_seconds_count" in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#"))


def test_a_default_is_cut_to_what_fits_and_sent_once(small: Stack) -> None:
    before = _prompts_tokenized(small)
    response = post(small, "/v1/chat/completions", chat_body(QUESTION))
    assert response.status_code == 200, response.text
    assert _prompts_tokenized(small) == before + 1  # one request, not a refused one and a retry
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    fitting = body["usage"]["completion_tokens"]
    assert 0 < fitting < 1024 and body["usage"]["total_tokens"] <= 8 * 16
    # Exactly what fits: the same length asked for is served, one more is refused.
    exact = post(small, "/v1/chat/completions", chat_body(QUESTION, max_tokens=fitting))
    assert exact.status_code == 200, exact.text
    assert exact.json()["usage"]["completion_tokens"] == fitting
    over = post(small, "/v1/chat/completions", chat_body(QUESTION, max_tokens=fitting + 1))
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    # A prompt the KV cache cannot hold at all: the error names the prompt.
    too_long = post(small, "/v1/chat/completions", chat_body(QUESTION * 20))
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"


def test_grpc_cuts_its_default_and_refuses_a_max_tokens_that_does_not_fit(small: Stack) -> None:
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt=QUESTION)
    responses = grpc_generate(small, request)
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert 0 < sum(len(r.token_ids) for r in responses) < 8 * 16
    request.max_tokens = 1024
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(small, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens" in info.value.details()
