"""Request parsing: what reaches the stack, and which field an error names."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.gateway.openai_protocol import (
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hello", **fields}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_completion_defaults_follow_openai() -> None:
    parsed = parse_completion_request(_completion(), request_id="r-1")
    (request,) = parsed.requests
    assert parsed.response_id.startswith("cmpl-")
    assert request.request_id == f"{parsed.response_id}-0"
    assert request.prompt == "hello" and request.prompt_token_ids is None
    assert request.max_tokens == MaxTokens.cap(16)
    assert request.sampling.temperature == 1.0
    assert request.sampling.logprobs is None
    assert not parsed.stream and not parsed.include_usage


def test_completion_carries_every_parameter() -> None:
    parsed = parse_completion_request(
        _completion(
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.1,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            seed=3,
            stop="END",
            stop_token_ids=[2, 3],
            ignore_eos=True,
            priority=-1,
            logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
            unknown_field={"x": 1},
        ),
        {"traceparent": "00-abc-def-01"},
        request_id="r-1",
    )
    (request,) = parsed.requests
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.5, 0.9, 40, 0.1)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.1, 0.5, -0.5)
    assert (s.seed, s.logprobs) == (3, 2)
    assert request.max_tokens == MaxTokens(7) and request.stop == ["END"]
    assert request.stop_token_ids == [2, 3] and request.ignore_eos and request.priority == -1
    assert request.trace_context == {"traceparent": "00-abc-def-01"}
    assert parsed.stream and parsed.include_usage


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7]]])
def test_completion_prompt_as_token_ids(prompt: list[Any]) -> None:
    (request,) = parse_completion_request(_completion(prompt=prompt), request_id="r-1").requests
    assert request.prompt is None and request.prompt_token_ids == [5, 6, 7]


def test_one_element_prompt_list_is_a_string_prompt() -> None:
    (request,) = parse_completion_request(
        _completion(prompt=["hi there"]), request_id="r-1"
    ).requests
    assert request.prompt == "hi there"


def test_n_choices_get_distinct_ids_and_seeds() -> None:
    parsed = parse_chat_request(_chat(n=3, seed=42), request_id="r-1")
    ids = [r.request_id for r in parsed.requests]
    seeds = [r.sampling.seed for r in parsed.requests]
    assert ids == [f"{parsed.response_id}-{i}" for i in range(3)]
    assert seeds[0] == 42 and len(set(seeds)) == 3
    assert all(0 <= s < 2**63 for s in seeds)
    # Each choice owns its sampling options: no aliasing between requests.
    assert len({id(r.sampling) for r in parsed.requests}) == 3


def test_n_choices_without_seed_stay_unseeded() -> None:
    parsed = parse_completion_request(_completion(n=2), request_id="r-1")
    assert [r.sampling.seed for r in parsed.requests] == [None, None]


def test_chat_messages_and_parts() -> None:
    body = _chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    (request,) = parse_chat_request(body, request_id="r-1").requests
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "be brief"),
        ("user", "a\nb"),
        ("assistant", ""),
    ]
    assert request.add_generation_prompt
    # chat default: LAYERSERVE_DEFAULT_MAX_TOKENS, a cap the scheduler lowers to what fits
    assert request.max_tokens == MaxTokens.cap(1024)


def test_chat_max_completion_tokens_wins() -> None:
    (request,) = parse_chat_request(
        _chat(max_tokens=5, max_completion_tokens=9), request_id="r-1"
    ).requests
    assert request.max_tokens == MaxTokens(9)


def test_chat_logprobs_flag_and_count() -> None:
    (request,) = parse_chat_request(_chat(logprobs=True, top_logprobs=3), request_id="r-1").requests
    assert request.sampling.logprobs == 3
    (request,) = parse_chat_request(_chat(logprobs=True), request_id="r-1").requests
    assert request.sampling.logprobs == 0


def test_vllm_top_k_minus_one_means_off() -> None:
    (request,) = parse_completion_request(_completion(top_k=-1), request_id="r-1").requests
    assert request.sampling.top_k == 0


def test_stream_options_without_stream_are_ignored() -> None:
    parsed = parse_completion_request(
        _completion(stream_options={"include_usage": True}), request_id="r-1"
    )
    assert not parsed.include_usage


def test_nulls_mean_defaults() -> None:
    (request,) = parse_chat_request(
        _chat(temperature=None, max_tokens=None, stop=None, n=None, seed=None, logprobs=None),
        request_id="r-1",
    ).requests
    assert request.sampling.temperature == 1.0 and request.max_tokens == MaxTokens.cap(1024)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": None}, "model"),
        ({"model": 3}, "model"),
        ({"prompt": None}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": 12}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"stream_options": []}, "stream_options"),
        ({"stop_token_ids": [1, "x"]}, "stop_token_ids"),
        ({"ignore_eos": "no"}, "ignore_eos"),
        ({"priority": 1.5}, "priority"),
        ({"echo": "yes"}, "echo"),
        ({"suffix": "tail"}, "suffix"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
    ],
)
def test_completion_errors_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_completion_request(_completion(**fields), request_id="r-1")
    assert info.value.param == param


def test_batched_prompts_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="batched prompts are not supported"):
        parse_completion_request(_completion(prompt=["a", "b"]), request_id="r-1")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"add_generation_prompt": 1}, "add_generation_prompt"),
    ],
)
def test_chat_errors_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_chat_request(_chat(**fields), request_id="r-1")
    assert info.value.param == param


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b""])
def test_bad_json_bodies(raw: bytes) -> None:
    with pytest.raises(InvalidArgument):
        parse_json_body(raw)


def test_sampling_fields_left_out_are_named_for_the_model_defaults() -> None:
    (request,) = parse_chat_request(_chat(top_p=0.5, top_k=None), request_id="r-1").requests
    assert request.sampling_unset == ("temperature", "top_k", "min_p", "repetition_penalty")
    assert request.sampling.temperature == 1.0  # the API's default, where the model has none
    every = {"temperature": 0, "top_p": 1, "top_k": 3, "min_p": 0, "repetition_penalty": 1}
    (request,) = parse_completion_request(
        {"model": "m", "prompt": "a", **every}, request_id="r-1"
    ).requests
    assert request.sampling_unset == ()
