"""The one validator of a generation request, shared by the HTTP and the gRPC front ends.

Each front end only turns its wire form into GenerationRequests (the HTTP one also checks JSON
types, which protobuf checks for the gRPC one); every rule about values lives here, in one
order, so both answer the same request with the same error naming the same field
(`InvalidArgument.param`): HTTP 400 with an OpenAI error body, gRPC INVALID_ARGUMENT.

Messages never echo what the client sent beyond a short, escaped excerpt (`excerpt`): a 7 MB
model name must not come back as a 7 MB error body, nor reach a log line.
"""

from __future__ import annotations

import re

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.gateway.backend import ChatMessage, GenerationRequest
from services.gateway.log_text import excerpt
from services.gateway.prompt_size import check_counts, check_prompt_size
from services.gateway.request_limits import RequestLimits
from services.gateway.tool_calling import check_tools

INT32_MAX = 2**31 - 1
MAX_MODEL_NAME_LENGTH = 256
# Visible ASCII only: no whitespace, no control characters (a newline would forge log lines),
# nothing a terminal or a log shipper could read as markup.
_MODEL_NAME = re.compile(r"[!-~]+")
# OpenAI's "developer" role is its newer name for "system"; open models' chat templates only
# know "system", so it is renamed here rather than failing inside the template.
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# OpenAI's deprecated predecessor of "tool" (function_call): not supported.
_UNSUPPORTED_ROLES = {"function"}


def validate_request(
    request: GenerationRequest,
    n: int,
    limits: RequestLimits,
    max_tokens_param: str | None,
    preferred_default: int | None = None,
) -> None:
    """Checks one request's values (its n choices share them); normalizes chat roles.
    max_tokens_param: the field the client set max_tokens with, whose value is checked against
    the operator's limits here (whether it fits the prompt is admission's question); None when
    it set none: request.max_tokens becomes the default, as a cap (max_tokens.py)."""
    check_model_name(request.model)
    _check_input(request, limits)
    if max_tokens_param is not None:
        check_max_tokens(request.max_tokens.limit, limits, max_tokens_param)
    _check_stop(request.stop, limits)
    if len(request.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidArgument(
            f"stop_token_ids takes at most {limits.max_stop_token_ids} ids, "
            f"got {len(request.stop_token_ids)}",
            param="stop_token_ids",
        )
    check_tools(request)
    # Whether the grammars compile is grammar_check.py's question, off the event loop.
    request.sampling.validate()
    if max_tokens_param is None:
        request.max_tokens = default_max_tokens(n, limits, preferred_default)
    elif n * request.max_tokens.limit > limits.max_request_tokens:
        raise InvalidArgument(
            f"n x {max_tokens_param} is {n * request.max_tokens.limit}; this server generates "
            f"at most {limits.max_request_tokens} tokens per request",
            param=max_tokens_param,
        )


def default_max_tokens(n: int, limits: RequestLimits, preferred: int | None = None) -> MaxTokens:
    """max_tokens for a request that set none: the preferred default within both of the
    operator's limits, as a cap admission lowers to what fits."""
    value = min(preferred or limits.default_max_tokens, limits.max_request_tokens // n)
    if limits.max_tokens:
        value = min(value, limits.max_tokens)
    return MaxTokens.cap(max(1, value))


def check_model_name(model: str) -> None:
    if not model:
        raise InvalidArgument("model is required", param="model")
    if len(model) > MAX_MODEL_NAME_LENGTH or not _MODEL_NAME.fullmatch(model):
        raise InvalidArgument(
            f"model must be 1 to {MAX_MODEL_NAME_LENGTH} visible ASCII characters "
            f"(got {excerpt(model)}, {len(model)} characters)",
            param="model",
        )


def check_max_tokens(value: int, limits: RequestLimits, param: str) -> None:
    high = limits.max_tokens or INT32_MAX
    if not 1 <= value <= high:
        raise InvalidArgument(f"{param} must be between 1 and {high}, got {value}", param=param)


def _check_input(request: GenerationRequest, limits: RequestLimits) -> None:
    check_counts(request, limits)
    if request.messages is not None:
        _check_messages(request.messages)
    elif request.prompt_token_ids is not None:
        ids = request.prompt_token_ids
        if not ids:
            raise InvalidArgument("prompt must not be empty", param="prompt")
        if limits.max_prompt_tokens and len(ids) > limits.max_prompt_tokens:
            raise InvalidArgument(
                f"prompt has {len(ids)} tokens; this server accepts at most "
                f"{limits.max_prompt_tokens} prompt tokens",
                param="prompt",
            )
        return
    elif not request.prompt:
        raise InvalidArgument("prompt must not be empty", param="prompt")
    if limits.max_prompt_tokens:  # tools and tool calls count: prompt_size.py
        check_prompt_size(request, limits.max_prompt_tokens, limits)


def _check_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise InvalidArgument("messages must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        role = message.role
        param = f"messages[{i}].role"
        if role in _UNSUPPORTED_ROLES:
            raise InvalidArgument(f"messages[{i}]: role {role!r} is not supported", param=param)
        if role not in _ROLES:
            allowed = ", ".join(sorted(_ROLES))
            raise InvalidArgument(f"{param} must be one of {allowed}", param=param)
        message.role = _ROLES[role]
        _check_tool_turn(message, f"messages[{i}]")


def _check_tool_turn(message: ChatMessage, param: str) -> None:
    if message.role == "tool" and not message.tool_call_id:
        raise InvalidArgument(
            f"{param}.tool_call_id is required in a tool message", param=f"{param}.tool_call_id"
        )
    if message.tool_calls and message.role != "assistant":
        raise InvalidArgument(
            f"{param}.tool_calls is only for assistant messages", param=f"{param}.tool_calls"
        )
    for j, call in enumerate(message.tool_calls):
        if not call.name:
            where = f"{param}.tool_calls[{j}].function.name"
            raise InvalidArgument(f"{where} is required", param=where)


def _check_stop(stops: list[str], limits: RequestLimits) -> None:
    if len(stops) > limits.max_stop_sequences:
        raise InvalidArgument(
            f"stop takes at most {limits.max_stop_sequences} sequences, got {len(stops)}",
            param="stop",
        )
    if any(not s for s in stops):
        raise InvalidArgument("stop sequences must not be empty", param="stop")
    longest = max(map(len, stops), default=0)
    if longest > limits.max_stop_length:
        raise InvalidArgument(
            f"stop sequences may be at most {limits.max_stop_length} characters, got {longest}",
            param="stop",
        )
