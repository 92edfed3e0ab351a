"""What the scheduler measures, per model and per worker replica (`worker`: its address).

Read at scrape time from each engine's Scheduler (SchedulerCollector): requests running and
waiting, KV cache usage, and its counters (its SchedulerStats: prefix cache queries and hits in
tokens, preemptions, prompt and generation tokens, queue rejections and timeouts, speculative
decoding's proposed and accepted tokens: acceptance rate = accepted / draft tokens). The
counters are the Scheduler's own, so they restart from 0 when a worker reconnects
(Prometheus' rate() takes that as a counter reset). Observed from the Scheduler's events
(SchedulerMetrics, a SchedulerObserver), once per engine step: the tokens the step computes,
and for each request it starts for the first time its queue time and how far the router's
guess of its cached prefix was from the prefix the worker's cache actually served; and for
each step that verified a request's proposals, the tokens the request got from it (accepted
proposals + its own token).

Prompt tokens count once a request's prefill is done (its first token sampled), whether it
came from the cache or not; generation tokens count every sampled token. This is where the
stack counts tokens: the gateway does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common import metrics
from services.scheduler.request import Request
from services.scheduler.scheduler import Scheduler
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.step import ScheduledStep
from services.scheduler.worker_info import WorkerInfo

LABELS = ("model", "worker")

# The tokenizer counts under the same name the moves between scheduler replicas (reason
# scheduler_lost / scheduler_unavailable); each move is counted once, by the tier that made it.
WORKER_LOST = "worker_lost"  # the reason label of a migration after a lost worker
REQUEST_MIGRATIONS = metrics.counter(
    "request_migrations_total",
    "Requests moved to another worker of their model after theirs was lost mid-stream "
    "(reason worker_lost: killed, connection reset, or silent past the keepalive timeout).",
    ("model", "reason"),
)
QUEUE_TIME = metrics.histogram(
    "request_queue_time_seconds",
    "Time a request waited in its worker's queue before its first step.",
    metrics.LATENCY_BUCKETS,
    ("model",),
)
ITERATION_TOKENS = metrics.histogram(
    "iteration_tokens_total",
    "Tokens computed per engine step (prefill chunks and decodes together).",
    metrics.TOKEN_BUCKETS,
    ("model",),
)
# fmt: off
PREDICTION_ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096)
# fmt: on
PREDICTION_ERROR = metrics.histogram(
    "prefix_cache_prediction_error_tokens",
    "Per request routed by prefix, at its first start: the cached prefix tokens the router "
    "expected at the worker it chose, less those the worker's cache served (> 0: the router "
    "counted on blocks that were gone or not computed yet; < 0: it missed some). Signed, so "
    "it has no _sum (OpenMetrics).",
    PREDICTION_ERROR_BUCKETS,
    ("model",),
)

ACCEPTED_LENGTH = metrics.histogram(
    "spec_decode_accepted_length",
    "Speculative decoding: per request and step that carried proposals, the tokens the request "
    "got from the step (proposals accepted + 1); its mean is the mean accepted length.",
    (1, 2, 3, 4, 5, 6, 8, 10, 12, 16),
    ("model",),
)

_GAUGES: tuple[tuple[str, str, Callable[[Scheduler], float]], ...] = (
    ("num_requests_running", "Requests in the running batch.", lambda s: len(s.running)),
    ("num_requests_waiting", "Requests queued to start or resume.", lambda s: s.num_waiting),
    (
        "kv_cache_usage_perc",
        "Fraction of the worker's KV blocks in use (1 = full; cached blocks nobody uses "
        "count as free).",
        lambda s: 1.0 - s.kv.pool.num_free / s.kv.pool.num_blocks,
    ),
)
_COUNTERS: tuple[tuple[str, str, Callable[[Scheduler], float]], ...] = (
    (
        "prefix_cache_queries",
        "Tokens of the requests started or resumed with prefix caching on.",
        lambda s: s.stats.num_prefix_query_tokens,
    ),
    (
        "prefix_cache_hits",
        "Of those, the tokens whose KV came from the prefix cache.",
        lambda s: s.stats.num_prefix_hit_tokens,
    ),
    (
        "num_preemptions",
        "Running requests preempted (blocks freed, recomputed later).",
        lambda s: s.stats.num_preemptions,
    ),
    (
        "prompt_tokens",
        "Prompt tokens of requests whose prefill is done.",
        lambda s: s.stats.num_prompt_tokens,
    ),
    ("generation_tokens", "Tokens sampled.", lambda s: s.stats.num_generation_tokens),
    (
        "queue_full_rejections",
        "Requests refused (RESOURCE_EXHAUSTED) because the worker's queue was full.",
        lambda s: s.stats.num_rejected,
    ),
    (
        "spec_decode_num_drafts",
        "Speculative decoding: request-steps that carried proposed tokens.",
        lambda s: s.stats.num_spec_steps,
    ),
    (
        "spec_decode_num_draft_tokens",
        "Speculative decoding: tokens proposed (and computed) for verification.",
        lambda s: s.stats.num_draft_tokens,
    ),
    (
        "spec_decode_num_accepted_tokens",
        "Speculative decoding: proposed tokens the worker accepted (output for free).",
        lambda s: s.stats.num_accepted_tokens,
    ),
    (
        "queue_timeouts",
        "Requests ended (DEADLINE_EXCEEDED) after waiting too long to start.",
        lambda s: s.stats.num_expired,
    ),
)


class Worker(Protocol):
    """What the collector reads of an Engine."""

    address: str
    info: WorkerInfo | None  # once connected
    scheduler: Scheduler | None


class SchedulerCollector(Collector):
    """Reads every engine's Scheduler when Prometheus scrapes. Runs on the metrics server's
    thread: it only reads lengths and integers, and a value a step changes meanwhile shows
    up at the next scrape."""

    def __init__(self, workers: Callable[[], Sequence[Worker]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauges = [
            (GaugeMetricFamily(metrics.PREFIX + name, doc, labels=LABELS), read)
            for name, doc, read in _GAUGES
        ]
        counters = [
            (CounterMetricFamily(metrics.PREFIX + name, doc, labels=LABELS), read)
            for name, doc, read in _COUNTERS
        ]
        for worker in list(self._workers()):
            scheduler, info = worker.scheduler, worker.info
            if scheduler is None or info is None:
                continue  # not connected: nothing to say, and no model to say it for
            labels = [info.model, worker.address]
            for family, read in gauges + counters:
                family.add_metric(labels, read(scheduler))
        for family, _ in gauges + counters:
            yield family


class SchedulerMetrics(SchedulerObserver):
    """Observes the steps of the Scheduler of a worker serving `model`."""

    def __init__(self, model: str) -> None:
        self.model = model
        # Zeros until a request speculates or a worker is lost: the series exist from the start.
        ACCEPTED_LENGTH.labels(model)
        REQUEST_MIGRATIONS.labels(model, WORKER_LOST)

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        observe_step(self.model, step, now)

    def speculated(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        ACCEPTED_LENGTH.labels(self.model).observe(num_accepted + 1)


def observe_step(model: str, step: ScheduledStep, now: float) -> None:
    """Called once per step sent to the worker, with the scheduler's clock."""
    if step.num_tokens:  # not a step that only tells the worker to forget requests
        ITERATION_TOKENS.labels(model).observe(step.num_tokens)
    for new in step.new:
        request = new.request
        if request.num_preemptions == 0:  # its first start; later ones resume it
            QUEUE_TIME.labels(model).observe(now - request.arrival)
            observe_prediction(model, request)


def observe_prediction(model: str, request: Request) -> None:
    """At a request's first start, once num_cached_tokens is known."""
    if request.predicted_cached_tokens is not None:
        error = request.predicted_cached_tokens - request.num_cached_tokens
        PREDICTION_ERROR.labels(model).observe(error)
