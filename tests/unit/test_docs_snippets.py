"""The architecture pages say only what the code does: every code snippet in them is taken from
a file and still stands there, and every file or module they (and the README and the other
pages under docs/) name exists.

A ```python block on a checked page opens with `# from <path>` and its other lines must stand in
that file in the same order, each run between `...` lines as consecutive lines (indentation,
blank lines and trailing spaces aside). A page may hold no other python block. The snippet in
services/scheduler/engine.py's docstring is held to the code of the same file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The pages a newcomer reads to find their way around (the others record measurements).
CHECKED_PAGES = [
    "docs/architecture.md",
    "docs/gateway.md",
    "docs/tokenizer.md",
    "docs/scheduler.md",
    "docs/worker.md",
    "docs/operations.md",
]
# Pages whose prose names files (fenced blocks aside: shell lines name cluster objects too).
PAGES_NAMING_FILES = [
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
]

FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
ANY_FENCE = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
SOURCE_MARK = re.compile(r"#\s*from\s+(\S+)")
# A path from the repository root (services/scheduler/engine.py, protos/, configs/x.toml).
ROOTED_PATH = re.compile(
    r"(?<![\w./-])((?:services|tests|protos|docs|configs|deploy|benchmarks|scripts)"
    r"(?:/[\w.-]+)*/?)"
)
DOTTED_MODULE = re.compile(r"(?<![\w./])(services(?:\.\w+)+)")
# A file named by its name alone (router.py) or from its service's folder (engine/plan.py).
SHORT_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[a-z_]\w*\.py)\b")
SEARCHED_FOR_SHORT_PATHS = ("services", "tests", "benchmarks", "scripts")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def snippet_drift(snippet: str, source: str) -> str | None:
    """None when the snippet's lines stand in source (each run between `...` lines
    consecutively, the runs in order); else the first line that does not."""
    have = _lines(source)
    start = 0
    runs: list[list[str]] = [[]]
    for line in _lines(snippet):
        if line == "...":
            runs.append([])
        else:
            runs[-1].append(line)
    for run in (r for r in runs if r):
        found = next(
            (i for i in range(start, len(have) - len(run) + 1) if have[i : i + len(run)] == run),
            None,
        )
        if found is None:
            return _first_missing(run, have[start:])
        start = found + len(run)
    return None


def _first_missing(run: list[str], have: list[str]) -> str:
    """The line where the run stops matching at its best place in have."""
    best = 0
    for i in range(len(have)):
        n = 0
        while n < len(run) and i + n < len(have) and have[i + n] == run[n]:
            n += 1
        best = max(best, n)
    return run[min(best, len(run) - 1)]


def page_snippets(page: str) -> list[tuple[str | None, str]]:
    """Each python block of a page: the file it names (None: no `# from` line) and its body."""
    blocks = []
    for match in FENCE.finditer((ROOT / page).read_text()):
        first, _, body = match.group(1).partition("\n")
        mark = SOURCE_MARK.fullmatch(first.strip())
        blocks.append((mark.group(1) if mark else None, body if mark else match.group(1)))
    return blocks


def missing_references(text: str) -> list[str]:
    """The files, folders and modules the text names that do not exist."""
    missing = []
    for path in ROOTED_PATH.findall(text):
        path = path.rstrip(".")
        if "<" not in path and not (ROOT / path).exists():
            missing.append(path)
    for module in DOTTED_MODULE.findall(text):
        base = ROOT / module.replace(".", "/")
        if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
            missing.append(module)
    files = _python_files()
    for path in SHORT_PATH.findall(text):
        if not ROOTED_PATH.fullmatch(path) and not any(f.endswith("/" + path) for f in files):
            missing.append(path)
    return missing


def _python_files() -> list[str]:
    return [
        p.relative_to(ROOT).as_posix()
        for folder in SEARCHED_FOR_SHORT_PATHS
        for p in (ROOT / folder).rglob("*.py")
    ]


def _engine_docstring_and_code() -> tuple[str, str]:
    text = (ROOT / "services/scheduler/engine.py").read_text()
    docstring = ast.get_docstring(ast.parse(text)) or ""
    code = text.split('"""', 2)[2]  # the file after its module docstring
    return docstring, code


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_python_block_is_taken_from_a_file_and_still_stands_there(page: str) -> None:
    for source, body in page_snippets(page):
        assert source is not None, f"{page}: a python block without `# from <path>`:\n{body}"
        path = ROOT / source
        assert path.is_file(), f"{page}: snippet from {source}, which does not exist"
        drift = snippet_drift(body, path.read_text())
        assert drift is None, f"{page}: snippet from {source} no longer matches at: {drift}"


@pytest.mark.parametrize("page", PAGES_NAMING_FILES)
def test_every_path_and_module_a_page_names_exists(page: str) -> None:
    prose = ANY_FENCE.sub("", (ROOT / page).read_text())
    assert missing_references(prose) == []


def test_the_architecture_page_shows_the_engine_loop() -> None:
    assert "services/scheduler/engine.py" in [s for s, _ in page_snippets("docs/architecture.md")]


def test_engine_docstring_loop_is_the_code() -> None:
    docstring, code = _engine_docstring_and_code()
    loop = [line for line in docstring.splitlines() if line.startswith("    ")]
    assert loop, "engine.py's docstring shows no loop"
    assert snippet_drift("\n".join(loop), code) is None


def test_a_planted_drift_is_caught() -> None:
    """The checks can fail: the architecture page's loop with one line changed, a run out of
    order, a page naming a file that is gone."""
    (_, body), *_ = [b for b in page_snippets("docs/architecture.md") if b[0]]
    _, source = _engine_docstring_and_code()  # the docstring repeats the loop
    assert snippet_drift(body, source) is None
    lines = body.splitlines()
    changed = [line.replace("return True", "return False") for line in lines]
    assert snippet_drift("\n".join(changed), source) is not None
    reordered = "\n".join([*lines[-2:], "...", *lines[:-2]])
    assert snippet_drift(reordered, source) is not None
    gone = (
        "see services/scheduler/update_loop.py, services.worker.circle, planner.py and "
        "model/attention.py (engine/plan.py, services.worker.layers and router.py exist)"
    )
    assert missing_references(gone) == [
        "services/scheduler/update_loop.py",
        "services.worker.circle",
        "planner.py",
        "model/attention.py",
    ]
