"""One validator for both front ends (issue 17 row 5): generated requests, each sent as an
OpenAI JSON body and as a gRPC GenerateRequest, are accepted or refused alike, a refusal naming
the same field (HTTP 400 param / gRPC INVALID_ARGUMENT from the same InvalidArgument)."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from services.common.errors import InvalidArgument
from services.common.grpc_status import grpc_code
from services.gateway.api_keys import KeyRing
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, request_from_proto
from services.gateway.openai_protocol import parse_chat_request, parse_completion_request
from services.gateway.request_limits import RequestLimits
from tests.unit.gateway.conftest import grpc_gateway
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

LIMITS = RequestLimits(max_prompt_tokens=64, max_tokens=500)
_TEXT = st.one_of(
    st.sampled_from(["", "hi", "a b c", "x" * 300, "ü" * 5000, "line\nbreak"]),
    st.text(max_size=20),
)
_MODEL = st.sampled_from(["m", "smollm2-135m-instruct", "", "evil\nname", "a b", "m" * 300])
_ROLE = st.sampled_from(["user", "system", "assistant", "developer", "evil", "tool", ""])
_STOPS = st.lists(st.sampled_from(["", "stop", "\n", "s" * 300]), max_size=6)
# Values float32 (the proto's type) holds exactly, so both wires carry the same number.
_TEMPERATURE = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 2.5])
_TOP_P = st.sampled_from([0.25, 1.0, 1.5])  # the proto's 0 means "unset"
_MAX_TOKENS = st.one_of(st.none(), st.sampled_from([-1, 0, 1, 16, 500, 501, 2**31 - 1]))


@st.composite
def requests(draw) -> dict:
    fields = {
        "model": draw(_MODEL),
        "max_tokens": draw(_MAX_TOKENS),
        "stop": draw(_STOPS),
        "temperature": draw(_TEMPERATURE),
        "top_p": draw(_TOP_P),
    }
    if draw(st.booleans()):
        fields["prompt"] = draw(_TEXT)
    else:
        roles = draw(st.lists(_ROLE, max_size=3))
        fields["messages"] = [{"role": r, "content": draw(_TEXT)} for r in roles]
    return fields


def _http_outcome(fields: dict) -> str | None:
    body = {k: v for k, v in fields.items() if v is not None}
    parse = parse_chat_request if "messages" in body else parse_completion_request
    try:
        parse(body, None, LIMITS, request_id="r-1")
    except InvalidArgument as err:
        return err.param or "?"
    return None


def _proto(fields: dict) -> gateway_pb2.GenerateRequest:
    msg = gateway_pb2.GenerateRequest(
        model=fields["model"],
        stop=fields["stop"],
        sampling=common_pb2.SamplingParams(
            temperature=fields["temperature"], top_p=fields["top_p"]
        ),
    )
    if fields["max_tokens"] is not None:
        msg.max_tokens = fields["max_tokens"]
    if "prompt" in fields:
        msg.prompt = fields["prompt"]
    else:
        msg.chat.SetInParent()
        for m in fields["messages"]:
            msg.chat.messages.add(role=m["role"], content=m["content"])
    return msg


def _grpc_outcome(fields: dict) -> str | None:
    try:
        request_from_proto(_proto(fields), "gen-1", {}, LIMITS)
    except InvalidArgument as err:
        assert grpc_code(err) == grpc.StatusCode.INVALID_ARGUMENT
        return err.param or "?"
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_http_and_grpc_accept_and_refuse_the_same_requests(fields: dict) -> None:
    assert _http_outcome(fields) == _grpc_outcome(fields)


@pytest.mark.parametrize(
    ("fields", "param"),
    [  # issue 17 row 5's probes: each was OK over gRPC
        ({"messages": [{"role": "evil", "content": "hi"}]}, "messages[0].role"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "x" * 20_000}, "prompt"),  # over 64 tokens x 128 bytes: never tokenized
    ],
)
def test_the_issues_grpc_probes_are_refused_like_http(fields: dict, param: str) -> None:
    fields = {
        "model": "m",
        "max_tokens": None,
        "stop": [],
        "temperature": 0.0,
        "top_p": 1.0,
        **fields,
    }
    assert _grpc_outcome(fields) == _http_outcome(fields) == param


async def test_the_public_grpc_port_takes_no_message_over_the_body_limit() -> None:
    """A 20 MB GenerateRequest was read and tokenized for 20.9 s; the limit is now the HTTP
    body limit, enforced by gRPC before the servicer sees anything."""
    limits = RequestLimits(max_body_bytes=1024)
    servicer = GatewayServicer(EchoBackend(), FrontDoor(KeyRing([])), limits)
    async with grpc_gateway(servicer, limits) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_stream(
                "/layerserve.gateway.v1.Gateway/Generate",
                request_serializer=gateway_pb2.GenerateRequest.SerializeToString,
                response_deserializer=gateway_pb2.GenerateResponse.FromString,
            )
            small = gateway_pb2.GenerateRequest(model=MODEL, prompt="x " * 30, max_tokens=2)
            assert [r.text async for r in call(small)][-1] != ""
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call(gateway_pb2.GenerateRequest(model=MODEL, prompt="x" * 2048)):
                    pass
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
