"""Stop strings over streamed deltas."""

from __future__ import annotations

import random

import pytest

from services.tokenizer.detokenizer import IncrementalDetokenizer
from services.tokenizer.stop import StopChecker
from services.tokenizer.text_model import TextModel


def _run(stops: list[str], deltas: list[str]) -> tuple[str, bool, list[str]]:
    """Feed deltas until finished; returns (all emitted text, finished, emitted pieces)."""
    checker = StopChecker(stops)
    pieces = []
    for delta in deltas:
        piece, finished = checker.feed(delta)
        pieces.append(piece)
        if finished:
            return "".join(pieces), True, pieces
    pieces.append(checker.flush())
    return "".join(pieces), False, pieces


def test_stop_split_across_deltas() -> None:
    text, finished, pieces = _run(["STOP"], ["abc S", "T", "O", "P and more"])
    assert (text, finished) == ("abc ", True)
    assert pieces == ["abc ", "", "", ""]  # "S", "ST", "STO" were held back


def test_stop_inside_one_delta_drops_the_rest() -> None:
    assert _run(["\n\n"], ["line one\n\nline two"])[:2] == ("line one", True)


def test_partial_match_released_when_disproved() -> None:
    text, finished, pieces = _run(["STOP"], ["ab ST", "x"])
    assert (text, finished) == ("ab STx", False)
    assert pieces[0] == "ab "


def test_flush_releases_held_text_at_end() -> None:
    checker = StopChecker(["</answer>"])
    assert checker.feed("42 </ans") == ("42 ", False)
    assert checker.flush() == "</ans"


def test_multiple_stops_earliest_wins() -> None:
    assert _run(["world", "lo w"], ["hello", " world"])[:2] == ("hel", True)
    assert _run(["bb", "abc"], ["xab", "bc"])[:2] == ("xa", True)


def test_after_finishing_nothing_more_is_emitted() -> None:
    checker = StopChecker(["x"])
    assert checker.feed("ax") == ("a", True)
    assert checker.matched == "x"
    assert checker.feed("more") == ("", True)
    assert checker.flush() == ""


def test_no_or_empty_stops_pass_everything() -> None:
    for stops in ([], [""]):
        checker = StopChecker(stops)
        assert checker.feed("abc") == ("abc", False)
        assert checker.flush() == ""


@pytest.mark.parametrize("seed", range(30))
def test_random_splits_equal_cutting_the_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    stops = ["<end>", "ee", "dd"]
    text = "".join(rng.choice("abde<>n") for _ in range(60))
    cuts = sorted(rng.sample(range(len(text)), 8))
    deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    assert _run(stops, deltas)[:2] == (expected, bool(hits))


def test_stop_split_across_tokens(smollm: TextModel) -> None:
    # The stop string spans several tokens (and a multi-byte character) of real output.
    ids = smollm.encode("The answer is 42. 🦀 Done, really.")
    detok, checker = IncrementalDetokenizer(smollm), StopChecker(["🦀 Done"])
    emitted, finished = [], False
    for token_id in ids:
        piece, finished = checker.feed(detok.add([token_id]))
        emitted.append(piece)
        if finished:
            break
    assert finished
    assert "".join(emitted) == "The answer is 42. "
