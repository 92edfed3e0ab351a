"""Streaming detokenization: no half characters, and the deltas add up to decode(ids)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from services.tokenizer.detokenizer import IncrementalDetokenizer
from services.tokenizer.text_model import TextModel

TEXTS = [
    "I ❤️ 🦀 and 日本語 👨‍👩‍👧",
    "Emoji at the end 🎉🎉",
    "混合 text with 中文 and ✓ marks, Ελληνικά, 🇫🇷 flags",
    "plain ascii only",
]


def _chunks(ids: list[int], rng: random.Random) -> Iterator[list[int]]:
    i = 0
    while i < len(ids):
        size = rng.randint(0, 4)  # empty chunks happen too (a step that produced nothing)
        yield ids[i : i + size]
        i += size


def _stream(model: TextModel, pieces: Iterator[list[int]], skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(model, skip_special_tokens=skip)
    deltas = [detok.add(piece) for piece in pieces]
    return [*deltas, detok.flush()]


def _assert_clean(deltas: list[str]) -> None:
    for delta in deltas:
        assert "\ufffd" not in delta
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in delta)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(smollm: TextModel, text: str) -> None:
    ids = smollm.encode(text)
    deltas = _stream(smollm, ([i] for i in ids))
    _assert_clean(deltas)
    assert "".join(deltas) == smollm.decode(ids) == text


@pytest.mark.parametrize("seed", range(20))
def test_random_chunks(smollm: TextModel, seed: int) -> None:
    rng = random.Random(seed)
    ids = smollm.encode(rng.choice(TEXTS))
    deltas = _stream(smollm, _chunks(ids, rng))
    _assert_clean(deltas)
    assert "".join(deltas) == smollm.decode(ids)


def test_skip_special_tokens(smollm: TextModel) -> None:
    ids = smollm.encode("<|im_start|>assistant\n🦀 ok<|im_end|>")
    assert "".join(_stream(smollm, ([i] for i in ids))) == "assistant\n🦀 ok"
    kept = "".join(_stream(smollm, ([i] for i in ids), skip=False))
    assert kept == "<|im_start|>assistant\n🦀 ok<|im_end|>"


def test_invalid_bytes_match_decode(smollm: TextModel) -> None:
    # A model can emit byte tokens that never form a character; the stream must then show
    # U+FFFD exactly where decode does, and flush what is still pending.
    rng = random.Random(3)
    for _ in range(100):
        ids = [rng.randrange(smollm.vocab_size) for _ in range(rng.randrange(1, 10))]
        assert "".join(_stream(smollm, _chunks(ids, rng), skip=False)) == smollm.decode(ids)


def test_partial_character_is_held_then_flushed(smollm: TextModel) -> None:
    ids = smollm.encode("a🦀")
    detok = IncrementalDetokenizer(smollm)
    assert detok.add(ids[:2]) == "a"  # the crab's first bytes are held back
    assert detok.flush() == "\ufffd"  # generation ended mid-character


@pytest.fixture(scope="module")
def sentencepiece_style() -> TextModel:
    """A small Llama-2-style tokenizer (Metaspace, byte fallback, leading-space strip), to
    exercise the window strategy used for non-byte-level vocabularies."""
    trainer = trainers.BpeTrainer(vocab_size=200, show_progress=False)
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    base.train_from_iterator(["hello world, the text streams well"] * 20, trainer)
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) for m in model["merges"]]  # tokenizers >= 0.20 saves [left, right]
    tokenizer = Tokenizer(models.BPE(vocab, merges, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    space = decoders.Replace("\u2581", " ")
    strip_first_space = decoders.Strip(" ", 1, 0)
    tokenizer.decoder = decoders.Sequence(
        [space, decoders.ByteFallback(), decoders.Fuse(), strip_first_space]
    )
    tokenizer.add_special_tokens([AddedToken("</s>", special=True, normalized=False)])
    return TextModel(
        tokenizer, name="spm", bos_token_id=None, eos_token_id=None, chat_template=None
    )


@pytest.mark.parametrize("seed", range(10))
def test_window_strategy(sentencepiece_style: TextModel, seed: int) -> None:
    model = sentencepiece_style
    assert not model.is_byte_level
    rng = random.Random(seed)
    text = "hello 🦀 world 日本 text</s>"
    ids = model.encode(text)
    deltas = _stream(model, _chunks(ids, rng))
    _assert_clean(deltas)
    expected = "hello 🦀 world 日本 text"
    assert "".join(deltas) == model.decode(ids, skip_special_tokens=True) == expected


def test_window_strategy_keeps_space_after_prompt(sentencepiece_style: TextModel) -> None:
    prompt, output = sentencepiece_style.encode("hello"), sentencepiece_style.encode(" world")
    detok = IncrementalDetokenizer(sentencepiece_style, prompt_ids=prompt)
    # Continuing "hello", the output starts with its space (decode alone would strip it).
    assert detok.add(output) + detok.flush() == " world"
