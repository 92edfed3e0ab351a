"""Schemathesis against the gateway's own GET /openapi.json and the live gateway: no 5xx, every
answer has a documented status, content type, headers and body, and nothing hangs.

Two runs. Valid requests (positive mode) from a copy of the document narrowed to keep them
cheap: the served model, and max_tokens required and small (a valid chat request without it
generates up to the context length). Invalid ones (negative mode) from the document as served,
which must each be refused with a 4xx: where the gateway accepts what its document forbids, the
document is not honest.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.gateway.http_json import dumps
from services.gateway.openapi import openapi_document
from services.gateway.request_limits import DEFAULT_LIMITS
from services.stack import Stack
from tests.reliability.conftest import AUTH, FUZZ_PHASES, MODEL, serves_normally

REQUEST_TIMEOUT = 30.0  # seconds; a request still unanswered then is a hang
FUZZ_MAX_TOKENS = 4
GENERATION_REQUESTS = ("CreateCompletionRequest", "CreateChatCompletionRequest")
CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
FUZZ = settings(
    max_examples=75,
    deadline=None,  # REQUEST_TIMEOUT bounds each request of an example instead
    phases=FUZZ_PHASES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def narrowed(document: dict[str, Any]) -> dict[str, Any]:
    """The document with generation requests that name the served model and generate little."""
    document = copy.deepcopy(document)
    small = {"type": "integer", "minimum": 1, "maximum": FUZZ_MAX_TOKENS}
    for name in GENERATION_REQUESTS:
        schema = document["components"]["schemas"][name]
        schema["properties"]["model"] = {"const": MODEL}
        schema["properties"]["max_tokens"] = small
        schema["properties"].pop("max_completion_tokens", None)  # it would win over max_tokens
        schema["required"].append("max_tokens")
    return document


def _loaded(document: dict[str, Any], mode: GenerationMode):
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(headers=AUTH, request_timeout=REQUEST_TIMEOUT)
    schema.config.generation.update(modes=[mode])
    return schema


# What a gateway with default limits serves (the first test proves the stack's does); built
# here because schemathesis' pytest integration needs the schema when tests are collected.
DOCUMENT = json.loads(dumps(openapi_document(DEFAULT_LIMITS)))
valid = _loaded(narrowed(DOCUMENT), GenerationMode.POSITIVE)
# Only request bodies can be invalid: the GETs take no input but a free-form model id.
invalid = _loaded(DOCUMENT, GenerationMode.NEGATIVE).include(method="POST")


def test_gateway_serves_its_document_without_a_key(null_stack: Stack):
    response = httpx.get(f"{null_stack.http_url}/openapi.json", timeout=REQUEST_TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json() == DOCUMENT


@valid.parametrize()
@FUZZ
def test_valid_requests_get_documented_answers(case, null_stack: Stack):
    checks = CONFORMANCE
    if case.operation.path == "/ready":
        # Its documented 503 says "not ready", not "crashed": a probe of the stack that is
        # slow on a loaded machine reads as not ready, and that is the endpoint doing its job.
        checks = [check for check in CONFORMANCE if check is not not_a_server_error]
    case.call_and_validate(null_stack.http_url, timeout=REQUEST_TIMEOUT, checks=checks)


@invalid.parametrize()
@FUZZ
def test_invalid_requests_are_refused_as_documented(case, null_stack: Stack):
    checks = [*CONFORMANCE, negative_data_rejection]
    case.call_and_validate(null_stack.http_url, timeout=REQUEST_TIMEOUT, checks=checks)


def test_gateway_serves_after_fuzzing(null_stack: Stack):
    serves_normally(null_stack)
