"""A stack under mutual TLS: completions work end to end, and no internal port lets in a
plaintext client, a client without a certificate, or one whose certificate another CA signed."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpc_util import new_sync_channel
from services.common.tls import TlsSettings
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL, loopback_config, start_stack
from tests.tls_certs import TestCA

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_KEY}"}


class TlsStack:
    def __init__(self, stack: Stack, ca: TestCA, stranger: TestCA) -> None:
        self.stack = stack
        self.ca = ca
        self.stranger = stranger  # a CA the stack does not trust

    def port(self, service: str) -> int:
        c = self.stack.config
        return {"tokenizer": c.tokenizer_port, "scheduler": c.scheduler_port}.get(
            service, c.worker_ports[0]
        )


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsStack]:
    certs = Path(tmp_path_factory.mktemp("tls"))
    ca, stranger = TestCA(certs, "stack"), TestCA(certs, "stranger")
    leaf = ca.issue("service")  # localhost and 127.0.0.1, server and client use
    log_dir = Path(tmp_path_factory.mktemp("tls-logs"))
    stack = start_stack(
        loopback_config(
            model_name=MODEL,
            null_worker=True,
            log_dir=log_dir,
            redis="off",
            ready_timeout=120,
            env={
                "LAYERSERVE_API_KEYS": API_KEY,
                "LAYERSERVE_TLS_CERT": str(leaf.cert),
                "LAYERSERVE_TLS_KEY": str(leaf.key),
                "LAYERSERVE_TLS_CA": str(ca.path),
                "LAYERSERVE_TLS_CLIENT_AUTH": "1",
            },
        )
    )
    yield TlsStack(stack, ca, stranger)
    stack.stop()


def _probe(service: str) -> Callable[[grpc.Channel], object]:
    """One cheap unary call to `service`."""
    calls = {
        "tokenizer": lambda ch: tokenizer_pb2_grpc.TokenizerStub(ch).ListModels(
            tokenizer_pb2.ListModelsRequest(), timeout=10
        ),
        "scheduler": lambda ch: scheduler_pb2_grpc.SchedulerStub(ch).ListModels(
            scheduler_pb2.ListModelsRequest(), timeout=10
        ),
        "worker": lambda ch: worker_pb2_grpc.WorkerStub(ch).Describe(
            worker_pb2.DescribeRequest(), timeout=10
        ),
    }
    return calls[service]


def _call(tls_stack: TlsStack, service: str, client: TlsSettings) -> object:
    with new_sync_channel(f"127.0.0.1:{tls_stack.port(service)}", client) as channel:
        return _probe(service)(channel)


def test_completions_work_over_tls_hops(tls_stack: TlsStack) -> None:
    stack = tls_stack.stack
    assert stack.http_url.startswith("https://")
    verify = ssl.create_default_context(cafile=tls_stack.ca.path)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    response = httpx.post(
        f"{stack.http_url}/v1/chat/completions", json=body, headers=AUTH, verify=verify, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 5
    # The public gRPC port serves TLS too, and asks API clients for no certificate.
    public = TlsSettings(ca=tls_stack.ca.path)
    with new_sync_channel(f"127.0.0.1:{stack.config.grpc_port}", public) as channel:
        request = gateway_pb2.GenerateRequest(model=MODEL, prompt="Hi", max_tokens=3)
        responses = list(
            gateway_pb2_grpc.GatewayStub(channel).Generate(
                request, metadata=[("authorization", f"Bearer {API_KEY}")], timeout=60
            )
        )
    assert responses


def test_plain_http_to_the_public_port_gets_no_answer(tls_stack: TlsStack) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{tls_stack.stack.config.http_port}/health", timeout=10)


SERVICES = ["tokenizer", "scheduler", "worker"]


@pytest.mark.parametrize("service", SERVICES)
def test_a_client_with_the_stacks_certificate_is_served(tls_stack: TlsStack, service: str):
    assert _call(tls_stack, service, tls_stack.stack.tls)  # the control for the refusals below


@pytest.mark.parametrize("service", SERVICES)
def test_a_plaintext_client_is_refused(tls_stack: TlsStack, service: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _call(tls_stack, service, TlsSettings())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("service", SERVICES)
def test_a_client_without_a_certificate_is_refused(tls_stack: TlsStack, service: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _call(tls_stack, service, TlsSettings(ca=tls_stack.ca.path))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("service", SERVICES)
def test_a_certificate_from_another_ca_is_refused(tls_stack: TlsStack, service: str) -> None:
    foreign = tls_stack.stranger.issue("intruder")
    # It trusts the stack's CA (so the server's side of the handshake is fine); only its own
    # certificate is wrong.
    client = TlsSettings(foreign.cert, foreign.key, tls_stack.ca.path, client_auth=True)
    with pytest.raises(grpc.RpcError) as err:
        _call(tls_stack, service, client)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
