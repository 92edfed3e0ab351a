"""The raw bytes each token id stands for.

Logprobs report a token's bytes, and the incremental detokenizer streams bytes so it never
emits half a UTF-8 character. Two vocabulary spellings are understood:

* byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM): every byte is spelled as one printable
  character (GPT-2's `bytes_to_unicode` table). Decoding is exact: tokenizers' ByteLevel
  decoder maps each token's characters through the same table and, when a token contains a
  character outside it (an added token with a real space, say), uses the token's UTF-8 bytes
  unchanged. `token_bytes` copies that rule, so joining the bytes of a sequence and decoding
  them as UTF-8 with replacement gives exactly `Tokenizer.decode`.
* SentencePiece style (Llama 2, Mistral, Gemma): "▁" stands for a space and `<0xNN>` for a
  raw byte (byte fallback). Here bytes are exact per token, but the library's decoder also
  strips the sequence's first leading space, so the detokenizer does not rely on them.
"""

from __future__ import annotations

import re

from tokenizers import Tokenizer, decoders

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPIECE_SPACE = "\u2581"


def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: character -> byte. Printable Latin-1 bytes
    spell themselves; the other 68 bytes (controls, space, ...) take code points 256 and up."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_CHAR_TO_BYTE = _gpt2_byte_alphabet()


def is_byte_level(tokenizer: Tokenizer) -> bool:
    """True when the tokenizer's decoder is byte-level, i.e. decode == join of token bytes."""
    return isinstance(tokenizer.decoder, decoders.ByteLevel)


def byte_level_token_bytes(token: str) -> bytes:
    """The bytes of one byte-level token, with tokenizers' fallback for unmapped characters."""
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def sentencepiece_token_bytes(token: str) -> bytes:
    """The bytes of one SentencePiece-style token: `<0xNN>` is one byte, "▁" a space."""
    match = _BYTE_FALLBACK.fullmatch(token)
    if match:
        return bytes([int(match.group(1), 16)])
    return token.replace(_SPIECE_SPACE, " ").encode("utf-8")


def build_token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """A table indexed by token id; ids the tokenizer does not know map to b"".

    Built once per model (about 50 ms for 50k tokens) so that per-token lookups on the
    streaming path are a list index.
    """
    convert = byte_level_token_bytes if is_byte_level(tokenizer) else sentencepiece_token_bytes
    size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    table: list[bytes] = []
    for token_id in range(size):
        token = tokenizer.id_to_token(token_id)
        table.append(b"" if token is None else convert(token))
    return table
