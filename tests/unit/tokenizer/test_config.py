"""The tokenizer's flags and LAYERSERVE_* variables."""

from __future__ import annotations

import pytest

from services.tokenizer.config import DEFAULT_MODEL, TokenizerConfig


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOKENIZER_MODELS", "TOKENIZER_PORT", "TOKENIZER_THREADS"):
        monkeypatch.delenv(f"LAYERSERVE_{name}", raising=False)


def test_models_come_from_flags_else_the_environment_else_the_embedded_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert TokenizerConfig.from_args([]).models == ((DEFAULT_MODEL, None),)
    monkeypatch.setenv("LAYERSERVE_TOKENIZER_MODELS", "a=/a.gguf, b")
    assert TokenizerConfig.from_args([]).models == (("a", "/a.gguf"), ("b", None))
    assert TokenizerConfig.from_args(["--model", "c"]).models == (("c", None),)
    with pytest.raises(ValueError, match="a model name is given twice"):
        TokenizerConfig.from_args(["--model", "c", "--model", "c=/c"])
    with pytest.raises(ValueError, match="--model needs a name: '=/x'"):
        TokenizerConfig.from_args(["--model", "=/x"])


def test_numbers_and_their_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_TOKENIZER_PORT", "6000")
    assert TokenizerConfig.from_args([]).port == 6000
    assert TokenizerConfig.from_args(["--port", "6001"]).port == 6001
    with pytest.raises(ValueError, match="^--threads must be positive, got 0$"):
        TokenizerConfig.from_args(["--threads", "0"])
    monkeypatch.setenv("LAYERSERVE_TOKENIZER_THREADS", "two")
    with pytest.raises(ValueError, match="LAYERSERVE_TOKENIZER_THREADS must be an integer"):
        TokenizerConfig.from_args([])
