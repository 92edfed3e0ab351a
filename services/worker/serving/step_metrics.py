"""What the worker measures: how long its engine steps take."""

from __future__ import annotations

from services.common import metrics

MODEL_FORWARD_TIME = metrics.histogram(
    "model_forward_time_seconds",
    "Time of one engine step on the worker: the forward pass over the batch and sampling.",
    metrics.STEP_BUCKETS,
    ("model",),
)
