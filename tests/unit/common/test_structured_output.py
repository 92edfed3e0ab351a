"""The structured-output contract: StructuredOutput on the wire (SamplingParams.structured),
its shape checks, and check_structured refusing grammars that do not compile."""

from __future__ import annotations

import json

import pytest

from layerserve.common.v1 import common_pb2
from services.common.errors import InvalidArgument
from services.common.sampling import SamplingOptions, StructuredOutput
from services.common.sampling_proto import sampling_from_proto, sampling_to_proto
from services.common.structured_output import check_structured, grammar_tokenizer

GOOD = [
    StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {}})),
    StructuredOutput("json_object"),
    StructuredOutput("regex", r"\d{3}-[a-z]+"),
    StructuredOutput("choice", ("yes", "no", 'say "hi"')),
    StructuredOutput("grammar", 'start: "a" B\nB: /[0-9]+/'),  # Lark
    StructuredOutput("grammar", 'root ::= "yes" | "no"'),  # GBNF
]


@pytest.fixture(scope="module")
def llg_tokenizer():
    from services.tokenizer.loader import load_tokenizer

    model = load_tokenizer()
    return grammar_tokenizer(model.tokenizer.to_str(), [model.eos_token_id], model.vocab_size)


@pytest.mark.parametrize("structured", GOOD, ids=lambda s: s.kind)
def test_round_trips_through_sampling_params(structured):
    options = SamplingOptions(temperature=0.5, structured=structured)
    wire = common_pb2.SamplingParams.FromString(sampling_to_proto(options).SerializeToString())
    assert sampling_from_proto(wire) == options
    assert hash(sampling_from_proto(wire).structured) == hash(structured)


def test_unset_means_unconstrained():
    assert sampling_from_proto(common_pb2.SamplingParams()).structured is None
    assert not sampling_to_proto(SamplingOptions()).HasField("structured")
    msg = common_pb2.SamplingParams(structured=common_pb2.StructuredOutput(json_object=False))
    assert sampling_from_proto(msg).structured is None


@pytest.mark.parametrize(
    "structured",
    [
        StructuredOutput("xml", "<a/>"),  # type: ignore[arg-type]
        StructuredOutput("choice", ()),
        StructuredOutput("choice", "yes"),
        StructuredOutput("regex", ""),
        StructuredOutput("json_schema", ""),
        StructuredOutput("json_object", "{}"),
    ],
)
def test_a_malformed_shape_is_invalid(structured):
    with pytest.raises(InvalidArgument):
        SamplingOptions(structured=structured).validate()


@pytest.mark.parametrize("structured", GOOD, ids=lambda s: s.kind)
@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_good_constraints_pass(structured, with_tokenizer, llg_tokenizer):
    check_structured(structured, llg_tokenizer if with_tokenizer else None, "response_format")
    check_structured(None, llg_tokenizer, "response_format")  # unconstrained: nothing to check


@pytest.mark.parametrize(
    ("structured", "says"),
    [
        (StructuredOutput("json_schema", "{not json"), "response_format"),
        (StructuredOutput("json_schema", '{"type": "nonsense"}'), "nonsense"),
        (StructuredOutput("json_schema", '{"type": "string", "format": "ipv9"}'), "ipv9"),
        (StructuredOutput("regex", "a(b"), "unclosed group"),
        (StructuredOutput("grammar", "start: foo"), "foo"),
        (StructuredOutput("choice", ()), "non-empty"),
    ],
)
def test_a_constraint_that_does_not_compile_is_invalid_argument(structured, says, llg_tokenizer):
    with pytest.raises(InvalidArgument) as caught:
        check_structured(structured, llg_tokenizer, "response_format")
    assert caught.value.param == "response_format"
    assert caught.value.message.startswith("response_format: ")
    assert says in caught.value.message
    assert "<grammar>" not in caught.value.message  # the client's own grammar is not echoed
