"""The tokenizer refuses a constraint that does not compile for the target's vocabulary,
naming the client's field, before the request reaches the scheduler."""

from __future__ import annotations

import json

import pytest

from layerserve.common.v1 import common_pb2
from services.common.errors import InvalidArgument
from services.common.sampling import SamplingOptions, StructuredOutput
from services.common.sampling_proto import sampling_to_proto
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.structured_check import check_request_structured, structured_of


@pytest.fixture(scope="module")
def model():
    return load_tokenizer()


def test_reads_the_constraint_from_sampling_params():
    structured = StructuredOutput("regex", "[ab]+")
    assert structured_of(sampling_to_proto(SamplingOptions(structured=structured))) == structured
    assert structured_of(common_pb2.SamplingParams()) is None


def test_a_good_schema_passes(model):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    check_request_structured(model, StructuredOutput("json_schema", json.dumps(schema)))


@pytest.mark.parametrize(
    ("structured", "param"),
    [
        (StructuredOutput("json_schema", '{"type": "nonsense"}'), "response_format"),
        (StructuredOutput("regex", "(("), "guided_regex"),
        (StructuredOutput("grammar", "start: missing_rule"), "guided_grammar"),
    ],
)
def test_a_bad_constraint_names_its_field(model, structured, param):
    with pytest.raises(InvalidArgument) as caught:
        check_request_structured(model, structured)
    assert caught.value.param == param


def test_a_grammar_that_would_crash_llguidance_is_refused(model):
    """Checked in a grammar process, after the limits: the tokenizer serves on."""
    from tests.unit.common.test_grammar_limits import defs_chain

    with pytest.raises(InvalidArgument, match="LAYERSERVE_GRAMMAR_MAX_DEPTH") as caught:
        check_request_structured(model, StructuredOutput("json_schema", defs_chain(1000)))
    assert caught.value.param == "response_format"


async def test_the_server_awaits_the_check_off_its_tokenize_threads(model):
    from services.tokenizer.structured_check import check_structured_async

    await check_structured_async(model, StructuredOutput("regex", "[ab]+"))
    with pytest.raises(InvalidArgument) as caught:
        await check_structured_async(model, StructuredOutput("regex", "(("))
    assert caught.value.param == "guided_regex"
