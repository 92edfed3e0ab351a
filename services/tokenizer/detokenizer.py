"""Streaming token ids -> text deltas, never splitting a UTF-8 character.

Byte-level BPE spreads one emoji or CJK character over several tokens, so decoding token by
token would emit U+FFFD halves. Two strategies, both O(new tokens) per call:

* byte-level tokenizers (the default model): append each token's raw bytes to Python's
  incremental UTF-8 decoder, which holds back an incomplete trailing sequence until the next
  bytes complete it and replaces invalid bytes exactly as `Tokenizer.decode` does (both follow
  Unicode's "maximal subpart" rule). Tokens are independent of context here, so no window and
  no prompt are needed, and the concatenated deltas equal `decode(ids)` exactly.
* other tokenizers (SentencePiece style, whose decoder strips a leading space at sequence
  start and fuses byte-fallback tokens): the prefix/read-offset window of vLLM and TGI.
  Decode a few trailing tokens with and without the new ones and emit the difference, unless
  it ends in U+FFFD (a character still incomplete). Seeded with the prompt's last tokens so
  the first output token's leading space is kept as the model meant it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from services.tokenizer.text_model import TextModel

# Prompt tokens kept as left context for the window strategy: enough for any decoder rule
# that looks at the previous token (vLLM uses 5).
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    """Turn a growing sequence of generated ids into text deltas.

    Contract: `add` returns only new text and never ends inside a UTF-8 character; `flush`
    returns what is held back (an incomplete character becomes U+FFFD) and must be called once
    at the end. For byte-level tokenizers "".join(all deltas) == model.decode(output_ids,
    skip_special_tokens); for others it is the output's text as it continues the prompt.
    One instance per request; not thread-safe.
    """

    def __init__(
        self,
        model: TextModel,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._stream: _ByteStream | _WindowStream
        if model.is_byte_level:
            self._stream = _ByteStream(model, skip_special_tokens)
        else:
            self._stream = _WindowStream(model, prompt_ids or (), skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Feed newly generated ids; returns the text they complete (possibly "")."""
        return self._stream.add(token_ids)

    def flush(self) -> str:
        """End of generation: whatever was held back, incomplete characters as U+FFFD."""
        return self._stream.flush()


class _ByteStream:
    """Exact streaming for byte-level vocabularies: bytes in, complete characters out."""

    def __init__(self, model: TextModel, skip_special_tokens: bool) -> None:
        self._model = model
        self._skipped = model.special_token_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_ids: Sequence[int]) -> str:
        token_bytes = self._model.token_bytes
        chunk = b"".join(token_bytes(i) for i in token_ids if i not in self._skipped)
        return self._decoder.decode(chunk)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class _WindowStream:
    """vLLM-style prefix/read offsets over a short window of trailing ids.

    `_ids[:_read]` has been emitted; `_ids[:_prefix]` is dropped context. The text of
    `_ids[_prefix:_read]` is a stable prefix of the text of `_ids[_prefix:]`, so the delta is
    the difference of two small decodes.
    """

    def __init__(self, model: TextModel, prompt_ids: Sequence[int], skip: bool) -> None:
        self._model = model
        self._skip = skip
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:])
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self._model.decode
        done = decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        text = decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        # Hold back while the newest character is incomplete: more bytes will replace U+FFFD.
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        # Slide the window: the ids just emitted become the next call's left context, and
        # everything before them is dropped so each call decodes only a few tokens.
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        return text[len(done) :]
