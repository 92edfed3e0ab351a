"""Health and lifecycle on real processes: each service's grpc.health.v1 status and the
gateway's /ready follow what the service can really do, and SIGTERM drains a service (new
requests refused, those in flight finished, exit 0). Each test starts its own stack: it kills
or stops services. The null worker makes long generations cheap; the hung-step test needs the
real model, since only a real step takes long."""

from __future__ import annotations

import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from layerserve.scheduler.v1 import admin_pb2, scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from layerserve.worker.v1 import worker_pb2
from services.common.grpc_util import new_sync_channel
from services.common.health import NOT_SERVING, SERVING, service_name
from services.stack import Stack, StackConfig
from tests.e2e.conftest import API_KEY, MODEL, free_ports
from tests.e2e.helpers import AUTH, sse_events

pytestmark = pytest.mark.e2e

LONG = 6000  # tokens: seconds of null-worker output, well within its 8192-token context
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]

StackFactory = Callable[..., Stack]


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[StackFactory]:
    stacks: list[Stack] = []

    def start(null_worker: bool = True, **config) -> Stack:
        http, grpc_port, tok, sched, worker = free_ports(5)
        stack = Stack(
            StackConfig(
                http_port=http,
                grpc_port=grpc_port,
                tokenizer_port=tok,
                scheduler_port=sched,
                worker_ports=(worker,),
                model_name=MODEL,
                null_worker=null_worker,
                log_dir=tmp_path / f"stack{len(stacks)}",
                env={"LAYERSERVE_API_KEYS": API_KEY},
                redis="off",
                ready_timeout=180,
                **config,
            )
        )
        stacks.append(stack)
        try:
            stack.start()
        except Exception:
            for log in sorted(stack.config.log_dir.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text()[-3000:]}")
            raise
        return stack

    yield start
    for stack in stacks:
        stack.stop()


def health(stack: Stack, service: str) -> int:
    """The health status of `service` on its process."""
    address, name = health_target(stack, service)
    with new_sync_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status


def health_target(stack: Stack, service: str) -> tuple[str, str]:
    """The address of the process that serves `service`, and its full name."""
    c = stack.config
    port = {
        "worker": c.worker_ports[0],
        "scheduler": c.scheduler_port,
        "admin": c.scheduler_port,
        "tokenizer": c.tokenizer_port,
        "gateway": c.grpc_port,
    }[service]
    name = {
        "worker": service_name(worker_pb2, "Worker"),
        "scheduler": service_name(scheduler_pb2, "Scheduler"),
        "admin": service_name(admin_pb2, "Admin"),
        "tokenizer": service_name(tokenizer_pb2, "Tokenizer"),
        "gateway": service_name(gateway_pb2, "Gateway"),
    }[service]
    return f"127.0.0.1:{port}", name


def overall_health(port: int) -> int:
    with new_sync_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def log_of(stack: Stack, name: str) -> str:
    assert stack.config.log_dir is not None
    return (stack.config.log_dir / f"{name}.log").read_text()


def test_every_service_serves_after_start_and_stop_drains_front_to_back(
    start_stack: StackFactory,
):
    stack = start_stack()
    c = stack.config
    for service in ("worker", "scheduler", "admin", "tokenizer", "gateway"):
        assert health(stack, service) == SERVING, service
    for port in (c.worker_ports[0], c.scheduler_port, c.tokenizer_port, c.grpc_port):
        assert overall_health(port) == SERVING
    assert httpx.get(f"{stack.http_url}/ready", timeout=10).json() == {"status": "ready"}
    assert httpx.get(f"{stack.http_url}/health", timeout=10).status_code == 200

    stack.stop()
    assert {name: proc.returncode for name, proc in stack.procs.items()} == {
        "worker0": 0,
        "scheduler": 0,
        "tokenizer": 0,
        "gateway": 0,
    }
    order = ["gateway", "tokenizer", "scheduler", "worker0"]
    began = [_drain_started_at(log_of(stack, name)) for name in order]
    assert began == sorted(began), list(zip(order, began, strict=True))


