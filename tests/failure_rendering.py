"""A pytest plugin (tests/conftest.py loads it): failures render with the garbage collector paused.

On CPython 3.11 the ast module keeps one recursion counter per interpreter. When a collection
in the middle of pytest's `ast.parse` of a failure's source runs a finalizer that parses source
itself (an asyncio task left pending by the failed test logs "exception was never retrieved",
and 3.11's traceback module parses source lines for its carets), the inner parse resets that
counter and the outer one ends in "SystemError: AST constructor recursion depth mismatch":
pytest's INTERNALERROR and no summary. Paused, the finalizers run at the next collection,
outside any parse. tests/unit/test_failure_rendering.py shows both sides.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
