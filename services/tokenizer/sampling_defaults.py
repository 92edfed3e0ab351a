"""A model's recommended sampling settings, applied to the fields a request left out.

Where they come from (as vLLM's `--generation-config auto` does):
* a Hugging Face directory: its generation_config.json (temperature, top_p, top_k, min_p,
  repetition_penalty; `do_sample` is not read, as in vLLM);
* a GGUF file, which carries none: the first entry of the defaults file
  (configs/generation_defaults.toml, `--generation-defaults`) whose `file` pattern matches the
  file's name.

The gateway knows which fields the client left out and says so (GenerateRequest.sampling_unset);
this service knows the model that serves the request (an alias resolves here) and its files, so
the defaults are applied here and nowhere else. `--generation-config off` turns them off: a
request then gets the API's own defaults (OpenAI's temperature 1, gRPC's greedy).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from layerserve.common.v1 import common_pb2

log = logging.getLogger(__name__)

# The fields a model may recommend, by their common.v1.SamplingParams names, with their bounds.
_BOUNDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (0, 2**31 - 1),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, 2.0),
}
SAMPLING_FIELDS = tuple(_BOUNDS)
DEFAULTS_FILE = "generation_defaults.toml"


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Each None: the model recommends nothing, so the request keeps the API's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    source: str = ""  # where they were read, for the log

    def given(self) -> dict[str, float | int]:
        """The recommended values, by field name."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in _BOUNDS and getattr(self, f.name) is not None
        }

    def describe(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.given().items())
        return f"{values} (from {self.source})" if values else "none"

    def apply(
        self, sampling: common_pb2.SamplingParams, unset: Iterable[str]
    ) -> common_pb2.SamplingParams:
        """A copy of `sampling` with every field in `unset` the model recommends set to the
        recommended value; the others as sent."""
        given = self.given()
        chosen = {name: given[name] for name in unset if name in given}
        if not chosen:
            return sampling
        applied = common_pb2.SamplingParams()
        applied.CopyFrom(sampling)
        for name, value in chosen.items():
            setattr(applied, name, value)
        return applied


NO_DEFAULTS = SamplingDefaults()


def sampling_defaults_for(model_path: str | Path, defaults_file: str | Path) -> SamplingDefaults:
    """The recommended settings of the model at `model_path` (a .gguf file or a checkpoint
    directory). Raises ValueError naming the file for a value out of range."""
    path = Path(model_path)
    if path.is_dir():
        generation = path / "generation_config.json"
        if generation.is_file():
            return _from_mapping(_read_json(generation), str(generation))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            return NO_DEFAULTS
        path = ggufs[0]
    return _from_table(path.name, defaults_file)


def default_defaults_file() -> Path:
    """configs/generation_defaults.toml of the source tree this module is in, else of the
    working directory (the Docker images copy configs/ to /app, their working directory)."""
    in_tree = Path(__file__).resolve().parents[2] / "configs" / DEFAULTS_FILE
    return in_tree if in_tree.is_file() else Path("configs") / DEFAULTS_FILE


def _from_table(file_name: str, defaults_file: str | Path) -> SamplingDefaults:
    table = Path(defaults_file)
    if not table.is_file():
        log.warning("no sampling defaults for GGUF files: %s does not exist", table)
        return NO_DEFAULTS
    with open(table, "rb") as f:
        try:
            entries = tomllib.load(f).get("gguf", [])
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{table}: {err}") from None
    for entry in entries:
        pattern = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(pattern, str):
            raise ValueError(f"{table}: every [[gguf]] entry needs a `file` pattern")
        if fnmatch.fnmatch(file_name, pattern):
            values = {k: v for k, v in entry.items() if k != "file"}
            return _from_mapping(values, f"{table} [{pattern}]", strict=True)
    return NO_DEFAULTS


def _from_mapping(values: dict[str, Any], source: str, strict: bool = False) -> SamplingDefaults:
    """strict: a key that is not a sampling field is an error (our own file), else ignored
    (generation_config.json holds much else)."""
    chosen: dict[str, float | int] = {}
    for name, value in values.items():
        if name not in _BOUNDS:
            if strict and name != "source":
                raise ValueError(f"{source}: unknown setting {name!r}")
            continue
        low, high = _BOUNDS[name]
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"{source}: {name} must be a number in [{low}, {high}], got {value!r}")
        chosen[name] = int(value) if name == "top_k" else float(value)
    if not chosen:
        return NO_DEFAULTS
    return replace(NO_DEFAULTS, source=source, **chosen)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
