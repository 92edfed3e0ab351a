"""Test-only fault injection for tests/reliability/test_stalled_worker.py, which puts this
directory on the PYTHONPATH of the stack's processes: in a null worker, an engine step that
starts while the file `$LAYERSERVE_TEST_STALL_DIR/stall-<its --port>` exists stalls (on the
model thread, as a wedged kernel would) until the file is removed. Nothing else changes."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

_DIR = os.environ.get("LAYERSERVE_TEST_STALL_DIR")


def _flag() -> str:
    port = sys.argv[sys.argv.index("--port") + 1] if "--port" in sys.argv else "?"
    return os.path.join(_DIR or "", f"stall-{port}")


def _patch(module) -> None:
    runner = getattr(module, "NullRunner", None)
    if runner is None:
        return
    execute = runner.execute

    def stalling_execute(self, plan):
        flag = _flag()
        while os.path.exists(flag):
            time.sleep(0.02)
        return execute(self, plan)

    runner.execute = stalling_execute


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the null runner's module (wherever the worker keeps it) once it is loaded."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("services.worker") or not fullname.endswith("null_runner"):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if _DIR:
    sys.meta_path.insert(0, _Finder())
