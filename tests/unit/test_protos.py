"""The generated stubs in layerserve/ are exactly what protos/ generates."""

from __future__ import annotations

import filecmp
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from gen_protos import generate  # noqa: E402


def test_generated_stubs_are_up_to_date(tmp_path):
    generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in _stubs(tmp_path))
    committed = sorted(p.relative_to(ROOT) for p in _stubs(ROOT / "layerserve"))
    assert fresh == committed, "run `make protos` and commit the result"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert not stale, f"stale stubs (run `make protos`): {stale}"


def _stubs(root: Path) -> list[Path]:
    """The generated .py and .pyi files below root (not Python's __pycache__ beside them: a
    `make test` without PYTHONDONTWRITEBYTECODE writes those)."""
    return [p for p in root.rglob("*.py*") if p.suffix in (".py", ".pyi")]
