"""A failing test whose failure is rendered while the garbage collector runs a parsing finalizer
still gets its summary (tests/failure_rendering.py), where plain pytest ends in INTERNALERROR."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Every allocation starts a collection, and every collection parses source: what a pending
# asyncio task's "exception was never retrieved" traceback does when it is collected.
PLANTED = """
import ast
import gc


def test_fails_while_the_collector_parses():
    gc.callbacks.append(lambda phase, info: phase == "start" and ast.parse("x = [1, 2]"))
    gc.set_threshold(1)
    assert 1 == 2
"""


def _run_planted(tmp_path: Path, conftest: str) -> str:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    (tmp_path / "conftest.py").write_text(conftest)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_planted.py"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the ast counter is per call from 3.12")
def test_plain_pytest_crashes_on_the_planted_failure(tmp_path: Path) -> None:
    output = _run_planted(tmp_path, "")
    assert "AST constructor recursion depth mismatch" in output
    assert "1 failed" not in output


def test_the_suite_renders_the_planted_failure(tmp_path: Path) -> None:
    output = _run_planted(tmp_path, 'pytest_plugins = ["tests.failure_rendering"]\n')
    assert "INTERNALERROR" not in output
    assert "assert 1 == 2" in output and "1 failed" in output
