"""What the client hears of one request after a step: its new tokens (and its finish, with the
last one), or only an error. server.py turns these into scheduler.v1.RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import LayerserveError
from services.scheduler.request import FinishReason, Request
from services.scheduler.step import Sample


@dataclass(slots=True)
class Output:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[object] = field(default_factory=list)  # common.v1.TokenLogprob, untouched
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    finish_reason: FinishReason | None = None  # set on a request's last output
    error: LayerserveError | None = None  # set when it ended in an error (finish_reason ERROR)
    prompt_logprobs: list[object] = field(default_factory=list)  # with the first token only
    embedding: list[float] | None = None  # with the first token only
    migrations: int = 0  # the request's moves so far, by any tier (RequestOutput.migrations)

    @classmethod
    def sampled(cls, request: Request, *samples: Sample) -> Output:
        """The request's tokens of one step: one, or several with speculative decoding; the
        prompt's logprobs and embedding once (marked sent on the request). An embedding's one
        sample brings no token (result_applier.py)."""
        tokens = samples if request.sampling.pooling is None else ()
        output = cls(
            request.request_id,
            [sample.token_id for sample in tokens],
            [sample.logprob for sample in tokens if sample.logprob is not None],
            request.num_prompt_tokens,
            request.num_cached_tokens,
            request.finish_reason,
            migrations=request.num_migrations,
        )
        first = samples[0] if samples else None
        if first is not None and not request.prompt_outputs_sent:
            output.prompt_logprobs, output.embedding = first.prompt_logprobs, first.embedding
            request.prompt_outputs_sent = bool(first.prompt_logprobs) or first.embedding is not None
        return output

    @classmethod
    def failed(cls, request_id: str, error: LayerserveError) -> Output:
        return cls(request_id, finish_reason=FinishReason.ERROR, error=error)
