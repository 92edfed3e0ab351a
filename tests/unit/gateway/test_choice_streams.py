"""Fan-in of n choices and the coalescing of queued deltas."""

from __future__ import annotations

import asyncio

from services.common.errors import Unavailable
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.gateway.backend import GenerationDelta, GenerationRequest, TokenLogprob
from services.gateway.choice_streams import ChoiceStreams, coalesce, merge_deltas
from tests.unit.gateway.echo_backend import MODEL, EchoBackend


def _request(i: int, prompt: str, **fields: object) -> GenerationRequest:
    return GenerationRequest(request_id=f"r-{i}", model=MODEL, prompt=prompt, **fields)


def _lp(token: str) -> TokenLogprob:
    return TokenLogprob(token, token.encode(), -1.0)


def test_merge_keeps_order_and_running_totals() -> None:
    a = GenerationDelta("a", [1], [_lp("a")], None, prompt_tokens=4, completion_tokens=1)
    b = GenerationDelta("b", [2], None, None, prompt_tokens=4, completion_tokens=2)
    c = GenerationDelta(
        "c", [3], [_lp("c")], "stop", prompt_tokens=4, completion_tokens=3, cached_tokens=2
    )
    merged = merge_deltas([a, b, c])
    assert (merged.text, merged.token_ids, merged.finish_reason) == ("abc", [1, 2, 3], "stop")
    assert [lp.token for lp in merged.logprobs or []] == ["a", "c"]
    assert (merged.prompt_tokens, merged.completion_tokens, merged.cached_tokens) == (4, 3, 2)


def test_coalesce_groups_per_choice_and_stops_at_an_error() -> None:
    d = lambda text: GenerationDelta(text, [0])  # noqa: E731
    error = Unavailable("gone")
    merged, err = coalesce([(0, d("a")), (1, d("x")), (0, d("b")), (1, error), (0, d("c"))])
    assert {i: m.text for i, m in merged.items()} == {0: "ab", 1: "x"}
    assert list(merged) == [0, 1] and err is error


async def test_a_slow_reader_gets_everything_queued_in_one_batch() -> None:
    backend = EchoBackend()
    words = " ".join(f"w{i}" for i in range(40))
    streams = ChoiceStreams(
        backend, [_request(i, words, max_tokens=MaxTokens(40)) for i in range(2)]
    )
    await asyncio.sleep(0.05)  # the "client" is busy; both choices run to the end meanwhile
    batch = await streams.next_batch()
    assert streams.finished
    merged, error = coalesce(batch)
    assert error is None and set(merged) == {0, 1}
    assert all(m.text == words and m.finish_reason == "stop" for m in merged.values())
    assert all(m.completion_tokens == 40 for m in merged.values())


async def test_close_aborts_running_choices() -> None:
    backend = EchoBackend(token_delay=0.01)
    requests = [_request(i, "a b", max_tokens=MaxTokens(1000), ignore_eos=True) for i in range(3)]
    streams = ChoiceStreams(backend, requests)
    first = await streams.first_batch()
    assert {i for i, _ in first} == {0, 1, 2}
    streams.close()
    await asyncio.sleep(0.05)
    assert sorted(backend.aborted) == ["r-0", "r-1", "r-2"]
    assert sorted(backend.finalized) == ["r-0", "r-1", "r-2"]


async def test_seeded_choices_differ() -> None:
    backend = EchoBackend()
    requests = [_request(i, "a b c", sampling=SamplingOptions(seed=i)) for i in range(2)]
    streams = ChoiceStreams(backend, requests)
    items = []
    while not streams.finished:
        items += await streams.next_batch()
    merged, _ = coalesce(items)
    assert merged[0].text == "a b c" and merged[1].text == "b c a"
