"""Completions' echo: the prompt in front of each choice, and with logprobs the prompt's tokens
in front of the generated ones (the first token's logprob null), as OpenAI's legacy API."""

from __future__ import annotations

import copy

import pytest

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from services.common.errors import InvalidArgument
from services.gateway.backend import GenerationDelta, TokenLogprob, TopLogprob
from services.gateway.grpc_api import request_from_proto
from services.gateway.openai_protocol import parse_completion_request
from services.gateway.openai_responses import ResponseBuilder
from tests.openai_schema import validate


def _parsed(**fields):
    body = {"model": "m", "prompt": "Hi there", "max_tokens": 2, **fields}
    return parse_completion_request(body, request_id="r-1")


def _lp(token: str, logprob: float | None) -> TokenLogprob:
    top = [] if logprob is None else [TopLogprob(token, token.encode(), logprob)]
    return TokenLogprob(token, token.encode(), logprob, top)


def _deltas() -> list[GenerationDelta]:
    """Two generated tokens; the prompt's logprobs come with the first."""
    first = GenerationDelta(" you", [10], [_lp(" you", -0.5)], prompt_tokens=2)
    first.prompt_logprobs = [_lp("Hi", None), _lp(" there", -3.0)]
    return [first, GenerationDelta("!", [11], [_lp("!", -1.0)], "stop", 2, 2)]


def test_echo_with_logprobs_asks_for_prompt_logprobs() -> None:
    (request,) = _parsed(echo=True, logprobs=2).requests
    assert request.echo and request.sampling.prompt_logprobs == 2
    (request,) = _parsed(echo=True).requests
    assert request.echo and request.sampling.prompt_logprobs is None
    (request,) = _parsed(logprobs=2).requests
    assert not request.echo and request.sampling.prompt_logprobs is None


def test_the_response_starts_with_the_prompt_and_its_tokens() -> None:
    builder = ResponseBuilder(_parsed(echo=True, logprobs=1), created=1)
    first, second = _deltas()
    merged = GenerationDelta(
        "".join((first.text, second.text)),
        [10, 11],
        first.logprobs + second.logprobs,
        "stop",
        2,
        2,
        prompt_logprobs=first.prompt_logprobs,
    )
    body = builder.response([merged])
    (choice,) = body["choices"]
    assert choice["text"] == "Hi there you!"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["Hi", " there", " you", "!"]
    assert logprobs["token_logprobs"] == [None, -3.0, -0.5, -1.0]
    assert logprobs["top_logprobs"][0] is None and logprobs["top_logprobs"][1] == {" there": -3.0}
    assert logprobs["text_offset"] == [0, 2, 8, 12]
    # OpenAI's published schema has no null items, though its API sends one for the first
    # token: everything else matches it.
    checked = copy.deepcopy(body)
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        del checked["choices"][0]["logprobs"][key][0]
    validate(checked, "CreateCompletionResponse")


def test_a_stream_echoes_in_its_first_chunk_only() -> None:
    builder = ResponseBuilder(_parsed(echo=True, stream=True), created=1)
    texts = [c["choices"][0]["text"] for d in _deltas() for c in builder.chunks(0, d)]
    assert texts == ["Hi there you", "!"]


def test_a_token_id_prompt_echoes_the_tokenizers_text() -> None:
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 2, "echo": True}
    builder = ResponseBuilder(parse_completion_request(body, request_id="r-1"), created=1)
    first, second = _deltas()
    first.prompt_text = "Hi there"
    texts = [c["choices"][0]["text"] for d in (first, second) for c in builder.chunks(0, d)]
    assert texts == ["Hi there you", "!"]


def test_grpc_refuses_prompt_logprobs_it_cannot_return() -> None:
    sampling = common_pb2.SamplingParams(prompt_logprobs=1)
    message = gateway_pb2.GenerateRequest(model="m", prompt="a", sampling=sampling)
    with pytest.raises(InvalidArgument) as info:
        request_from_proto(message, "g", {})
    assert info.value.param == "sampling.prompt_logprobs"
