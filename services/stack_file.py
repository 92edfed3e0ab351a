"""The stack config file (`make run ARGS="--config FILE"`): which models to serve, how many
worker processes each, and model aliases. TOML, read with the standard library:

    [[models]]
    name = "smollm2-135m-instruct"
    path = ""                  # a .gguf file or Llama checkpoint directory; "" = embedded SmolLM2
    replicas = 1               # worker processes (default 1)
    worker_args = ["--num-blocks", "512"]   # extra `python -m services.worker` flags (optional)

    [aliases.canary]           # read by the scheduler (see services/scheduler/aliases.py)
    weights = { "smollm2-135m-instruct" = 90, "other" = 10 }

A relative path is relative to the file's directory.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MODEL_KEYS = {"name", "path", "replicas", "worker_args"}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    path: str | None = None  # None: the embedded SmolLM2-135M-Instruct GGUF
    replicas: int = 1
    worker_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StackFile:
    path: Path
    models: tuple[ModelSpec, ...]
    alias_names: tuple[str, ...]  # the scheduler reads and checks the aliases themselves


def read_stack_file(path: str | Path) -> StackFile:
    """Raises ValueError, naming the file, when it is malformed."""
    path = Path(path).resolve()
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        return _stack_file(path, raw)
    except (tomllib.TOMLDecodeError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from None


def _stack_file(path: Path, raw: dict[str, Any]) -> StackFile:
    unknown = set(raw) - {"models", "aliases"}
    if unknown:
        raise ValueError(f"unknown top-level keys {sorted(unknown)}; expected models, aliases")
    entries = raw.get("models")
    if not isinstance(entries, list) or not entries:
        raise ValueError("give at least one [[models]] entry")
    models = tuple(_model(entry, path.parent) for entry in entries)
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"a model name is given twice: {names}")
    aliases = raw.get("aliases", {})
    if not isinstance(aliases, dict):
        raise ValueError("`aliases` must be a table of alias names")
    clashes = sorted(set(aliases) & set(names))
    if clashes:
        raise ValueError(f"aliases cannot take a model's name: {clashes}")
    return StackFile(path, models, tuple(aliases))


def _model(entry: Any, base: Path) -> ModelSpec:
    if not isinstance(entry, dict) or set(entry) - _MODEL_KEYS:
        raise ValueError(f"a [[models]] entry has only the keys {sorted(_MODEL_KEYS)}: {entry}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a [[models]] entry needs a name: {entry}")
    path = entry.get("path", "")
    replicas = entry.get("replicas", 1)
    args = entry.get("worker_args", [])
    if not isinstance(path, str):
        raise ValueError(f"model `{name}`: path must be a string")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"model `{name}`: replicas must be a positive integer")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"model `{name}`: worker_args must be a list of strings")
    resolved = str((base / path).resolve()) if path else None
    if resolved is not None and not Path(resolved).exists():
        raise ValueError(f"model `{name}`: {resolved} does not exist")
    return ModelSpec(name, resolved, replicas, tuple(args))
