"""Lets the GPU check import the worker's ModelRunner where only torch, triton, transformers,
grpcio, protobuf and tokenizers are installed.

The runner's module imports reach packages the decode path never calls: gguf and numpy (the
GGUF loader), safetensors (the HF loader), prometheus_client (worker metrics, via the worker's
flags). Each one that is not installed is replaced by a stand-in module whose every name is an
inert placeholder, so module-level definitions (a Counter, a flag helper) succeed; anything
that really needs the package is not part of what the check runs. Installed packages are used
as they are. stub_missing() returns the names it replaced, for the report."""

from __future__ import annotations

import importlib.util
import sys
import types

OPTIONAL = (
    "gguf", "numpy", "safetensors", "prometheus_client", "opentelemetry", "grpc_health",
    "cryptography", "aiohttp", "redis", "jinja2",
)  # fmt: skip


class _InertType(type):
    def __getattr__(cls, name: str) -> _Inert:  # HealthCheckResponse.SERVING and the like
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _Inert(metaclass=_InertType):
    """Callable, indexable, subclassable: whatever the importing module does at load time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return _Inert()

    def __getattr__(self, name: str) -> _Inert:
        return _Inert()

    def __getitem__(self, key: object) -> _Inert:
        return _Inert()

    def __int__(self) -> int:  # int(gguf.TokenType.CONTROL) in a module body
        return 0

    __index__ = __int__

    def __iter__(self):
        return iter(())


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            return _InertType(name, (_Inert,), {})  # a class: subclassed, instantiated, read
        # A submodule (`from grpc_health.v1 import health_pb2`) or a function: a stand-in
        # module serves as both.
        return importlib.import_module(f"{self.__name__}.{name}")

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return _Inert()


class _Finder:
    """Answers imports of a stubbed package's submodules (opentelemetry.trace, gguf.quants)."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name.split(".")[0] not in self.roots:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []  # a package: submodules resolve through this finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def stub_missing(names: tuple[str, ...] = OPTIONAL) -> list[str]:
    """Installs stand-ins for the packages in `names` that cannot be imported."""
    missing = {n for n in names if n not in sys.modules and importlib.util.find_spec(n) is None}
    if missing:
        sys.meta_path.append(_Finder(missing))
    return sorted(missing)
