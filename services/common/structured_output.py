"""Structured outputs as llguidance grammars: the one translation from a StructuredOutput to
grammar text (the tokenizer checks it, the worker compiles it), and the check that turns a
grammar that does not compile into InvalidArgument before anything is scheduled.

llguidance (https://github.com/guidance-ai/llguidance) was chosen over xgrammar by measuring
(benchmarks/grammar_engines.py): compile p50/p99 0.47/0.96 ms against 3.95/11.0 ms, and
comparable batch-64 mask times."""

from __future__ import annotations

import json
from collections.abc import Sequence

import llguidance
from llguidance import LLMatcher, LLTokenizer

from services.common.errors import InvalidArgument
from services.common.sampling import StructuredOutput

# Compact JSON: with flexible whitespace a small model can spend its whole budget on
# newlines between two keys; the value is the same JSON either way.
JSON_OPTIONS: dict = {"whitespace_flexible": False}
# llguidance error messages quote the grammar with a caret; the first lines say enough.
MAX_ERROR_CHARS = 400


def grammar_text(structured: StructuredOutput) -> str:
    """The llguidance grammar (its JSON form) for a constraint. Raises ValueError when the
    text cannot even be read (a schema that is not JSON, GBNF that does not convert); other
    mistakes surface when the grammar is compiled (check_structured, LLMatcher)."""
    kind, value = structured.kind, structured.value
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "choice":
        assert isinstance(value, tuple)
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(v) for v in value))
    assert isinstance(value, str)
    if kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(value, defaults=JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    return llguidance.grammar_from("grammar", value)  # Lark, or GBNF converted to Lark


def grammar_tokenizer(
    tokenizer_json: str, eos_token_ids: Sequence[int], vocab_size: int | None = None
) -> LLTokenizer:
    """The vocabulary llguidance masks over, from a `tokenizers.Tokenizer`'s JSON
    (`Tokenizer.to_str()`). A stopped grammar allows only eos_token_ids. Takes ~0.4 s for a
    49k vocabulary: build it once per model."""
    return LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))


def check_structured(
    structured: StructuredOutput | None, tokenizer: LLTokenizer | None, param: str
) -> None:
    """Raises InvalidArgument naming `param` (the client's field, e.g. "response_format") when
    the constraint is malformed or its grammar does not compile for this tokenizer (None:
    checked without one, which misses only references to special tokens). ~1 ms for a
    typical schema: call it off the event loop."""
    if structured is None:
        return
    try:
        structured.validate()
        grammar = grammar_text(structured)
    except InvalidArgument as err:
        raise InvalidArgument(f"{param}: {err.message}", param=param) from None
    except ValueError as err:
        raise InvalidArgument(f"{param}: {short_error(str(err))}", param=param) from None
    error = LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        what = structured.kind.replace("_", " ")
        raise InvalidArgument(
            f"{param}: the {what} does not compile: {short_error(error)}", param=param
        )


def short_error(message: str) -> str:
    """An llguidance error without the grammar it quotes (the client sent it)."""
    message = message.split("\n<grammar>", 1)[0]
    message = message.strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
