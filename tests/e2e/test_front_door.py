"""Keys, limits and usage through real processes: two gateway replicas sharing one Redis, the
real tokenizer counting prompt tokens, a null worker generating."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.api_keys import hash_key
from services.stack import Stack
from tests.e2e.conftest import MODEL, free_ports, loopback_config
from tests.openai_schema import validate

LIMITED, OPEN, NARROW = "sk-limited", "sk-open", "sk-narrow"
KEYS_FILE = f"""
[[keys]]
name = "limited"
sha256 = "{hash_key(LIMITED)}"
requests_per_minute = 4

[[keys]]
name = "open"
sha256 = "{hash_key(OPEN)}"

[[keys]]
name = "narrow"
sha256 = "{hash_key(NARROW)}"
models = ["some-other-model"]
"""


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, redis_url) -> Iterator[tuple[str, str, int, Path]]:
    """(first gateway URL, second gateway URL, first gateway's gRPC port, log folder). The
    second gateway logs prompts (LAYERSERVE_LOG_PROMPTS=1), the stack does not."""
    tmp = Path(tmp_path_factory.mktemp("front-door"))
    keys = tmp / "keys.toml"
    keys.write_text(KEYS_FILE)
    http2, grpc2 = free_ports(2)
    gateway_args = ["--api-keys-file", str(keys), "--max-prompt-tokens", "16"]
    stack = Stack(
        loopback_config(
            null_worker=True,
            gateway_args=gateway_args,
            log_dir=tmp / "logs",
            # DEBUG: even the chattiest logs must not carry prompts (see the last test).
            env={"LAYERSERVE_REDIS_URL": redis_url, "LAYERSERVE_LOG_LEVEL": "DEBUG"},
        )
    )
    stack.start()
    second = subprocess.Popen(
        [sys.executable, "-m", "services.gateway", "--http-port", str(http2)]
        + ["--grpc-port", str(grpc2), "--tokenizer", f"127.0.0.1:{stack.config.tokenizer_port}"]
        + gateway_args,
        env={**os.environ, "LAYERSERVE_REDIS_URL": redis_url, "LAYERSERVE_LOG_PROMPTS": "1"},
        stderr=open(tmp / "logs" / "second-gateway.txt", "w"),  # noqa: SIM115
    )
    try:
        _wait_until_up(f"http://127.0.0.1:{http2}")
        yield stack.http_url, f"http://127.0.0.1:{http2}", stack.config.grpc_port, tmp / "logs"
    finally:
        second.terminate()
        second.wait(timeout=30)
        stack.stop()


def _wait_until_up(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


def complete(url: str, key: str, prompt: str = "Hello there", **extra) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra}
    return httpx.post(
        f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def test_two_gateway_replicas_share_a_keys_request_rate(gateways):
    first, second, grpc_port, _ = gateways
    statuses = [complete(url, LIMITED).status_code for url in (first, second, first, second)]
    assert statuses == [200, 200, 200, 200]
    refused = complete(second, LIMITED)
    assert refused.status_code == 429
    validate(refused.json(), "ErrorResponse")
    assert "4 requests per minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 15
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(model=MODEL, prompt="hi", max_tokens=2)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(request, metadata=[("authorization", f"Bearer {LIMITED}")]))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(err.value.trailing_metadata())["retry-after"].isdigit()
    assert complete(first, OPEN).status_code == 200  # other keys are not held back


def test_usage_adds_up_across_replicas(gateways):
    first, second, _, _ = gateways
    before = httpx.get(f"{first}/v1/usage", headers={"Authorization": f"Bearer {OPEN}"}).json()
    for url in (first, second):
        assert complete(url, OPEN).status_code == 200
    after = httpx.get(f"{second}/v1/usage", headers={"Authorization": f"Bearer {OPEN}"}).json()
    assert after["scope"] == "all replicas"
    assert after["requests"] == before["requests"] + 2
    assert after["completion_tokens"] == before["completion_tokens"] + 8
    assert after["prompt_tokens"] > before["prompt_tokens"]


def test_the_prompt_token_limit_counts_real_tokens(gateways):
    first, *_ = gateways
    assert complete(first, OPEN, prompt="one two three").status_code == 200
    response = complete(first, OPEN, prompt=" ".join(["word"] * 40))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "the prompt is 40 tokens; this server accepts at most 16"


def test_a_key_limited_to_other_models_neither_sees_nor_uses_this_one(gateways):
    first, *_ = gateways
    response = complete(first, NARROW)
    assert response.status_code == 404
    headers = {"Authorization": f"Bearer {NARROW}"}
    assert httpx.get(f"{first}/v1/models", headers=headers).json()["data"] == []
    assert complete(first, "sk-not-a-key").status_code == 401


def test_prompts_and_completions_stay_out_of_the_logs_unless_asked(gateways):
    first, second, _, logs = gateways
    marker = "zebra-marmalade-7431"
    for url in (first, second):
        assert complete(url, OPEN, prompt=f"Say {marker}").status_code == 200
    time.sleep(0.5)  # let the log lines land
    stack_logs = {path.name: path.read_text() for path in logs.glob("*.log")}
    assert {"gateway.log", "tokenizer.log", "scheduler.log", "worker0.log"} <= set(stack_logs)
    assert all(marker not in text for text in stack_logs.values())
    assert marker in (logs / "second-gateway.txt").read_text()  # the operator asked there
