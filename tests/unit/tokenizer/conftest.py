"""Shared fixtures: the default GGUF tokenizer is parsed once (it takes seconds)."""

from __future__ import annotations

import pytest

from services.tokenizer.loader import load_tokenizer
from services.tokenizer.text_model import TextModel


@pytest.fixture(scope="session")
def smollm() -> TextModel:
    """The default model's tokenizer, shared read-only by every test."""
    return load_tokenizer(None)
