"""The tokenizer built from SmolLM2's GGUF metadata, against hand-checked tokenizations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from services.common.errors import InvalidArgument
from services.tokenizer.text_model import TextModel

ROUND_TRIP_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a: int, b: int) -> int:\n    return a + b  # sum\n",
    "I ❤️ 🦀 and 日本語 👨‍👩‍👧",
    "中文测试，한국어 텍스트, Ελληνικά, العربية",
    "tabs\tand  double  spaces\n\n\r\n   trailing   ",
    "",
]


def test_metadata(smollm: TextModel) -> None:
    # The file says bos 1 <|im_start|>, eos 2 <|im_end|> (as HF's tokenizer_config does).
    assert smollm.vocab_size == 49152
    assert smollm.bos_token_id == 1
    assert smollm.eos_token_id == 2
    assert smollm.is_byte_level
    assert smollm.special_token_ids == frozenset(range(17))
    assert smollm.stop_token_ids == frozenset({0, 2})  # <|im_end|> and <|endoftext|>


def test_hand_checked_tokens(smollm: TextModel) -> None:
    assert smollm.encode("Hello world") == [19556, 905]
    assert smollm.encode(" Paris") == [7042]
    assert [smollm.token_text(i) for i in smollm.encode("Hello world")] == ["Hello", " world"]


def test_digits_are_split_one_per_token(smollm: TextModel) -> None:
    ids = smollm.encode("12345")
    assert len(ids) == 5
    assert [smollm.token_text(i) for i in ids] == ["1", "2", "3", "4", "5"]
    # The space before a number stays its own token, as in HF SmolLM2 (Digits runs first).
    assert [smollm.token_text(i) for i in smollm.encode("x 42")] == ["x", " ", "4", "2"]


def test_special_tokens_match_whole(smollm: TextModel) -> None:
    assert smollm.encode("<|im_start|>") == [1]
    assert smollm.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert smollm.encode("<|im_start|>user\nhi<|im_end|>")[-1] == 2


def test_no_bos_on_plain_text(smollm: TextModel) -> None:
    # HF's SmolLM2 tokenizer adds nothing; the GGUF says add_bos_token = false.
    assert smollm.encode("Hello")[0] != smollm.bos_token_id
    assert smollm.encode("Hello") == smollm.encode("Hello", add_special_tokens=False)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(smollm: TextModel, text: str) -> None:
    assert smollm.decode(smollm.encode(text)) == text


def test_decode_skips_special_tokens(smollm: TextModel) -> None:
    ids = smollm.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert smollm.decode(ids) == "<|im_start|>assistant\nHi<|im_end|>"
    assert smollm.decode(ids, skip_special_tokens=True) == "assistant\nHi"


def test_token_bytes_split_characters(smollm: TextModel) -> None:
    ids = smollm.encode("🦀")
    assert len(ids) > 1  # byte-level BPE splits this emoji
    assert b"".join(smollm.token_bytes(i) for i in ids) == "🦀".encode()
    assert "\ufffd" in smollm.token_text(ids[0])


def test_token_bytes_agree_with_decode_on_any_ids(smollm: TextModel) -> None:
    # Arbitrary id sequences, including lone continuation bytes and specials: the byte table
    # must reproduce the Rust decoder, replacement characters included.
    import random

    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(smollm.vocab_size) for _ in range(rng.randrange(1, 12))]
        joined = b"".join(smollm.token_bytes(i) for i in ids)
        assert joined.decode("utf-8", errors="replace") == smollm.decode(ids)


def test_out_of_vocabulary_ids_are_rejected(smollm: TextModel) -> None:
    with pytest.raises(InvalidArgument):
        smollm.decode([5, smollm.vocab_size])
    with pytest.raises(InvalidArgument):
        smollm.token_bytes(-1)


def test_encode_is_thread_safe(smollm: TextModel) -> None:
    texts = [f"{t} #{i}" * 50 for i, t in enumerate(ROUND_TRIP_TEXTS * 8)]
    serial = [smollm.encode(t) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(smollm.encode, texts)) == serial
