"""What the tracing hooks cost, off and on, where they run most often, each against the same
code without hooks in the same run:

    PYTHONPATH=. python -m benchmarks.tracing_overhead [--requests 64] [--tokens 64] [--reps 7]

1. **Per request:** every hook one request meets on its way through the four services (the
   gateway's request, checks, choice and delivery; the tokenizer's request and tokenize; the
   scheduler's request), timed over many requests, minus an empty loop.
2. **Engine steps:** the scheduler's step loop as its Engine runs it (schedule, the
   StepRequest, the sampled tokens applied, the outputs built) for --requests requests of
   --tokens tokens each, with the hooks (the RequestTracer observing the Scheduler, the
   StepTracer's spans around each step) and without.

"On" installs an SDK TracerProvider without an exporter: spans are built, sampled and dropped,
which is what the services themselves pay (the export runs on the SDK's own thread).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider

from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common import tracing
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.gateway import request_span
from services.gateway.backend import ChatMessage, GenerationRequest
from services.gateway.openai_responses import UsageTally
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.output import Output
from services.scheduler.output_proto import output_to_proto
from services.scheduler.request import Request
from services.scheduler.request_trace import RequestTracer as SchedulerTracer
from services.scheduler.request_trace import RequestTraces
from services.scheduler.scheduler import Scheduler, SchedulerLimits
from services.scheduler.step import Sample, StepResult
from services.scheduler.step_trace import StepTracer
from services.scheduler.submission import Submission
from services.scheduler.worker_link import step_to_proto
from services.tokenizer.request_trace import RequestTracer as TokenizerTracer

PROMPT_TOKENS = 128


def _request_hooks(n: int) -> float:
    """Seconds for n requests' worth of per-request hooks."""
    request = GenerationRequest(
        "r-0", "m", messages=[ChatMessage("user", "x")], max_tokens=MaxTokens(8)
    )
    generate = tokenizer_pb2.GenerateRequest(request_id="r-0", model="m")
    submit = scheduler_pb2.Submit(request_id="r-0", model="m", max_tokens=8)
    submission = Submission("r-0", "m", [1], max_tokens=MaxTokens(8))
    output = tokenizer_pb2.GenerateOutput(request_id="r-0", prompt_tokens=3, completion_tokens=8)
    tally = UsageTally(1)
    tokenizer = TokenizerTracer()
    traces = RequestTraces()
    scheduler = SchedulerTracer(traces, "w")
    started = time.perf_counter()
    for _ in range(n):
        with tracing.current_child("auth"):
            pass
        with tracing.current_child("rate_limit"):
            pass
        request_span.describe(None, "r", [request])
        choice = request_span.start_choice(request)
        tracing.forward(choice, request.trace_context)
        tokenizer.started(generate)
        tokenizer.tokenized("r-0", "m", 3)
        tokenizer.submitting("r-0", submit)
        traces.start(submission)
        queued = Request("r-0", [1], 8, SamplingOptions(), frozenset())
        scheduler.admitted(queued)
        scheduler.finished(queued)
        tokenizer.finished("r-0", output)
        request_span.choice_finished(choice, output)
        tracing.finish(choice)
        with tracing.current_child("deliver"):
            pass
        request_span.settle(None, tally)
    return time.perf_counter() - started


def _empty_loop(n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - started


def _scheduler(requests: int, tokens: int, traces: RequestTraces | None) -> Scheduler:
    """traces: the hooks' book of open traces (None: no hooks)."""
    blocks_each = (PROMPT_TOKENS + tokens) // 16 + 2
    kv = KVCacheManager(BlockPool(requests * blocks_each), 16)
    observers = [SchedulerTracer(traces, "w")] if traces is not None else []
    limits = SchedulerLimits(1024, requests)
    scheduler = Scheduler(limits, kv, 8192, frozenset(), observers=observers)
    for i in range(requests):
        prompt = [100 + (i * 7 + j) % 30000 for j in range(PROMPT_TOKENS)]
        request = Request(f"r-{i}", prompt, tokens, SamplingOptions(), frozenset())
        if traces is not None:
            traces.start(Submission(request.request_id, "m", prompt, max_tokens=MaxTokens(tokens)))
        scheduler.add(request)
    return scheduler


def _step_loop(hooks: bool, requests: int, tokens: int) -> float:
    """Seconds to run every request to its end, one engine step after another."""
    traces = RequestTraces() if hooks else None
    scheduler = _scheduler(requests, tokens, traces)
    step_tracer = StepTracer(traces, "w") if traces is not None else None
    started = time.perf_counter()
    step_id = 0
    while scheduler.has_work():
        step = scheduler.schedule()
        if step.is_empty:
            continue
        step_id += 1
        trace = step_tracer.begin(step, step_id) if step_tracer is not None else None
        step_to_proto(step, step_id, trace.contexts if trace is not None else None)
        caught_up = [p.request for p in step.requests if p.request.num_output_placeholders]
        samples = [Sample(r.request_id, 7) for r in caught_up]
        if trace is not None:
            trace.end(StepResult(samples))
        updated = scheduler.update(samples)
        [output_to_proto(Output.sampled(u.request, *u.samples)) for u in updated]
    return time.perf_counter() - started


def _median(reps: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(reps))


def measure(requests: int, tokens: int, reps: int, n: int) -> dict:
    per_request = _median(reps, lambda: _request_hooks(n) - _empty_loop(n)) / n
    bare = _median(reps, lambda: _step_loop(False, requests, tokens))
    hooked = _median(reps, lambda: _step_loop(True, requests, tokens))
    return {"per_request_us": per_request * 1e6, "loop_bare_s": bare, "loop_hooked_s": hooked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--n", type=int, default=20_000, help="requests for the per-request part")
    a = parser.parse_args()
    off = measure(a.requests, a.tokens, a.reps, a.n)
    tracing.install(TracerProvider(), "benchmark")  # on: spans built and dropped
    on = measure(a.requests, a.tokens, a.reps, a.n // 10)
    for name, r in (("off", off), ("on", on)):
        overhead = (r["loop_hooked_s"] / r["loop_bare_s"] - 1) * 100
        print(
            f"tracing {name}: hooks per request {r['per_request_us']:.2f} us; step loop "
            f"{r['loop_bare_s'] * 1e3:.1f} ms without hooks, {r['loop_hooked_s'] * 1e3:.1f} ms "
            f"with ({overhead:+.1f}%)"
        )


if __name__ == "__main__":
    main()
