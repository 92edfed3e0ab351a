"""How a model's embeddings are pooled (POST /v1/embeddings), as its files say.

* a GGUF file: `<architecture>.pooling_type` (llama.cpp's: 1 mean, 3 last; others, CLS and
  rank, are not supported here and fall back to last);
* a checkpoint directory: a sentence-transformers `1_Pooling/config.json`
  (pooling_mode_mean_tokens, pooling_mode_lasttoken);
* otherwise the last position, vLLM's default for a decoder model: causal attention, so only the
  last position has read the whole prompt.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from services.common.gguf_file import GGUFFile
from services.common.sampling import Pooling

log = logging.getLogger(__name__)

_GGUF_POOLING: dict[int, Pooling] = {1: "mean", 3: "last"}


def pooling_of(model_path: str | Path) -> Pooling:
    path = Path(model_path)
    if path.is_dir():
        config = path / "1_Pooling" / "config.json"
        if config.is_file():
            return _sentence_transformers(config)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            return "last"
        path = ggufs[0]
    if path.suffix != ".gguf":
        return "last"
    fields = GGUFFile(path).fields
    kind = fields.get(f"{fields.get('general.architecture', '')}.pooling_type")
    if kind is None:
        return "last"
    if kind not in _GGUF_POOLING:
        log.warning("%s: pooling_type %s is not supported; pooling the last position", path, kind)
    return _GGUF_POOLING.get(kind, "last")


def _sentence_transformers(config: Path) -> Pooling:
    try:
        modes = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{config}: {err}") from None
    if modes.get("pooling_mode_mean_tokens"):
        return "mean"
    if not modes.get("pooling_mode_lasttoken"):
        log.warning("%s: only mean and last-token pooling are supported; pooling the last", config)
    return "last"
