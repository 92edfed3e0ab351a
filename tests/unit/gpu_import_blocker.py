"""A pytest plugin (`-p tests.unit.gpu_import_blocker`) that makes the project's dependencies
the GPU machine lacks unimportable, as they are there (scripts/gpu_check.py's docstring)."""

from __future__ import annotations

import importlib.abc
import sys

from benchmarks.gpu_measure import NOT_NEEDED


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in NOT_NEEDED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not on the GPU box)")
        return None


for _name in list(sys.modules):
    if _name.split(".")[0] in NOT_NEEDED:
        del sys.modules[_name]
sys.meta_path.insert(0, _Absent())
