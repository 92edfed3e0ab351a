"""An embedding request (SamplingParams.pooling) ends once its prompt is computed: the
scheduler appends no token, sends the vector with no token ids, counts the prompt and no
generated token, and schedules nothing after its prompt, even a step ahead."""

from __future__ import annotations

from services.common.sampling import SamplingOptions
from services.scheduler.output import Output
from services.scheduler.request import FinishReason
from services.scheduler.scheduler import Sample
from tests.unit.scheduler.drive import make_request, make_scheduler

PROMPT = list(range(100, 110))  # 10 tokens: three chunks at a budget of 4


def _embedding(rid: str, max_tokens: int = 1):
    request = make_request(rid, PROMPT, max_tokens=max_tokens)
    request.sampling = SamplingOptions(pooling="last")
    return request


def test_an_embedding_ends_with_its_prompt_and_generates_nothing() -> None:
    sched = make_scheduler(budget=4)
    request = _embedding("e")
    sched.add(request)
    for _ in range(2):  # the prompt's first chunks sample nothing
        step = sched.schedule()
        assert [part.num_new for part in step.requests] == [4]
        assert sched.update([]) == []
    step = sched.schedule()
    assert [part.num_new for part in step.requests] == [2]
    (update,) = sched.update([Sample("e", 0, embedding=[0.6, 0.8])])
    assert request.finish_reason is FinishReason.STOP and request.output_token_ids == []
    output = Output.sampled(update.request, *update.samples)
    assert output.token_ids == [] and output.embedding == [0.6, 0.8]
    assert output.prompt_tokens == len(PROMPT)
    assert sched.stats.num_prompt_tokens == len(PROMPT)
    assert sched.stats.num_generation_tokens == 0
    assert sched.schedule().finished_ids == ["e"]  # the worker forgets it
    assert not sched.has_work()


def test_no_step_follows_the_prompt_while_its_result_is_in_flight() -> None:
    # Asynchronous scheduling: the next step is scheduled before the last one is back. A
    # generation request's placeholder token would be computed in it; an embedding has none.
    sched = make_scheduler()
    sched.add(_embedding("e", max_tokens=4))  # whatever its max_tokens says
    sched.add(make_request("g", [1, 2, 3], max_tokens=4))
    first = sched.schedule()
    assert {part.request.request_id for part in first.requests} == {"e", "g"}
    ahead = sched.schedule()
    assert [part.request.request_id for part in ahead.requests] == ["g"]
    updates = sched.update([Sample("e", 0, embedding=[1.0]), Sample("g", 7)])
    assert [u.request.output_token_ids for u in updates] == [[], [7]]
