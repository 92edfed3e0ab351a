"""What the tokenizer service measures: how long prompts take to tokenize."""

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


class TokenizeMetrics(RequestListener):
    """The tokenizer's metrics, from its request events."""

    __slots__ = ()

    def prompt_encoded(self, model: str, seconds: float) -> None:
        TOKENIZE_TIME.labels(model).observe(seconds)
