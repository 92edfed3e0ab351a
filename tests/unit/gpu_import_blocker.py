"""Makes this process see only what a bare GPU machine has: python3's standard library, torch,
triton, pytest and (optionally there) transformers, with their own dependencies, and this
project's source without its generated protobuf stubs. Every other installed package (grpc,
google.protobuf, gguf, llguidance, prometheus_client, opentelemetry, ...) and every
layerserve.*_pb2 module raises ModuleNotFoundError, as it would there.

    python -m pytest -p tests.unit.gpu_import_blocker ...   # as a pytest plugin
    python -c "import tests.unit.gpu_import_blocker, services.worker.engine.model_runner"

Run pytest with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1: the GPU machine has no pytest plugins, and
this one is loaded before those installed here would be (hypothesis, pytest-asyncio)."""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import re
import sys

# What the GPU machine has; transformers is optional there, and harmless to allow here.
PRESENT = ("torch", "triton", "pytest", "transformers")
PROJECT = ("services", "benchmarks", "tests", "scripts", "layerserve")
_STUB = re.compile(r"^layerserve\..*_pb2(_grpc)?$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: tuple[str, ...]) -> set[str]:
    """The distributions `roots` need, themselves included (extras left out)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def _blocked_tops() -> set[str]:
    """Top-level import names installed here that belong to no distribution in PRESENT's
    closure."""
    allowed = _closure(PRESENT)
    blocked = set()
    for top, dists in importlib.metadata.packages_distributions().items():
        if top in PROJECT:
            continue
        if not any(_normal(d) in allowed for d in dists):
            blocked.add(top)
    return blocked


BLOCKED = frozenset(_blocked_tops())


def is_blocked(name: str) -> bool:
    return name.split(".")[0] in BLOCKED or bool(_STUB.match(name))


class _Hiding(importlib.abc.MetaPathFinder):
    """One of sys.meta_path's finders that finds no blocked module: importlib.util.find_spec
    returns None for it (optional imports, torch's among them, see it absent) and importing
    it raises ModuleNotFoundError, as on a machine that does not have it."""

    def __init__(self, finder: object) -> None:
        self._finder = finder

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if is_blocked(name):
            return None
        return self._finder.find_spec(name, path, target)  # type: ignore[attr-defined]

    def find_distributions(self, *args: object, **kwargs: object) -> object:
        """importlib.metadata asks the finders for installed distributions: all are named
        (packages read their own version), though the blocked ones cannot be imported."""
        find = getattr(self._finder, "find_distributions", None)
        return iter(()) if find is None else find(*args, **kwargs)

    def invalidate_caches(self) -> None:
        getattr(self._finder, "invalidate_caches", lambda: None)()


for _name in list(sys.modules):
    if is_blocked(_name):
        del sys.modules[_name]
sys.meta_path[:] = [
    f if isinstance(f, _Hiding) or not hasattr(f, "find_spec") else _Hiding(f)
    for f in sys.meta_path
]