def _drain_started_at(log: str) -> str:
    match = re.search(r"^(\S+ \S+) .* draining: ", log, re.MULTILINE)
    assert match, "the service never drained"
    return match.group(1)


def test_readiness_follows_the_dependencies_down(start_stack: StackFactory):
    stack = start_stack()
    ready_url = f"{stack.http_url}/ready"

    stack.kill("worker0")
    # Nothing can serve without a worker: the scheduler says so, the tokenizer follows its
    # scheduler, the gateway its tokenizer. The processes themselves are alive.
    eventually(lambda: health(stack, "scheduler") == NOT_SERVING, "scheduler NOT_SERVING")
    assert health(stack, "admin") == SERVING  # the Admin API can still add a worker
    eventually(lambda: health(stack, "tokenizer") == NOT_SERVING, "tokenizer NOT_SERVING")
    eventually(lambda: httpx.get(ready_url, timeout=10).status_code == 503, "gateway /ready 503")
    error = httpx.get(ready_url, timeout=10).json()["error"]
    assert "tokenizer service" in error["message"] and "not serving" in error["message"]
    assert httpx.get(f"{stack.http_url}/health", timeout=10).status_code == 200

    stack.kill("tokenizer")
    eventually(
        lambda: "unreachable" in httpx.get(ready_url, timeout=10).json()["error"]["message"],
        "gateway /ready naming the unreachable tokenizer",
    )
    assert health(stack, "gateway") == NOT_SERVING
    assert httpx.get(f"{stack.http_url}/health", timeout=10).status_code == 200


