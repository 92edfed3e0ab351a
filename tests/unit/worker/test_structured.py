"""Constrained decoding on the worker: StructuredDecoder's masks through the Sampler with the
real SmolLM2 vocabulary and random logits (every output must parse and validate, whatever
the logits), then the ModelRunner with the real model (mixed batches, resumed sequences,
failures that stay with their request)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.errors import Internal, InvalidArgument
from services.common.sampling import SamplingOptions, StructuredOutput
from services.common.structured_output import grammar_tokenizer
from services.worker.engine.sampler import Sampler
from services.worker.engine.structured import StructuredDecoder, unpack_bitmask
from tests.unit.worker.plan_driver import Driver

VOCAB = 49152
EOS = 2  # <|im_end|>, SmolLM2's EOS

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,  # else a key of any length may follow
    },
    {
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["unit", "days"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "required": ["point"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def decoder(tokenizer) -> StructuredDecoder:
    text = tokenizer.to_str()
    return StructuredDecoder(lambda: grammar_tokenizer(text, [EOS], VOCAB), VOCAB)


def _generate(
    decoder: StructuredDecoder,
    constraints: list[StructuredOutput | None],
    options: list[SamplingOptions],
    *,
    seed: int,
    max_tokens: int = 120,
    prefix: str = "r",
) -> list[list[int]]:
    """Random logits [N, V] each step, masked and sampled; each row's tokens up to EOS."""
    ids = [f"{prefix}{i}" for i in range(len(constraints))]
    for rid, structured in zip(ids, constraints, strict=True):
        decoder.add(rid, structured, [])
    outputs: list[list[int]] = [[] for _ in ids]
    done = [False] * len(ids)
    gen = torch.Generator().manual_seed(seed)
    sampler = Sampler()
    for _ in range(max_tokens):
        logits = torch.randn(len(ids), VOCAB, generator=gen) * 4
        masks = decoder.masks(ids, torch.device("cpu"))
        out = sampler.sample(
            logits, options, [[1]] * len(ids), outputs, allowed=masks.allowed if masks else None
        )
        assert decoder.advance(masks, out.token_ids) == {}
        for i, token in enumerate(out.token_ids):
            if not done[i]:
                outputs[i].append(token)
                done[i] = token == EOS
        if all(done[i] for i, c in enumerate(constraints) if c is not None):
            break
    decoder.drop(ids)
    return outputs


