"""One POST /v1/responses: its parsed generation request, its renderer, and its storing.

    call = await parse_responses_call(body, store, request_id, tenant, trace_context, limits)
    ... serve call.parsed with call.renderer, as chat completions are served ...
    await call.keep(store, tenant)  # unless `store: false`, or it did not finish

`previous_response_id` continues a stored conversation (its messages and its output; not its
instructions, as OpenAI's API does). Everything else is the chat completions path's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument, NotFound
from services.gateway.log_text import excerpt
from services.gateway.openai_fields import JsonObject, get_bool, get_object, get_str
from services.gateway.openai_protocol import ParsedRequest, parse_chat_request
from services.gateway.request_limits import RequestLimits
from services.gateway.responses_events import ResponsesRenderer, assistant_turn
from services.gateway.responses_request import chat_body, responses_param
from services.gateway.responses_store import ResponseStore, StoredResponse
from services.gateway.responses_tools import chat_tool_params

MAX_METADATA_PAIRS = 16  # OpenAI's bounds on `metadata`
MAX_METADATA_VALUE = 512


@dataclass(slots=True)
class ResponsesCall:
    parsed: ParsedRequest
    renderer: ResponsesRenderer
    store: bool  # keep the response for GET and previous_response_id
    messages: list[JsonObject]  # the conversation so far, this request's input last

    async def keep(self, store: ResponseStore, tenant: str) -> None:
        if not self.store or self.renderer.status not in ("completed", "incomplete"):
            return
        response = self.renderer.snapshot()
        messages = [*self.messages, assistant_turn(response["output"])]
        await store.put(StoredResponse(tenant, response, messages))


async def parse_responses_call(
    body: JsonObject,
    store: ResponseStore,
    request_id: str,
    tenant: str,
    trace_context: dict[str, str] | None,
    limits: RequestLimits,
) -> ResponsesCall:
    history = await _history(store, get_str(body, "previous_response_id"), tenant)
    chat = chat_body(body, history)
    try:
        parsed = parse_chat_request(chat, trace_context, limits, request_id=request_id)
    except InvalidArgument as err:
        raise responses_param(err, chat_tool_params(body.get("tools"))) from None
    response_id = f"resp_{request_id}"
    parsed.response_id = response_id
    for index, request in enumerate(parsed.requests):
        request.request_id = f"{response_id}-{index}"
    keep = get_bool(body, "store", True)
    fields = _echoed_fields(body, parsed, keep)
    conversation = chat["messages"][1:] if body.get("instructions") else chat["messages"]
    return ResponsesCall(parsed, ResponsesRenderer(response_id, fields), keep, conversation)


async def _history(store: ResponseStore, previous_id: str | None, tenant: str) -> list[JsonObject]:
    """The stored conversation that previous_response_id continues."""
    if not previous_id:
        return []
    try:
        return (await store.get(previous_id, tenant)).messages
    except NotFound:
        raise NotFound(
            f"Previous response with id {excerpt(previous_id)} not found.",
            param="previous_response_id",
        ) from None


def _echoed_fields(body: JsonObject, parsed: ParsedRequest, store: bool) -> JsonObject:
    """The request's settings as the response object repeats them."""
    sampling = parsed.requests[0].sampling
    # A field the client left out gets the serving model's recommended value in the tokenizer
    # (README "Model defaults"), which the gateway does not know: it is echoed as null.
    unset = parsed.requests[0].sampling_unset
    user = get_str(body, "user")  # OpenAI's schema wants a string or nothing
    return {
        **({"user": user} if user is not None else {}),
        "model": parsed.model,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "parallel_tool_calls": parsed.requests[0].parallel_tool_calls,
        "temperature": None if "temperature" in unset else sampling.temperature,
        "top_p": None if "top_p" in unset else sampling.top_p,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [_echoed_tool(tool) for tool in body.get("tools") or []],
        "text": {"format": get_object(body, "text").get("format") or {"type": "text"}},
        "truncation": "disabled",
        "store": store,
        "metadata": _metadata(body),
        "background": False,
        "reasoning": None,
        "service_tier": "default",
        "top_logprobs": 0,
        "max_tool_calls": None,
    }


def _echoed_tool(tool: JsonObject) -> JsonObject:
    if tool.get("type") == "custom":
        keys = ("type", "name", "description", "format")
        return {key: tool[key] for key in keys if key in tool}
    if tool.get("type") != "function":
        return dict(tool)  # a built-in tool, as given (it is not offered to the model)
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict", True),  # the schema is always enforced
    }


def _metadata(body: JsonObject) -> dict[str, Any]:
    metadata = get_object(body, "metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidArgument(
            f"metadata takes at most {MAX_METADATA_PAIRS} pairs", param="metadata"
        )
    for key, value in metadata.items():
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE or len(key) > 64:
            raise InvalidArgument(
                f"metadata values must be strings of at most {MAX_METADATA_VALUE} characters "
                "(keys at most 64)",
                param="metadata",
            )
    return metadata
