"""A client's grammar is measured before llguidance sees it: shapes that crash the engine
(a $defs or rule chain a few thousand deep), compile for seconds (huge enums, grammars) or
make every token mask slow ((a{1000}){1000}) are a 400 naming the field and the limit."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument
from services.common.grammar_limits import GrammarSettings, check_grammar_limits, regex_repeat
from services.common.sampling import StructuredOutput

LIMITS = GrammarSettings()
PARAM = "response_format.json_schema.schema"


def defs_chain(n: int) -> str:
    """A schema whose $defs refer to each other n deep: SIGSEGV in llguidance at ~1000."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(n)}  # fmt: skip
    defs[f"d{n}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


def lark_chain(n: int) -> str:
    rules = "\n".join(f"r{i}: r{i + 1}" for i in range(n))
    return f'start: r0\n{rules}\nr{n}: "x"'


def refused(kind: str, value, limits: GrammarSettings = LIMITS) -> str:
    with pytest.raises(InvalidArgument) as caught:
        check_grammar_limits(StructuredOutput(kind, value), limits, PARAM)
    assert caught.value.param == PARAM
    return caught.value.message


def test_a_defs_chain_is_refused_by_its_depth_through_refs() -> None:
    message = refused("json_schema", defs_chain(1000))
    assert message.startswith(PARAM) and "LAYERSERVE_GRAMMAR_MAX_DEPTH" in message
    assert "limit of 64" in message


def test_plain_nesting_and_refs_through_other_keywords_count() -> None:
    nested = '{"type":"array","items":' * 70 + '{"type":"string"}' + "}" * 70
    assert "GRAMMAR_MAX_DEPTH" in refused("json_schema", nested)
    by_anchor = {"$defs": {f"d{i}": {"$anchor": f"a{i}", "anyOf": [{"$ref": f"#a{i + 1}"}]}
                           for i in range(100)}, "$ref": "#a0"}  # fmt: skip
    assert "GRAMMAR_MAX_DEPTH" in refused("json_schema", json.dumps(by_anchor))


def test_recursive_schemas_long_strings_and_ordinary_ones_pass() -> None:
    tree = {
        "$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    long_text = {"type": "string", "maxLength": 100_000}  # cheap for llguidance: allowed
    for schema in (tree, long_text, {"type": "object", "properties": {"a": {"type": "integer"}}}):
        check_grammar_limits(StructuredOutput("json_schema", json.dumps(schema)), LIMITS, PARAM)
    check_grammar_limits(StructuredOutput("json_schema", defs_chain(10)), LIMITS, PARAM)


def test_counts_sizes_and_repetitions() -> None:
    enum = json.dumps({"enum": [f"v{i}" for i in range(1001)]})
    assert "1001 enum and const values" in refused("json_schema", enum)
    assert "GRAMMAR_MAX_RULES" in refused("grammar", lark_chain(3000))
    assert "GRAMMAR_MAX_REPEAT" in refused("regex", "(a{1000}){1000}")
    assert "GRAMMAR_MAX_REPEAT" in refused("regex", "a{1000}{1000}")
    assert "GRAMMAR_MAX_REPEAT" in refused("grammar", 'start: ("ab"{1000}){1000}')
    pattern = json.dumps({"type": "string", "pattern": "(x{200}){200}"})
    assert "GRAMMAR_MAX_REPEAT" in refused("json_schema", pattern)
    assert "GRAMMAR_MAX_BYTES" in refused("regex", "a" * 200_000)
    assert "GRAMMAR_MAX_VALUES" in refused("choice", tuple(f"c{i}" for i in range(1001)))
    embedded = "start: %json " + defs_chain(200)
    assert "GRAMMAR_MAX_DEPTH" in refused("grammar", embedded)


def test_repetition_product_follows_nesting_not_sequence() -> None:
    assert regex_repeat("a{100}b{100}") == 100
    assert regex_repeat("(a{10}|b){20}") == 200
    assert regex_repeat(r"\{1000\}[{]x") == 1
    assert regex_repeat('"{1000}" x{3}', quotes=True) == 3


def test_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_GRAMMAR_MAX_DEPTH", "5000")
    monkeypatch.setenv("LAYERSERVE_GRAMMAR_MAX_BYTES", "1000000")
    monkeypatch.setenv("LAYERSERVE_GRAMMAR_MAX_RULES", "5000")
    settings = GrammarSettings.from_env()
    check_grammar_limits(StructuredOutput("json_schema", defs_chain(1000)), settings, PARAM)
    monkeypatch.setenv("LAYERSERVE_GRAMMAR_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="LAYERSERVE_GRAMMAR_TIMEOUT_S must be a number"):
        GrammarSettings.from_env()
