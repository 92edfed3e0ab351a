"""What the tokenizer service measures: how long prompts take to tokenize, and requests moved
to another scheduler replica."""

from __future__ import annotations

from services.common import metrics
from services.tokenizer.request_events import RequestListener

TOKENIZE_TIME = metrics.histogram(
    "tokenize_time_seconds",
    "Time to tokenize one prompt (chat template included), with the wait for a thread of the "
    "tokenizing pool.",
    metrics.STEP_BUCKETS,
    ("model",),
)

REQUEST_MIGRATIONS = metrics.counter(
    "request_migrations_total",
    "Requests submitted again to another scheduler replica after theirs lost them (reason: "
    "scheduler_lost, its stream broke; scheduler_unavailable, it answered UNAVAILABLE).",
    ("model", "reason"),
)


class TokenizeMetrics(RequestListener):
    """The tokenizer's metrics, from its request events."""

    __slots__ = ()

    def prompt_encoded(self, model: str, seconds: float) -> None:
        TOKENIZE_TIME.labels(model).observe(seconds)

    def migrated(self, request_id: str, model: str, reason: str, tokens_done: int) -> None:
        REQUEST_MIGRATIONS.labels(model, reason).inc()
