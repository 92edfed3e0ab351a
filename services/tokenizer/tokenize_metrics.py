"""What the tokenizer service measures: how long prompts take to tokenize."""

from __future__ import annotations

from services.common import metrics

TOKENIZE_TIME = metrics.histogram(
    "tokenize_time_seconds",
    "Time to tokenize one prompt (chat template included), with the wait for a thread of the "
    "tokenizing pool.",
    metrics.STEP_BUCKETS,
    ("model",),
)
