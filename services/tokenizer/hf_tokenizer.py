"""Build a TextModel from a Hugging Face tokenizer directory.

Files read:
* tokenizer.json (required): the fast tokenizer, post-processor included. BOS rule: we
  encode plain text with the post-processor, exactly as transformers' fast tokenizers do,
  so a BOS is added iff tokenizer.json's post-processor adds one.
* tokenizer_config.json (optional): chat_template (a string, or a list of named templates of
  which "default" is used), bos_token and eos_token (a string or an AddedToken object).
* chat_template.jinja (optional): takes precedence over tokenizer_config's template, as in
  recent transformers, which saves templates there.
* generation_config.json (optional): its eos_token_id (an int or a list) adds stop tokens;
  Llama 3 instruct models list <|eot_id|> only there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from services.tokenizer.text_model import TextModel


def load_hf_tokenizer(directory: str | Path) -> TextModel:
    """A TextModel from `directory`. FileNotFoundError without tokenizer.json; ValueError
    when a config file is malformed."""
    directory = Path(directory)
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"{directory} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    # Some (BERT sentence-embedding) tokenizer.json files pad and truncate every encoding to a
    # fixed length: a prompt is its own tokens, and one too long is refused, not cut.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    config = _read_json(directory / "tokenizer_config.json")
    generation = _read_json(directory / "generation_config.json")
    return TextModel(
        tokenizer,
        name=directory.name,
        bos_token_id=_token_id(tokenizer, config.get("bos_token")),
        eos_token_id=_token_id(tokenizer, config.get("eos_token")),
        chat_template=_chat_template(directory, config),
        extra_stop_token_ids=_generation_eos_ids(generation),
    )


def _read_json(path: Path) -> dict[str, Any]:
    """The object in `path`, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


def _token_id(tokenizer: Tokenizer, token: Any) -> int | None:
    """The id of a config token entry: "<s>", {"content": "<s>", ...} or null."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    return tokenizer.token_to_id(token)


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        # Multi-template configs (e.g. "default" plus "tool_use"); chat uses "default".
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{directory}: chat_template must be a string")
    return template


def _generation_eos_ids(generation: dict[str, Any]) -> list[int]:
    value = generation.get("eos_token_id")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []
