"""OpenAI's POST /v1/embeddings body -> one GenerationRequest per input.

Each input is a prompt-only request through the same stack as a completion: tokenized, batched
by the scheduler with generation, its prefill computed by the worker, which pools the final
hidden states (as the model says: the last position for a decoder, or the mean) and
L2-normalises them; the scheduler ends the request there, with the vector and no token, so only
the prompt is counted and charged. `input` is a string, a list of strings, a list of token ids
or a list of such lists, as OpenAI's API takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.gateway.backend import GenerationRequest
from services.gateway.openai_fields import JsonObject, get_int, get_str, token_id_list
from services.gateway.openai_protocol import ParsedRequest, RequestKind
from services.gateway.request_limits import RequestLimits
from services.gateway.request_validator import validate_request

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingsCall:
    parsed: ParsedRequest  # one "choice" per input, in order
    encoding_format: str  # "float" | "base64"
    dimensions: int | None  # as asked; only the model's own size is served


def parse_embeddings_request(
    body: JsonObject,
    trace_context: dict[str, str],
    limits: RequestLimits,
    *,
    request_id: str,
) -> EmbeddingsCall:
    model = get_str(body, "model")
    if not model:
        raise InvalidArgument("model is required", param="model")
    encoding = get_str(body, "encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        raise InvalidArgument(
            f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}, got {encoding!r}",
            param="encoding_format",
        )
    dimensions = get_int(body, "dimensions", low=1)
    response_id = f"embd-{request_id}"
    requests = []
    for i, prompt in enumerate(_inputs(body.get("input"))):
        request = GenerationRequest(
            request_id=f"{response_id}-{i}",
            model=model,
            max_tokens=MaxTokens(1),  # the prompt's pass, which answers with no token
            sampling=SamplingOptions(),
            embed=True,
            trace_context=dict(trace_context),
            max_prompt_tokens=limits.max_prompt_tokens,
        )
        if isinstance(prompt, str):
            request.prompt = prompt
        else:
            request.prompt_token_ids = prompt
        validate_request(request, 1, limits, "max_tokens")
        requests.append(request)
    parsed = ParsedRequest(RequestKind.COMPLETION, response_id, model, False, False, requests)
    return EmbeddingsCall(parsed, encoding, dimensions)


def _inputs(value: Any) -> list[str | list[int]]:
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        value = [value]  # one prompt of token ids
    if not isinstance(value, list) or not value:
        raise InvalidArgument(
            "input must be a non-empty string, array of strings, array of token ids or array "
            "of arrays of token ids",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise InvalidArgument(
            f"input takes at most {MAX_INPUTS} items, got {len(value)}", param="input"
        )
    inputs: list[str | list[int]] = []
    for item in value:
        if isinstance(item, str) and item:
            inputs.append(item)
        elif isinstance(item, list) and item:
            inputs.append(token_id_list(item, "input"))
        else:
            raise InvalidArgument(
                "each input must be a non-empty string or array of token ids", param="input"
            )
    return inputs
