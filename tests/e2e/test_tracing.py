"""Tracing end to end: a null-worker stack exports to a real OTLP/gRPC receiver in this process,
and one request yields one trace, continued from the client's traceparent, with spans from all
four services, GenAI attributes, and no prompt or completion text."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.stack import Stack
from tests.e2e.conftest import free_ports, loopback_config, start_stack
from tests.e2e.otlp_collector import Collector, ReceivedSpan, running_collector

KEY = "tracing-test-key"
MODEL = "smollm2-135m-instruct"
PROMPT = "Describe the zebra quokka marmalade 7731 in detail"
SERVICES = {
    "layerserve-gateway",
    "layerserve-tokenizer",
    "layerserve-scheduler",
    "layerserve-worker",
}
# Every span any service makes: nothing else (no health checks, no listings) may show up.
SPAN_NAMES = {
    "POST /v1/chat/completions",
    "layerserve.gateway.v1.Gateway/Generate",
    "auth",
    "rate_limit",
    f"chat {MODEL}",
    f"text_completion {MODEL}",
    "deliver",
    "tokenizer request",
    "tokenize",
    "detokenize",
    "scheduler request",
    "admission",
    "queue",
    "prefill",
    "decode",
    "engine step",
    "forward",
    "worker prefill",
}
# What one chat completion's trace holds at least (an engine step and the worker's `forward`
# are in traces of their own).
REQUEST_SPANS = SPAN_NAMES - {
    "layerserve.gateway.v1.Gateway/Generate",
    f"text_completion {MODEL}",
    "engine step",
    "forward",
}


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory) -> Iterator[tuple[Stack, Collector]]:
    (otlp,) = free_ports(1)
    log_dir = Path(tmp_path_factory.mktemp("tracing-logs"))
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s, not 5
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_SERVICE_NAME": "",  # each service names itself
        "LAYERSERVE_API_KEYS": KEY,
    }
    config = loopback_config(
        null_worker=True,
        # A small step budget splits the prompt into several prefill chunks.
        scheduler_args=["--max-num-batched-tokens", "16"],
        log_dir=log_dir,
        env=env,
        redis="off",
    )
    with running_collector(otlp) as collector:
        stack = start_stack(config)
        try:
            yield stack, collector
        finally:
            stack.stop()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _complete(trace_id: str, spans: list[ReceivedSpan], root: str) -> bool:
    """Each process exports on its own clock: wait until every part of the request is in (its
    root, every span's parent, each prefill chunk's worker span, each linked step's
    `forward`)."""
    trace = [s for s in spans if s.trace_id == trace_id]
    names = [s.name for s in trace]
    ids = {s.span_id for s in trace}
    closed = sum(s.parent_id not in ids for s in trace) == 1  # only the root's is the client's
    steps = {s.span_id for s in spans if s.name == "engine step" and _links(s, trace_id)}
    forwards = {s.parent_id for s in spans if s.name == "forward"}
    chunks = names.count("prefill")
    return (
        root in names
        and closed
        and "scheduler request" in names
        and chunks > 0
        and names.count("worker prefill") == chunks
        and bool(steps)
        and steps <= forwards
    )


def _links(span: ReceivedSpan, trace_id: str) -> bool:
    return any(link_trace == trace_id for link_trace, _ in span.links)


def _assert_one_tree(trace: list[ReceivedSpan], client_span: str) -> None:
    ids = {s.span_id for s in trace}
    orphans = [s.name for s in trace if s.parent_id not in ids | {client_span}]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    roots = [s.name for s in trace if s.parent_id == client_span]
    assert len(roots) == 1, roots
    assert {s.service for s in trace} == SERVICES


def test_one_http_request_is_one_trace_through_all_four_services(traced_stack):
    stack, collector = traced_stack
    trace_id, client_span, traceparent = _traceparent()
    request_id = f"trace-test-{secrets.token_hex(4)}"
    headers = {
        "Authorization": f"Bearer {KEY}",
        "traceparent": traceparent,
        "X-Request-Id": request_id,
    }
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6}
    response = httpx.post(
        f"{stack.http_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    usage = answer["usage"]

    root_name = "POST /v1/chat/completions"
    spans = collector.wait_for(lambda s: _complete(trace_id, s, root_name))
    trace = [s for s in spans if s.trace_id == trace_id]
    by_name = {s.name: s for s in trace}
    assert REQUEST_SPANS <= set(by_name), REQUEST_SPANS - set(by_name)
    assert {s.name for s in spans} <= SPAN_NAMES, {s.name for s in spans} - SPAN_NAMES
    _assert_one_tree(trace, client_span)
    # Every span that names this request is in this one trace.
    choice_id = f"{answer['id']}-0"
    named = [s for s in spans if s.attributes.get("layerserve.choice_id") == choice_id]
    assert named and {s.trace_id for s in named} == {trace_id}

    root = by_name[root_name]
    assert root.parent_id == client_span
    assert root.attributes["layerserve.request_id"] == request_id
    assert root.attributes["http.response.status_code"] == 200
    # The chain of parents crosses every hop: gateway -> tokenizer -> scheduler -> worker.
    parents = {
        "auth": root_name,
        "rate_limit": root_name,
        f"chat {MODEL}": root_name,
        "deliver": root_name,
        "tokenizer request": f"chat {MODEL}",
        "tokenize": "tokenizer request",
        "detokenize": "tokenizer request",
        "scheduler request": "tokenizer request",
        "admission": "scheduler request",
        "queue": "scheduler request",
        "prefill": "scheduler request",
        "decode": "scheduler request",
        "worker prefill": "prefill",
    }
    by_id = {s.span_id: s.name for s in trace}
    for span in trace:
        if span.name in parents:
            assert by_id.get(span.parent_id) == parents[span.name], span.name
    for name in ("tokenizer request", "scheduler request", f"chat {MODEL}"):
        span = by_name[name]
        assert span.attributes["gen_ai.request.model"] == MODEL, name
        assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"], name
        assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"], name
        assert span.attributes["gen_ai.response.finish_reasons"] == ("length",), name
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.max_tokens"] == 6
    assert root.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6

    scheduler = by_name["scheduler request"]
    assert (
        scheduler.attributes["layerserve.worker.address"]
        == f"127.0.0.1:{stack.config.worker_ports[0]}"
    )
    assert scheduler.attributes["layerserve.preemptions"] == 0
    assert by_name["decode"].events == ("first_token", "finish")
    prefills = [s for s in trace if s.name == "prefill"]
    assert len(prefills) >= 2  # chunked: 16 tokens a step
    assert (
        sum(s.attributes["layerserve.prefill.tokens"] for s in prefills) == usage["prompt_tokens"]
    )
    # The worker computed each chunk in a span of its own, within the request's trace.
    worker_prefills = [s for s in trace if s.name == "worker prefill"]
    assert sorted(s.parent_id for s in worker_prefills) == sorted(s.span_id for s in prefills)

    # Engine steps: traces of their own, linked to the request; the worker's `forward` is a
    # child of the step it ran.
    steps = [
        s for s in spans if s.name == "engine step" and (trace_id, scheduler.span_id) in s.links
    ]
    assert len(steps) >= len(prefills) + 5  # every prefill chunk, then a step per token
    forwards = {s.parent_id for s in spans if s.name == "forward"}
    assert {s.span_id for s in steps} <= forwards

    text = answer["choices"][0]["message"]["content"]
    for span in spans:
        for key, value in span.attributes.items():
            assert "quokka" not in str(value), (span.name, key)
            assert not (len(text) > 3 and text in str(value)), (span.name, key)


def test_grpc_api_continues_the_traceparent_in_metadata(traced_stack):
    stack, collector = traced_stack
    trace_id, client_span, traceparent = _traceparent()
    metadata = [("authorization", f"Bearer {KEY}"), ("traceparent", traceparent)]
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, max_tokens=3)
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as channel:
        responses = list(
            gateway_pb2_grpc.GatewayStub(channel).Generate(request, metadata=metadata, timeout=60)
        )
    assert responses[-1].completion_tokens == 3

    root_name = "layerserve.gateway.v1.Gateway/Generate"
    spans = collector.wait_for(lambda s: _complete(trace_id, s, root_name))
    trace = [s for s in spans if s.trace_id == trace_id]
    _assert_one_tree(trace, client_span)
    root = next(s for s in trace if s.name == root_name)
    assert root.parent_id == client_span
    assert root.attributes["layerserve.request_id"] == responses[-1].request_id
    assert root.attributes["rpc.grpc.status_code"] == 0
    names = {s.name for s in trace}
    assert {"auth", "rate_limit", f"text_completion {MODEL}", "deliver", "prefill"} <= names