def test_sigterm_to_the_gateway_finishes_the_stream_in_flight(start_stack: StackFactory):
    stack = start_stack()
    gateway = stack.procs["gateway"]
    body = {
        "model": MODEL,
        "prompt": "Count to a big number.",
        "max_tokens": LONG,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = f"{stack.http_url}/v1/completions"
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        first = next(events)
        gateway.send_signal(signal.SIGTERM)
        refused = _first_refusal(url)
        rest = list(events)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"]
    assert "shutting down" in refused.json()["error"]["message"]
    assert rest[-1] == "[DONE]"
    chunks = [first, *rest[:-1]]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == LONG
    assert gateway.wait(timeout=60) == 0
    log = log_of(stack, "gateway")
    assert "gateway draining: 1 in flight" in log and "gateway drained" in log


def _first_refusal(url: str) -> httpx.Response:
    """Sends small requests until one is refused (the signal takes a moment to land)."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = httpx.post(url, json=body, headers=AUTH, timeout=30)
        if response.status_code != 200:
            return response
        time.sleep(0.01)
    raise AssertionError("no request was refused after SIGTERM")


@dataclass
class SessionService:
    """How to drive one multiplexed Session rpc by hand."""

    name: str
    port: Callable[[StackConfig], int]
    session: Callable[[grpc.Channel], Callable]
    request: Callable[[str, int], object]  # (request id, max_tokens) -> a SessionRequest
    tokens: Callable[[object], int]  # tokens an output carries


TOKENIZER = SessionService(
    "tokenizer",
    lambda c: c.tokenizer_port,
    lambda channel: tokenizer_pb2_grpc.TokenizerStub(channel).Session,
    lambda request_id, max_tokens: tokenizer_pb2.SessionRequest(
        requests=[
            tokenizer_pb2.GenerateRequest(
                request_id=request_id, model=MODEL, prompt="Count.", max_tokens=max_tokens
            )
        ]
    ),
    lambda output: len(output.token_ids),
)
SCHEDULER = SessionService(
    "scheduler",
    lambda c: c.scheduler_port,
    lambda channel: scheduler_pb2_grpc.SchedulerStub(channel).Session,
    lambda request_id, max_tokens: scheduler_pb2.SessionRequest(
        submits=[
            scheduler_pb2.Submit(
                request_id=request_id,
                model=MODEL,
                prompt_token_ids=[1, 2, 3],
                max_tokens=max_tokens,
            )
        ]
    ),
    lambda output: len(output.token_ids),
)


@pytest.mark.parametrize("service", [TOKENIZER, SCHEDULER], ids=lambda s: s.name)
def test_sigterm_finishes_the_requests_on_an_open_session(
    start_stack: StackFactory, service: SessionService
):
    """In flight means the requests on a long-lived session, not the session: the server
    refuses new ones on it, ends it once its requests have, and exits 0."""
    stack = start_stack()
    proc = stack.procs[service.name]
    with new_sync_channel(f"127.0.0.1:{service.port(stack.config)}") as channel:
        sends: queue.Queue = queue.Queue()  # never closed: the server must end the session
        responses = service.session(channel)(iter(sends.get, None))
        sends.put(service.request("long", LONG))
        outputs = list(next(responses).outputs)
        proc.send_signal(signal.SIGTERM)
        eventually(lambda: health(stack, service.name) == NOT_SERVING, "NOT_SERVING")
        sends.put(service.request("late", 1))
        with pytest.raises(grpc.RpcError) as err:
            next(service.session(channel)(iter([service.request("new-session", 1)])))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in err.value.details()
        collector = threading.Thread(target=lambda: outputs.extend(_all_outputs(responses)))
        collector.start()
        collector.join(timeout=60)
        assert not collector.is_alive(), "the session did not end after its requests"
    late = [o for o in outputs if o.request_id == "late"]
    assert len(late) == 1 and late[0].error.code == UNAVAILABLE
    assert "shutting down" in late[0].error.message
    long = [o for o in outputs if o.request_id == "long"]
    assert sum(service.tokens(o) for o in long) == LONG
    assert long[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert proc.wait(timeout=60) == 0


def _all_outputs(responses) -> list:
    return [output for response in responses for output in response.outputs]


def test_a_hung_engine_step_turns_the_worker_and_its_scheduler_not_serving(
    start_stack: StackFactory,
):
    """A bound far below a long prompt's prefill: while that step runs the worker is taken as
    hung (NOT_SERVING), so is the scheduler (no live worker); both serve again after it."""
    stack = start_stack(
        null_worker=False,
        # float32: the prefill step must outlast the scheduler's health poll of the worker
        # (~1.3 s here); in bfloat16, the CPU default, it can end before the poll sees it.
        worker_args=[
            "--step-timeout-s",
            "0.05",
            "--num-blocks",
            "512",
            "--dtype",
            "float32",
            "--quantization",
            "none",
        ],
    )
    seen: dict[str, set[int]] = {"worker": set(), "scheduler": set()}
    done = threading.Event()

    def watch() -> None:
        checks = []
        for service in seen:
            address, name = health_target(stack, service)
            stub = health_pb2_grpc.HealthStub(new_sync_channel(address))
            checks.append((service, stub, health_pb2.HealthCheckRequest(service=name)))
        while not done.is_set():
            for service, stub, request in checks:
                seen[service].add(stub.Check(request, timeout=5).status)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        body = {"model": MODEL, "prompt": "tell me more " * 200, "max_tokens": 1}
        response = httpx.post(
            f"{stack.http_url}/v1/completions", json=body, headers=AUTH, timeout=120
        )
    finally:
        done.set()
        watcher.join()
    assert response.status_code == 200, response.text  # the request itself went through
    assert response.json()["usage"]["prompt_tokens"] > 500
    assert NOT_SERVING in seen["worker"] and NOT_SERVING in seen["scheduler"]
    eventually(lambda: health(stack, "worker") == SERVING, "worker SERVING again")
    eventually(lambda: health(stack, "scheduler") == SERVING, "scheduler SERVING again")
    log = log_of(stack, "worker0")
    assert "the engine step has not returned" in log and "over the 0.05s bound" in log
