"""What a client's grammar may be before the grammar engine (llguidance) sees it: its size,
its nesting (JSON schemas followed through `$ref`), its rule and value counts, and its counted
repetitions. Each refusal is InvalidArgument naming the client's field and the limit's setting.

Why: llguidance guards some shapes (plain JSON nesting, Lark parentheses) but not others: a
chain of `$defs` or of Lark rules a few thousand deep overflows its stack (SIGSEGV), a huge
enum or grammar takes seconds to compile, and `(a{1000}){1000}` takes seconds per token mask.
These checks are plain Python, linear in the text and without recursion; the compile after
them runs in a child process with a time budget (grammar_pool.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NoReturn

from services.common.errors import InvalidArgument
from services.common.sampling import StructuredOutput
from services.common.schema_graph import schema_shape
from services.common.settings import PREFIX, check_settings, positive, read_settings, setting

_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LARK_COUNT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
# A rule's head: `name:` (Lark), `name ::=` (GBNF), `?name:` / `!name:`, `NAME.2:`.
_RULE_HEAD = re.compile(r"^\s*[?!]?[A-Za-z_][\w.-]*(?:\.\d+)?\s*(?::|::=)", re.MULTILINE)
# Lark's embedded sub-grammars: %json {...} holds a JSON schema.
_EMBEDDED_JSON = re.compile(r"%json\s*")


@dataclass(frozen=True, slots=True)
class GrammarSettings:
    """Limits on a client's grammar and how its compile runs; env only (every service that
    compiles reads the same variables)."""

    max_bytes: int = setting(
        env="GRAMMAR_MAX_BYTES",
        default=128 * 1024,
        check=positive,
        help="bytes of one grammar, schema or regex (choices: all of them)",
    )
    max_depth: int = setting(
        env="GRAMMAR_MAX_DEPTH",
        default=64,
        check=positive,
        help="objects and arrays a JSON schema nests, following $ref",
    )
    max_rules: int = setting(
        env="GRAMMAR_MAX_RULES",
        default=2000,
        check=positive,
        help="subschemas of a JSON schema; rules of a Lark or GBNF grammar",
    )
    max_values: int = setting(
        env="GRAMMAR_MAX_VALUES",
        default=1000,
        check=positive,
        help="enum and const values of a JSON schema; choices of guided_choice",
    )
    max_repeat: int = setting(
        env="GRAMMAR_MAX_REPEAT",
        default=10000,
        check=positive,
        help="a counted repetition ({n,m}, x ~ n) in a regex, grammar or pattern, nested ones "
        "multiplied",
    )
    timeout_s: float = setting(
        env="GRAMMAR_TIMEOUT_S",
        default=5.0,
        check=positive,
        help="seconds one compile may take in the grammar process before it is killed",
    )
    processes: int = setting(
        env="GRAMMAR_PROCESSES",
        default=2,
        check=positive,
        help="grammar processes per service (each checks one grammar at a time)",
    )

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_env(cls) -> GrammarSettings:
        """Raises SettingError naming the variable."""
        return cls(**read_settings(cls, [], prog="grammar settings"))


def check_grammar_limits(structured: StructuredOutput, limits: GrammarSettings, param: str) -> None:
    """Raises InvalidArgument naming `param` and the limit when the constraint is over one."""
    kind, value = structured.kind, structured.value
    if kind == "choice":
        _check_choices(value, limits, param)
        return
    if kind == "json_object":
        return
    assert isinstance(value, str)
    _check_size(len(value.encode("utf-8", "surrogatepass")), limits, param)
    if kind == "json_schema":
        check_schema_limits(value, limits, param)
    elif kind == "regex":
        _check_repeat(regex_repeat(value), limits, param)
    else:
        _check_grammar(value, limits, param)


def check_schema_limits(text: str, limits: GrammarSettings, param: str) -> None:
    try:
        document = json.loads(text)
    except RecursionError:
        _refuse(param, "nests deeper", limits.max_depth, "GRAMMAR_MAX_DEPTH")
    except ValueError:
        return  # not JSON: the compile says so
    shape = schema_shape(document)
    if shape.depth > limits.max_depth:
        _refuse(
            param,
            f"nests {shape.depth} deep (following $ref), over",
            limits.max_depth,
            "GRAMMAR_MAX_DEPTH",
        )
    if shape.schemas > limits.max_rules:
        _refuse(
            param, f"has {shape.schemas} subschemas, over", limits.max_rules, "GRAMMAR_MAX_RULES"
        )
    if shape.values > limits.max_values:
        _refuse(
            param,
            f"has {shape.values} enum and const values, over",
            limits.max_values,
            "GRAMMAR_MAX_VALUES",
        )
    for pattern in shape.patterns:
        _check_repeat(regex_repeat(pattern), limits, param)


def regex_repeat(text: str, quotes: bool = False) -> int:
    """The largest product of nested counted repetitions in a regex (`(a{10}){20}`: 200), or
    in a Lark/GBNF grammar with quotes=True ("..." literals are atoms; `x ~ n` counts too)."""
    frames = [[1, 1]]  # per open group: [largest product inside, product of the last atom]
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        count, width = _count_at(text, i, quotes)
        if count is not None:
            frames[-1][1] *= max(count, 1)
            frames[-1][0] = max(frames[-1][0], frames[-1][1])
            i += width
            continue
        if c == "(":
            frames.append([1, 1])
        elif c == ")" and len(frames) > 1:
            inner = frames.pop()[0]
            frames[-1][1] = inner
            frames[-1][0] = max(frames[-1][0], inner)
        else:
            frames[-1][1] = 1
            i = _atom_end(text, i, quotes) - 1
        i += 1
    return max(frame[0] for frame in frames)


def _count_at(text: str, i: int, quotes: bool) -> tuple[int | None, int]:
    match = _COUNT.match(text, i) if text[i] == "{" else None
    if match is None and quotes and text[i] == "~":
        match = _LARK_COUNT.match(text, i)
    if match is None:
        return None, 0
    low, high = match.group(1), match.group(2)
    return (int(high) if high else int(low) + 1 if high == "" else int(low)), match.end() - i


def _atom_end(text: str, i: int, quotes: bool) -> int:
    """Where the atom at i ends: an escape, a character class, or with quotes a "literal"."""
    c = text[i]
    if c == "\\":
        return i + 2
    if c == "[" or (quotes and c == '"'):
        close = "]" if c == "[" else '"'
        j = i + 1
        while j < len(text) and text[j] != close:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i + 1


def _check_grammar(text: str, limits: GrammarSettings, param: str) -> None:
    rules = len(_RULE_HEAD.findall(text))
    if rules > limits.max_rules:
        _refuse(param, f"has {rules} rules, over", limits.max_rules, "GRAMMAR_MAX_RULES")
    _check_repeat(regex_repeat(text, quotes=True), limits, param)
    decoder = json.JSONDecoder()
    for match in _EMBEDDED_JSON.finditer(text):
        try:
            _, end = decoder.raw_decode(text, match.end())
        except RecursionError:
            _refuse(param, "nests deeper", limits.max_depth, "GRAMMAR_MAX_DEPTH")
        except ValueError:
            continue
        check_schema_limits(text[match.end() : end], limits, param)


def _check_choices(value: object, limits: GrammarSettings, param: str) -> None:
    choices = value if isinstance(value, tuple) else ()
    if len(choices) > limits.max_values:
        _refuse(param, f"has {len(choices)} choices, over", limits.max_values, "GRAMMAR_MAX_VALUES")
    _check_size(sum(len(c.encode("utf-8", "surrogatepass")) for c in choices), limits, param)


def _check_size(size: int, limits: GrammarSettings, param: str) -> None:
    if size > limits.max_bytes:
        _refuse(param, f"is {size} bytes, over", limits.max_bytes, "GRAMMAR_MAX_BYTES")


def _check_repeat(repeat: int, limits: GrammarSettings, param: str) -> None:
    if repeat > limits.max_repeat:
        _refuse(
            param,
            f"repeats {repeat} times (nested counts multiplied), over",
            limits.max_repeat,
            "GRAMMAR_MAX_REPEAT",
        )


def _refuse(param: str, what: str, limit: int, variable: str) -> NoReturn:
    raise InvalidArgument(
        f"{param} {what} this server's limit of {limit} ({PREFIX}{variable})", param=param
    )
