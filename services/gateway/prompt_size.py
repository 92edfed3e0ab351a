"""How big a prompt is before it is tokenized: everything the model will read counts.

A chat template renders more than the messages' content: each message's role and delimiters
(an empty message still costs tokens), its name and tool_call_id, the tool calls of an
assistant turn (names and arguments), and the tools offered (names, descriptions, parameter
schemas). All of it is counted here, by the size guard (request_validator.py, prompt_guard.py)
and by the reservation against the key's token bucket (front_door.py), so text outside
`messages` can neither pass the guard nor go unreserved. The counts of messages, tools and
tool calls are bounded before anything is built from them (check_count).
"""

from __future__ import annotations

import math

from services.common.errors import InvalidArgument
from services.gateway.backend import GenerationRequest
from services.gateway.request_limits import RequestLimits

# Characters per token of ordinary text, to estimate a prompt not tokenized yet; the settlement
# at the end corrects the estimate either way.
CHARS_PER_TOKEN = 4
# Tokens a chat template adds around each message, tool and tool call: at least one (a role or
# a delimiter) for the size guard's lower bound; about four (OpenAI counts 3 to 4 per message)
# for the reservation's estimate.
MIN_TOKENS_PER_PIECE = 1
ESTIMATED_TOKENS_PER_PIECE = 4


def check_count(count: int, limit: int, param: str) -> None:
    """Raises a 400 naming `param` when it holds more than `limit` items."""
    if count > limit:
        raise InvalidArgument(
            f"{param}: array too long; this server takes at most {limit} items, got {count}",
            param=param,
        )


def check_counts(request: GenerationRequest, limits: RequestLimits) -> None:
    """The counts of a request's messages, tools and each message's tool calls."""
    check_count(len(request.tools), limits.max_tools, "tools")
    if request.messages is None:
        return
    check_count(len(request.messages), limits.max_messages, "messages")
    for i, message in enumerate(request.messages):
        check_count(len(message.tool_calls), limits.max_tools, f"messages[{i}].tool_calls")


def prompt_texts(request: GenerationRequest) -> list[str]:
    """Every text of the prompt the model will read (a token-id prompt has none)."""
    if request.messages is None:
        texts = [request.prompt or ""]
    else:
        texts = []
        for m in request.messages:
            texts += (m.content, m.name, m.tool_call_id)
            for call in m.tool_calls:
                texts += (call.id, call.name, call.arguments)
    for tool in request.tools:
        texts += (tool.name, tool.description, tool.parameters)
    return texts


def pieces(request: GenerationRequest) -> int:
    """The messages, tool calls and tools a template wraps, each in a few tokens of its own."""
    messages = request.messages or []
    return len(messages) + sum(len(m.tool_calls) for m in messages) + len(request.tools)


def prompt_param(request: GenerationRequest) -> str:
    return "prompt" if request.messages is None else "messages"


def check_prompt_size(
    request: GenerationRequest, max_prompt_tokens: int, limits: RequestLimits
) -> None:
    """Refuses, before any tokenizing, a prompt that cannot fit max_prompt_tokens: no token
    covers more than max_bytes_per_token bytes (request_limits.py says why), so B bytes need at
    least B / max_bytes_per_token tokens, and each message, tool call and tool at least one
    more."""
    per_token = limits.max_bytes_per_token
    bound = max_prompt_tokens * per_token
    size = pieces(request) * MIN_TOKENS_PER_PIECE * per_token
    for text in prompt_texts(request):
        # A character is 1 to 4 bytes: encode only when the length alone cannot decide.
        size += len(text) if len(text) > bound or 4 * len(text) <= bound else _utf8_len(text)
        if size > bound:
            break
    if size > bound:
        what = "the prompt" if request.messages is None else "the messages and tools"
        raise InvalidArgument(
            f"{what} cannot fit in {max_prompt_tokens} tokens (over {bound} bytes, counting "
            f"{per_token} per message, tool call and tool); this server accepts at most "
            f"{max_prompt_tokens} prompt tokens",
            param=prompt_param(request),
        )


def estimated_tokens(request: GenerationRequest) -> int:
    """The prompt's tokens, estimated from its characters, for the reservation."""
    if request.prompt_token_ids is not None:
        return len(request.prompt_token_ids)
    chars = sum(map(len, prompt_texts(request)))
    estimate = math.ceil(chars / CHARS_PER_TOKEN) + pieces(request) * ESTIMATED_TOKENS_PER_PIECE
    if request.max_prompt_tokens:
        estimate = min(estimate, request.max_prompt_tokens)
    return estimate


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
