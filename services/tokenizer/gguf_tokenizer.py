"""A TextModel from the tokenizer inside a GGUF model file (built in services/common)."""

from __future__ import annotations

from pathlib import Path

from services.common.gguf_tokenizer import default_gguf_path, load_gguf_tokenizer
from services.tokenizer.text_model import TextModel

__all__ = ["default_gguf_path", "load_gguf_text_model"]


def load_gguf_text_model(path: str | Path) -> TextModel:
    """ValueError when the file's tokenizer is unsupported."""
    found = load_gguf_tokenizer(path)
    return TextModel(
        found.tokenizer,
        name=found.name,
        bos_token_id=found.bos_token_id,
        eos_token_id=found.eos_token_id,
        chat_template=found.chat_template,
    )
