"""A grammar that crashes llguidance or runs away costs its request, never the service: the
check runs in a grammar process, which is replaced when it dies or runs past the budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.common.errors import InvalidArgument
from services.common.grammar_limits import GrammarSettings
from services.common.grammar_pool import GrammarPool
from services.common.sampling import StructuredOutput
from tests.unit.common.test_grammar_limits import defs_chain

CRASHER = StructuredOutput("json_schema", defs_chain(3000))
GOOD = StructuredOutput("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}')
# Limits lifted, so that the engine itself meets the crasher (the limits catch it otherwise).
UNLIMITED = GrammarSettings(max_bytes=10**9, max_depth=10**9, max_rules=10**9, processes=1)


@pytest.fixture
def pool():
    pool = GrammarPool(UNLIMITED)
    yield pool
    pool.close()


def test_the_crasher_kills_a_process_that_compiles_it_in_place() -> None:
    """Why the pool exists: in the service's own process this grammar is a SIGSEGV."""
    code = (
        "import sys; from services.common.structured_output import check_structured;"
        "from services.common.sampling import StructuredOutput;"
        "check_structured(StructuredOutput('json_schema', sys.stdin.read()), None, 'x')"
    )
    run = subprocess.run([sys.executable, "-c", code], input=CRASHER.value, text=True,
                         capture_output=True, timeout=120)  # fmt: skip
    assert run.returncode < 0  # killed by a signal (SIGSEGV), no Python error


def test_a_crash_costs_only_its_request(pool: GrammarPool) -> None:
    with pytest.raises(InvalidArgument) as caught:
        pool.check(CRASHER, "response_format")
    assert caught.value.param == "response_format"
    assert "the grammar engine failed on this grammar" in caught.value.message
    assert pool.restarts == 1
    pool.check(GOOD, "response_format")  # a fresh process serves the next one
    with pytest.raises(InvalidArgument, match="does not compile"):
        pool.check(StructuredOutput("json_schema", '{"type":"nonsense"}'), "guided_json")


def test_a_compile_past_the_budget_is_killed() -> None:
    slow = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
    settings = GrammarSettings(max_rules=10**6, max_bytes=10**9, timeout_s=0.05, processes=1)
    pool = GrammarPool(settings)
    try:
        pool.check(GOOD, "x")  # started and warm: the budget is the compile's alone
        with pytest.raises(InvalidArgument, match=r"took over 0.05s.*GRAMMAR_TIMEOUT_S"):
            pool.check(StructuredOutput("json_schema", json.dumps(slow)), "guided_json")
        pool.check(GOOD, "y")
    finally:
        pool.close()


def test_limits_are_checked_before_the_engine(pool: GrammarPool) -> None:
    limited = GrammarPool(GrammarSettings(processes=1))
    try:
        with pytest.raises(InvalidArgument, match="GRAMMAR_MAX_BYTES"):
            limited.check(CRASHER, "tools[0].function.parameters")
        assert limited.restarts == 0
    finally:
        limited.close()
