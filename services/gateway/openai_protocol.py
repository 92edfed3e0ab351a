"""OpenAI request bodies (POST /v1/completions, /v1/chat/completions) -> GenerationRequests.

Validation happens here, before anything reaches the stack, so a bad request costs no tokenizer
or scheduler work and its error names the offending field (`param`): JSON types and the
OpenAI-only fields here, every rule the gRPC API shares in request_validator.py. Unknown fields
are ignored, as vLLM does; known OpenAI features the stack lacks (suffix, logit_bias, the
deprecated `functions`, ...) are refused rather than silently ignored. Output constraints
(response_format, vLLM's guided_*): openai_structured.py; tools: openai_tools.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.gateway.backend import MODEL_DEFAULT_FIELDS, GenerationRequest
from services.gateway.json_body import parse_object
from services.gateway.openai_fields import (
    INT32_MAX,
    INT32_MIN,
    JsonObject,
    get_bool,
    get_int,
    get_number,
    get_object,
    get_stop,
    get_str,
    get_token_ids,
    reject_if_set,
    token_id_list,
)
from services.gateway.openai_messages import parse_messages
from services.gateway.openai_structured import parse_structured
from services.gateway.openai_tools import parse_tools
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.request_validator import validate_request

MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API caps logprobs at 5
MAX_CHAT_TOP_LOGPROBS = 20
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; SamplingOptions' own default (0) means greedy
_SEED_STRIDE = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads consecutive choice seeds apart
_SEED_LIMIT = 2**63


class RequestKind(Enum):
    COMPLETION = "text_completion"
    CHAT = "chat.completion"


@dataclass(slots=True)
class ParsedRequest:
    """A validated OpenAI request: one GenerationRequest per choice, ids f"{response_id}-{i}"."""

    kind: RequestKind
    response_id: str
    model: str
    stream: bool
    include_usage: bool
    requests: list[GenerationRequest]


def parse_json_body(raw: bytes) -> JsonObject:
    return parse_object(raw)  # json_body.py; the HTTP app parses big bodies off the loop


def parse_completion_request(
    body: JsonObject,
    trace_context: dict[str, str] | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
    *,
    request_id: str,
) -> ParsedRequest:
    """request_id: the id the gateway minted for the request (http_app.py)."""
    logprobs = get_int(body, "logprobs", low=0, high=MAX_COMPLETION_LOGPROBS)
    template = _template(body, logprobs, trace_context, limits)
    template.prompt, template.prompt_token_ids = _parse_prompt(body.get("prompt"))
    template.echo = get_bool(body, "echo", False)
    if template.echo:  # OpenAI's legacy echo: logprobs then cover the prompt's tokens too
        template.sampling.prompt_logprobs = logprobs
    reject_if_set(body, "suffix", bool(body.get("suffix")), "suffix")
    max_tokens = get_int(body, "max_tokens")
    param = None if max_tokens is None else "max_tokens"
    template.max_tokens = MaxTokens(max_tokens or 0)
    return _parsed(
        body,
        RequestKind.COMPLETION,
        f"cmpl-{request_id}",
        template,
        limits,
        param,
        DEFAULT_COMPLETION_MAX_TOKENS,
    )


def parse_chat_request(
    body: JsonObject,
    trace_context: dict[str, str] | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
    *,
    request_id: str,
) -> ParsedRequest:
    template = _template(body, _chat_logprobs(body), trace_context, limits)
    template.messages = parse_messages(body.get("messages"), limits)
    _reject_unsupported_chat_features(body)
    parse_tools(body, template, limits)
    template.add_generation_prompt = get_bool(body, "add_generation_prompt", True)
    # max_completion_tokens replaced max_tokens in OpenAI's chat API; the newer name wins.
    param = "max_completion_tokens"
    chosen = get_int(body, param)
    if chosen is None:
        param, chosen = "max_tokens", get_int(body, "max_tokens")
    template.max_tokens = MaxTokens(chosen or 0)
    response_id = f"chatcmpl-{request_id}"
    given = None if chosen is None else param
    return _parsed(body, RequestKind.CHAT, response_id, template, limits, given, None)


def _parse_prompt(value: Any) -> tuple[str | None, list[int] | None]:
    """`prompt`: a string, a list of token ids, or a one-element list of either."""
    if value is None:
        raise InvalidArgument("prompt is required", param="prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value, None
    if not isinstance(value, list):
        raise InvalidArgument("prompt must be a string or an array of token ids", param="prompt")
    if value and all(isinstance(p, str | list) for p in value):
        raise InvalidArgument("batched prompts are not supported", param="prompt")
    return None, token_id_list(value, "prompt")


def _chat_logprobs(body: JsonObject) -> int | None:
    """Chat asks with a flag plus a count of alternatives; the stack wants just the count."""
    wanted = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", low=0, high=MAX_CHAT_TOP_LOGPROBS)
    if top and not wanted:
        raise InvalidArgument("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (top or 0) if wanted else None


def _reject_unsupported_chat_features(body: JsonObject) -> None:
    for name in ("functions", "function_call"):
        reject_if_set(body, name, body.get(name) is not None, f"{name} (deprecated; use tools)")


def _template(
    body: JsonObject,
    logprobs: int | None,
    trace_context: dict[str, str] | None,
    limits: RequestLimits,
) -> GenerationRequest:
    """The fields every choice shares; the prompt and ids are filled in by the caller."""
    reject_if_set(body, "logit_bias", bool(body.get("logit_bias")), "logit_bias")
    sampling = _sampling(body, logprobs)
    sampling.structured, structured_param = parse_structured(body)
    return GenerationRequest(
        request_id="",
        model=get_str(body, "model") or "",
        sampling=sampling,
        sampling_unset=_unset(body),
        structured_param=structured_param or "response_format",
        stop=get_stop(body),
        stop_token_ids=get_token_ids(body, "stop_token_ids"),
        ignore_eos=get_bool(body, "ignore_eos", False),
        skip_special_tokens=get_bool(body, "skip_special_tokens", True),
        priority=get_int(body, "priority", low=INT32_MIN, high=INT32_MAX) or 0,
        trace_context=dict(trace_context or {}),
        max_prompt_tokens=limits.max_prompt_tokens,
    )


def _sampling(body: JsonObject, logprobs: int | None) -> SamplingOptions:
    top_k = get_int(body, "top_k", high=INT32_MAX)
    options = SamplingOptions(
        temperature=get_number(body, "temperature", DEFAULT_TEMPERATURE),
        top_p=get_number(body, "top_p", 1.0),
        top_k=0 if top_k in (None, -1) else top_k,  # vLLM spells "off" as -1
        min_p=get_number(body, "min_p", 0.0),
        repetition_penalty=get_number(body, "repetition_penalty", 1.0),
        presence_penalty=get_number(body, "presence_penalty", 0.0),
        frequency_penalty=get_number(body, "frequency_penalty", 0.0),
        seed=get_int(body, "seed"),
        logprobs=logprobs,
    )
    return options  # validated with the rest, by request_validator


def _unset(body: JsonObject) -> tuple[str, ...]:
    """The fields a model may recommend that the client left out (null counts as out)."""
    return tuple(name for name in MODEL_DEFAULT_FIELDS if body.get(name) is None)


def _parsed(
    body: JsonObject,
    kind: RequestKind,
    response_id: str,
    template: GenerationRequest,
    limits: RequestLimits,
    max_tokens_param: str | None,
    preferred_default: int | None,
) -> ParsedRequest:
    n = get_int(body, "n", low=1, high=limits.max_n) or 1
    best_of = get_int(body, "best_of", low=1)
    reject_if_set(body, "best_of", best_of is not None and best_of != n, "best_of other than n")
    stream = get_bool(body, "stream", False)
    # stream_options means nothing without stream; OpenAI refuses it, vLLM too, we ignore it.
    include_usage = _include_usage(body) and stream
    validate_request(template, n, limits, max_tokens_param, preferred_default)
    requests = [_choice(template, response_id, i) for i in range(n)]
    return ParsedRequest(kind, response_id, template.model, stream, include_usage, requests)


def _include_usage(body: JsonObject) -> bool:
    value = get_object(body, "stream_options").get("include_usage")
    if value is None or isinstance(value, bool):
        return bool(value)
    param = "stream_options.include_usage"
    raise InvalidArgument(f"{param} must be a boolean", param=param)


def _choice(template: GenerationRequest, response_id: str, index: int) -> GenerationRequest:
    """Choice i's request. With a seed, choice 0 keeps it (n=1 samples exactly as the seed
    says) and the others get distinct derived seeds, so n choices are not n copies."""
    sampling = template.sampling
    if sampling.seed is not None and index > 0:
        sampling = replace(sampling, seed=(sampling.seed + index * _SEED_STRIDE) % _SEED_LIMIT)
    else:
        sampling = replace(sampling)
    return replace(template, request_id=f"{response_id}-{index}", sampling=sampling)
