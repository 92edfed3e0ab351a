"""Hugging Face directories, built from the GGUF tokenizer, and load_tokenizer's dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.tokenizer.gguf_tokenizer import default_gguf_path
from services.tokenizer.hf_tokenizer import load_hf_tokenizer
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.text_model import TextModel

TEXTS = ["Hello world", "12345 apples", "I ❤️ 🦀 and 日本語", "<|im_start|>user\nhi<|im_end|>"]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def _write_dir(smollm: TextModel, directory: Path, **config: object) -> Path:
    smollm.tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def hf_dir(smollm: TextModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert smollm.chat_template is not None
    return _write_dir(
        smollm,
        tmp_path_factory.mktemp("smollm2_hf"),
        chat_template=smollm.chat_template.source,
        bos_token="<|im_start|>",
        eos_token={"content": "<|im_end|>", "special": True},
    )


def test_hf_directory_matches_gguf(smollm: TextModel, hf_dir: Path) -> None:
    hf = load_hf_tokenizer(hf_dir)
    for text in TEXTS:
        assert hf.encode(text) == smollm.encode(text)
        assert hf.decode(hf.encode(text)) == text
    assert hf.apply_chat_template(MESSAGES) == smollm.apply_chat_template(MESSAGES)
    assert hf.encode_chat(MESSAGES) == smollm.encode_chat(MESSAGES)
    assert (hf.bos_token_id, hf.eos_token_id) == (1, 2)
    assert hf.stop_token_ids == smollm.stop_token_ids
    assert hf.special_token_ids == smollm.special_token_ids


def test_chat_template_file_and_generation_config(smollm: TextModel, tmp_path: Path) -> None:
    _write_dir(smollm, tmp_path, chat_template=[{"name": "default", "template": "ignored"}])
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    hf = load_hf_tokenizer(tmp_path)
    assert hf.apply_chat_template(MESSAGES) == "What is the capital of France?!"
    assert hf.eos_token_id is None
    assert hf.stop_token_ids == frozenset({0, 2, 5})


def test_named_templates_use_default(smollm: TextModel, tmp_path: Path) -> None:
    templates = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "d"}]
    hf = load_hf_tokenizer(_write_dir(smollm, tmp_path, chat_template=templates))
    assert hf.apply_chat_template(MESSAGES) == "d"


def test_load_tokenizer_dispatch(hf_dir: Path, tmp_path: Path) -> None:
    assert load_tokenizer(hf_dir).name == hf_dir.name
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.gguf")
    assert default_gguf_path().is_file()
