"""Requests kept in flight in background threads while a test injects a fault: each records
when its first output arrived, how it ended (tests/reliability/load.py's kinds) and when."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import httpx

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.stack import Stack
from tests.reliability.conftest import API_KEY, AUTH, MODEL
from tests.reliability.load import COMPLETED, ERRORED, LOST, Outcome

TIMEOUT = 120.0  # seconds; a request still open then is lost


@dataclass
class InFlight:
    """One request running in a thread."""

    started: threading.Event = field(default_factory=threading.Event)  # first output seen
    outcome: Outcome | None = None
    ended_at: float = 0.0  # time.monotonic() when it ended
    _thread: threading.Thread | None = None

    def wait(self, timeout: float = TIMEOUT) -> Outcome:
        assert self._thread is not None
        self._thread.join(timeout)
        if self.outcome is None:
            return Outcome(LOST, timeout, error="still open")
        return self.outcome


def launch(run: Callable[[InFlight], Outcome]) -> InFlight:
    flight = InFlight()

    def target() -> None:
        began = time.monotonic()
        try:
            flight.outcome = run(flight)
        except Exception as exc:  # a cut connection, a body that is no error body
            flight.outcome = Outcome(LOST, time.monotonic() - began, error=repr(exc))
        finally:
            flight.ended_at = time.monotonic()
            flight.started.set()  # whoever waits for the start must not wait for an end

    flight._thread = threading.Thread(target=target, daemon=True)
    flight._thread.start()
    return flight


def http_stream(stack: Stack, max_tokens: int) -> InFlight:
    """A streaming completion; started once its first chunk has arrived."""
    body = {"model": MODEL, "prompt": "Count.", "max_tokens": max_tokens, "stream": True}

    def run(flight: InFlight) -> Outcome:
        began = time.monotonic()
        url = f"{stack.http_url}/v1/completions"
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=TIMEOUT) as response:
            if response.status_code != 200:
                code = json.loads(response.read())["error"]["code"]
                seconds = time.monotonic() - began
                return Outcome(ERRORED, seconds, error=code, http_status=response.status_code)
            finish = None
            for line in response.iter_lines():
                flight.started.set()
                if line == "data: [DONE]":
                    kind = COMPLETED if finish else LOST
                    return Outcome(kind, time.monotonic() - began, http_status=200)
                if line.startswith("data: "):
                    event = json.loads(line[len("data: ") :])
                    if "error" in event:
                        code = event["error"]["code"]
                        return Outcome(ERRORED, time.monotonic() - began, error=code)
                    finish = event["choices"][0]["finish_reason"] or finish
        return Outcome(LOST, time.monotonic() - began, error="stream ended without [DONE]")

    return launch(run)


def http_full(stack: Stack, max_tokens: int) -> InFlight:
    """A non-streaming completion; `started` is set when it ends (nothing comes before)."""
    body = {"model": MODEL, "prompt": "Count.", "max_tokens": max_tokens}

    def run(flight: InFlight) -> Outcome:
        began = time.monotonic()
        url = f"{stack.http_url}/v1/completions"
        response = httpx.post(url, json=body, headers=AUTH, timeout=TIMEOUT)
        seconds = time.monotonic() - began
        if response.status_code == 200:
            return Outcome(COMPLETED, seconds, http_status=200)
        code = response.json()["error"]["code"]
        return Outcome(ERRORED, seconds, error=code, http_status=response.status_code)

    return launch(run)


def grpc_stream(stack: Stack, max_tokens: int) -> InFlight:
    """A gateway gRPC Generate stream; started once its first response has arrived."""
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt="Count.", max_tokens=max_tokens)

    def run(flight: InFlight) -> Outcome:
        began = time.monotonic()
        with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            metadata = [("authorization", f"Bearer {API_KEY}")]
            finish = 0
            try:
                for response in stub.Generate(request, metadata=metadata, timeout=TIMEOUT):
                    flight.started.set()
                    finish = response.finish_reason or finish
            except grpc.RpcError as err:
                seconds = time.monotonic() - began
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return Outcome(LOST, seconds, error="no end within the timeout")
                return Outcome(ERRORED, seconds, error=err.code().name.lower())
        seconds = time.monotonic() - began
        if not finish:
            return Outcome(LOST, seconds, error="the stream closed OK without a finish reason")
        return Outcome(COMPLETED, seconds)

    return launch(run)
