"""Prompt logprobs and embeddings at the scheduler: a request that needs every prompt position
computed reads no prefix from the cache, and what the worker sends with its first token goes
to the client once (a recomputation after preemption sends it again; it is dropped)."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from services.common.sampling import SamplingOptions
from services.scheduler.output import Output
from services.scheduler.output_proto import output_to_proto
from services.scheduler.scheduler import Sample
from tests.unit.scheduler.drive import make_request, make_scheduler, run_step

SHARED = list(range(100, 108))  # two full blocks of 4


def test_prompt_logprobs_and_mean_pooling_read_no_cached_prefix() -> None:
    for sampling, expected in (
        (SamplingOptions(prompt_logprobs=1), 0),
        (SamplingOptions(pooling="mean"), 0),
        (SamplingOptions(pooling="last"), 8),  # only the last position is read
        (SamplingOptions(), 8),
    ):
        sched = make_scheduler()
        sched.add(make_request("a", SHARED + [1], max_tokens=1))
        run_step(sched)  # a's two full blocks join the cache
        request = make_request("b", SHARED + [2], max_tokens=1)
        request.sampling = sampling
        sched.add(request)
        (new,) = sched.schedule().new
        assert new.num_cached == expected, sampling


def test_what_comes_with_the_first_token_goes_out_once() -> None:
    request = make_request("r", SHARED, max_tokens=4)
    scored = [common_pb2.TokenLogprob(token_id=t, logprob=-1.0) for t in SHARED[1:]]
    first = Sample("r", 7, prompt_logprobs=list(scored), embedding=[0.6, 0.8])
    message = output_to_proto(Output.sampled(request, first))
    assert list(message.prompt_logprobs) == scored
    assert [round(x, 6) for x in message.embedding] == [0.6, 0.8]
    again = output_to_proto(Output.sampled(request, first))  # recomputed after a preemption
    assert not again.prompt_logprobs and not again.embedding
