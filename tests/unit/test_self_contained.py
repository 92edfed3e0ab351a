"""The repository stands alone: no tracked file refers to a path outside the checkout.

A user's clone has nothing beside it, so a test reading a folder beside the checkout or a path
built from a parent of the repository fails there (issue 15). Relative references are resolved
from the folder of the file that holds them (as kustomize, Python's `__file__` and Markdown
links do).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDORED = ("tests/data/",)  # third-party data, vendored as is
SELF = "tests/unit/test_self_contained.py"  # its planted references are test data

UP = "." + "./"
_RELATIVE = re.compile(r"(?<![\w.])((?:" + re.escape(UP) + r")+)([\w.-]*)")
_PARENTS = re.compile(r"__file__\)\.resolve\(\)\.parents\[(\d+)\]((?:\.parent)*)")
_PARENT_CHAIN = re.compile(r"__file__\)(?:\.resolve\(\))?((?:\.parent)+)")
_DOTDOT_ARGS = re.compile(r"""__file__\)?,((?:\s*["']\.\.["']\s*,?)+)""")
_NAMED = re.compile("|".join([r"\bshared/(?:openai-openapi|PERFORMANCE|STYLE|hooks)", "/work/"]))


def tracked_files(root: Path) -> list[str]:
    """Text files under version control (every file when root is not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return [n for n in names if not n.startswith(VENDORED) and ".git/" not in n and n != SELF]


def outside_references(root: Path, names: list[str]) -> list[str]:
    """'path:line: text' for each line that reaches outside root."""
    found = []
    for name in names:
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        depth = len(Path(name).parts) - 1  # folders between root and the file
        for number, line in enumerate(text.splitlines(), 1):
            if _reaches_out(line, depth):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def _reaches_out(line: str, depth: int) -> bool:
    if _NAMED.search(line):
        return True
    for ups, _ in _RELATIVE.findall(line):
        if len(ups) // len(UP) > depth:
            return True
    for index, parents in _PARENTS.findall(line):
        # parents[0] is the file's folder, parents[depth] the repository.
        if int(index) + parents.count(".parent") > depth:
            return True
    for chain in _PARENT_CHAIN.findall(line):
        if chain.count(".parent") - 1 > depth:
            return True
    return any(args.count("..") > depth for args in _DOTDOT_ARGS.findall(line))


def test_no_tracked_file_reaches_outside_the_repository() -> None:
    found = outside_references(REPO, tracked_files(REPO))
    assert not found, "these lines reach outside the repository:\n" + "\n".join(found)


def test_the_check_catches_planted_references(tmp_path: Path) -> None:
    copy = tmp_path / "clone"
    names = tracked_files(REPO)
    for name in names:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / name, copy / name)
    assert outside_references(copy, names) == []

    planted = {
        "README.md": f"See [{UP}shared/PERFORMANCE.md]({UP}shared/PERFORMANCE.md).\n",
        "tests/openai_schema.py": (
            "DOC = Path(__file__).resolve().parents[1]" + '.parent / "shared" / "x.json"\n'
        ),
        "tests/unit/helpers.py": (
            'ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")\n'
        ),
        "Makefile": f"\tcp {UP}other-project/model.gguf models/\n",
        "services/worker/weights.py": "CHECKPOINT = Path(__file__).parent.parent.parent.parent\n",
    }
    for name, line in planted.items():
        with (copy / name).open("a", encoding="utf-8") as f:
            f.write(line)
    new = ["tests/unit/helpers.py", "services/worker/weights.py"]
    found = outside_references(copy, names + new)
    assert sorted(f.split(":")[0] for f in found) == sorted(planted)

    # What stays inside is not flagged: a kustomize overlay's base, a config's venv path.
    inside = {
        "deploy/k8s/overlays/cpu/x.yaml": f"  - {UP}{UP}base\n",
        "configs/x.toml": f'path = "{UP}.venv/models/m.gguf"\n',
        "tests/unit/y.py": 'ROOT = Path(__file__).resolve().parents[2] / "pyproject.toml"\n',
    }
    for name, line in inside.items():
        (copy / name).write_text(line)
    assert outside_references(copy, list(inside)) == []


def test_the_vendored_openapi_document_is_the_one_its_provenance_names() -> None:
    folder = REPO / "tests" / "data" / "openai-openapi"
    source = (folder / "SOURCE.md").read_text()
    digest = hashlib.sha256((folder / "openapi.json").read_bytes()).hexdigest()
    assert digest in source
    assert "MIT" in (folder / "LICENSE").read_text()
