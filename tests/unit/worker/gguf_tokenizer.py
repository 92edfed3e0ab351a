"""A quick byte-level BPE tokenizer built from a GGUF file's vocabulary, for tests only.

The service's real tokenizer lives elsewhere; this one just turns English into plausible ids
so model-quality checks (chat answer, long-text loss) can run."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL_TOKEN_TYPE = 3


def tokenizer_from_gguf(path: Path) -> Tokenizer:
    reader = GGUFReader(path)
    tokens: list[str] = list(reader.fields["tokenizer.ggml.tokens"].contents())
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    # SmolLM2's pre-tokenizer: every digit on its own, then GPT-2 byte-level splitting.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL_TOKEN_TYPE]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer
