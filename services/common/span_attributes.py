"""The attributes every service puts on its spans: the OpenTelemetry GenAI semantic
conventions (`gen_ai.*`) for what was asked and what it cost, and ours (`layerserve.*`).

Counts, names and settings only: no attribute ever carries prompt or completion text.
"""

from __future__ import annotations

from services.common.sampling import SamplingOptions

# gen_ai.operation.name values (the conventions' own).
CHAT = "chat"
TEXT_COMPLETION = "text_completion"
PROVIDER = "layerserve"  # gen_ai.provider.name

# The id the client sees (X-Request-Id, else the response id): on the gateway's request span.
REQUEST_ID = "layerserve.request_id"
# The id of one choice inside the stack ("<response id>-<i>"), as every service's logs name it.
CHOICE_ID = "layerserve.choice_id"
WORKER = "layerserve.worker.address"
CACHED_TOKENS = "layerserve.cached_prefix_tokens"
PREEMPTIONS = "layerserve.preemptions"
FINISH_REASON = "layerserve.finish_reason"


def request_attributes(
    model: str, max_tokens: int, sampling: SamplingOptions, operation: str | None = None
) -> dict[str, object]:
    """gen_ai.request.*: the model and the settings that shape the output."""
    attributes: dict[str, object] = {
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.top_p": sampling.top_p,
    }
    if operation is not None:
        attributes["gen_ai.operation.name"] = operation
    if max_tokens:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if sampling.top_k:
        attributes["gen_ai.request.top_k"] = sampling.top_k
    if sampling.seed is not None:
        attributes["gen_ai.request.seed"] = sampling.seed
    return attributes


def usage_attributes(
    input_tokens: int, output_tokens: int, finish_reason: str | None = None
) -> dict[str, object]:
    """gen_ai.usage.* and, once known, gen_ai.response.finish_reasons."""
    attributes: dict[str, object] = {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = (finish_reason,)
        attributes[FINISH_REASON] = finish_reason
    return attributes