def _text(tokenizer, tokens: list[int]) -> str:
    assert tokens and tokens[-1] == EOS, "the constrained row did not finish"
    return tokenizer.decode(tokens[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_parse_and_validate(decoder, tokenizer, temperature):
    constraints = [StructuredOutput("json_schema", json.dumps(s)) for s in SCHEMAS]
    options = [SamplingOptions(temperature=temperature, seed=i) for i in range(len(SCHEMAS))]
    outputs = _generate(decoder, constraints, options, seed=1)
    for schema, tokens in zip(SCHEMAS, outputs, strict=True):
        jsonschema.validate(json.loads(_text(tokenizer, tokens)), schema)


def test_regex_choice_and_grammar(decoder, tokenizer):
    constraints = [
        StructuredOutput("regex", r"[a-c]{3}-\d{2}"),
        StructuredOutput("choice", ("yes", "no", "maybe not")),
        StructuredOutput("grammar", 'root ::= "A" [0-9] [0-9]?'),  # GBNF
        StructuredOutput("grammar", 'start: "B" NUM\nNUM: /[0-9]{2}/'),  # Lark
    ]
    options = [SamplingOptions(temperature=1.0, top_p=0.9, seed=i) for i in range(4)]
    code, choice, gbnf, lark = (
        _text(tokenizer, t) for t in _generate(decoder, constraints, options, seed=2)
    )
    assert len(code) == 6 and set(code[:3]) <= set("abc") and code[3] == "-"
    assert choice in ("yes", "no", "maybe not")
    assert gbnf[0] == "A" and gbnf[1:].isdigit() and len(gbnf) in (2, 3)
    assert lark[0] == "B" and lark[1:].isdigit() and len(lark) == 3


def test_json_object_starts_an_object_and_ends_with_it(decoder, tokenizer):
    # Random logits never close an unbounded object: check its first mask and a replay.
    decoder.add("start", StructuredOutput("json_object"), [])
    done = tokenizer.encode('{"a":[1,{"b":null}]}', add_special_tokens=False).ids
    decoder.add("done", StructuredOutput("json_object"), done)
    masks = decoder.masks(["start", "done"], torch.device("cpu"))
    assert masks is not None and not masks.errors
    first = masks.allowed[0].nonzero().flatten().tolist()
    assert first and all(tokenizer.decode([t]).lstrip().startswith("{") for t in first)
    assert masks.allowed[1].nonzero().flatten().tolist() == [EOS]  # complete: only EOS
    decoder.drop(["start", "done"])


def test_constrained_and_unconstrained_rows_share_a_batch(decoder, tokenizer):
    constraints = [None, StructuredOutput("choice", ("alpha", "beta")), None]
    options = [SamplingOptions(temperature=1.0, seed=i) for i in range(3)]
    free_a, constrained, free_b = _generate(decoder, constraints, options, seed=3, max_tokens=12)
    assert _text(tokenizer, constrained) in ("alpha", "beta")
    # The free rows drew from the whole vocabulary, one token a step, never forced to stop.
    for free in (free_a, free_b):
        assert len(free) == len(constrained) and EOS not in free
        assert not tokenizer.decode(free).startswith(("alpha", "beta"))


def test_each_choice_of_n_has_its_own_matcher(decoder, tokenizer):
    structured = StructuredOutput("json_schema", json.dumps(SCHEMAS[0]))
    options = [SamplingOptions(temperature=1.0, seed=i) for i in range(4)]
    outputs = _generate(decoder, [structured] * 4, options, seed=4)
    texts = [_text(tokenizer, t) for t in outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS[0])
    assert len(set(texts)) > 1  # different seeds, independent matchers


def test_a_resumed_sequence_replays_its_tokens_and_continues_validly(decoder, tokenizer):
    structured = StructuredOutput("json_schema", json.dumps(SCHEMAS[1]))
    prefix = tokenizer.encode('{"unit":"fahrenheit","days":[true,', add_special_tokens=False).ids
    decoder.add("resumed", structured, prefix)
    gen = torch.Generator().manual_seed(5)
    tokens = list(prefix)
    for _ in range(40):
        masks = decoder.masks(["resumed"], torch.device("cpu"))
        assert masks is not None
        logits = torch.randn(1, VOCAB, generator=gen).masked_fill(~masks.allowed, float("-inf"))
        token = int(logits.argmax())
        assert decoder.advance(masks, [token]) == {}
        tokens.append(token)
        if token == EOS:
            break
    decoder.drop(["resumed"])
    jsonschema.validate(json.loads(_text(tokenizer, tokens)), SCHEMAS[1])


def test_a_replay_the_grammar_rejects_fails_that_row_only(decoder, tokenizer):
    structured = StructuredOutput("choice", ("yes", "no"))
    decoder.add("bad", structured, tokenizer.encode("maybe", add_special_tokens=False).ids)
    decoder.add("good", structured, [])
    masks = decoder.masks(["bad", "good"], torch.device("cpu"))
    assert masks is not None and list(masks.errors) == [0]
    assert isinstance(masks.errors[0], Internal)
    assert bool(masks.allowed[0].all())  # a failed row is not masked (its token is discarded)
    decoder.drop(["bad", "good"])


def test_a_grammar_that_does_not_compile_fails_with_invalid_argument(decoder):
    decoder.add("broken", StructuredOutput("regex", "a(b"), [])
    masks = decoder.masks(["broken"], torch.device("cpu"))
    assert masks is not None and isinstance(masks.errors[0], InvalidArgument)
    assert "does not compile" in masks.errors[0].message
    assert decoder.advance(masks, [0]) == masks.errors  # reported, not raised
    decoder.drop(["broken"])


def test_the_same_constraint_compiles_once(decoder):
    structured = StructuredOutput("regex", r"x+y")
    assert decoder.cache.get(structured) is decoder.cache.get(structured)


def test_unpack_bitmask_matches_the_bit_layout():
    bitmask = torch.tensor([[1 - 2**31, 0, -1]], dtype=torch.int32)  # bits 0 and 31; none; all
    allowed = unpack_bitmask(bitmask, 70)
    assert allowed.nonzero()[:, 1].tolist() == [0, 31, *range(64, 70)]


# -- a property: random schemas, random logits, every output validates -------------------------

_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 1000),
    ),
    st.builds(
        lambda values: {"enum": values},
        st.lists(st.text("abcxyz", min_size=1, max_size=5), min_size=1, max_size=4, unique=True),
    ),
)


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
        required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }

    names = st.text("abcdefgh", min_size=1, max_size=6)
    return st.builds(build, st.dictionaries(names, children, min_size=1, max_size=4), st.data())


_schemas = st.recursive(
    _leaf,
    lambda children: st.one_of(
        _object(children),
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            children,
            st.integers(0, 3),
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas, seed=st.integers(0, 2**16), temperature=st.sampled_from([0.0, 1.0]))
def test_property_random_schemas_generate_valid_json(decoder, tokenizer, schema, seed, temperature):
    structured = StructuredOutput("json_schema", json.dumps(schema))
    options = [SamplingOptions(temperature=temperature, seed=seed)]
    (tokens,) = _generate(decoder, [structured], options, seed=seed, max_tokens=200, prefix="p")
    jsonschema.validate(json.loads(_text(tokenizer, tokens)), schema)


# -- through the ModelRunner with the real model ---------------------------------------------------

PERSON = SCHEMAS[0]


def _until_eos(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    end = next(i for i, t in enumerate(tokens) if t in eos)
    return [*tokens[:end], EOS]


def test_runner_constrains_one_row_of_a_mixed_batch(make_runner, tokenizer):
    runner = make_runner()
    driver = Driver(runner)
    prompt = tokenizer.encode("A person as JSON:").ids
    json_schema = StructuredOutput("json_schema", json.dumps(PERSON))
    driver.add("json", prompt, SamplingOptions(structured=json_schema))
    driver.add("free", prompt)
    driver.add("pick", prompt, SamplingOptions(structured=StructuredOutput("choice", ("x", "y"))))
    out = driver.run(max_new_tokens=20)
    eos = runner.eos_token_ids
    jsonschema.validate(json.loads(_text(tokenizer, _until_eos(out["json"], eos))), PERSON)
    assert tokenizer.decode(out["pick"][:1]) in ("x", "y") and out["pick"][1] in eos
    assert not set(out["free"][:4]) & set(eos)  # the free row was not forced to stop


def test_runner_resumes_a_preempted_constrained_sequence(make_runner, tokenizer):
    runner = make_runner()
    driver = Driver(runner)
    json_schema = StructuredOutput("json_schema", json.dumps(PERSON))
    prompt = tokenizer.encode("Name and age:").ids
    driver.add("json", prompt, SamplingOptions(structured=json_schema))
    while len(driver.seqs["json"].output) < 4:
        driver.step(max_new_tokens=20)
    driver.preempt("json")  # re-sent in full: prompt + 4 generated tokens
    out = driver.run(max_new_tokens=20)["json"]
    jsonschema.validate(json.loads(_text(tokenizer, _until_eos(out, runner.eos_token_ids))), PERSON)


def test_runner_reports_a_failing_constraint_without_raising(make_runner, tokenizer):
    runner = make_runner()
    driver = Driver(runner)
    prompt = tokenizer.encode("Hello").ids
    broken = StructuredOutput("grammar", "start: foo")
    driver.add("broken", prompt, SamplingOptions(structured=broken))
    driver.add("fine", prompt)
    plan = driver.plan(max_new_tokens=4)
    sampled = {s.request_id: s for s in runner.execute(plan)}
    assert isinstance(sampled["broken"].error, InvalidArgument)
    assert sampled["fine"].error is None


def test_a_grammar_that_would_crash_llguidance_fails_its_row_only(decoder):
    """A $defs chain 3,000 deep is a SIGSEGV in llguidance: refused by the grammar limits and
    the grammar process before the worker compiles it, and only its row fails."""
    from tests.unit.common.test_grammar_limits import defs_chain

    decoder.add("crasher", StructuredOutput("json_schema", defs_chain(3000)), [])
    decoder.add("good", StructuredOutput("regex", "[ab]+"), [])
    masks = decoder.masks(["crasher", "good"], torch.device("cpu"))
    assert masks is not None and list(masks.errors) == [0]
    assert isinstance(masks.errors[0], InvalidArgument)
    assert "LAYERSERVE_GRAMMAR_MAX_BYTES" in masks.errors[0].message
    decoder.drop(["crasher", "good"])
