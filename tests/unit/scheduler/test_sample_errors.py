"""A sequence the worker could not sample (its output constraint failed) ends with the worker's
error; the rest of the step is applied as usual."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from layerserve.worker.v1 import worker_pb2
from services.common.errors import InvalidArgument, code_number
from services.scheduler.request import FinishReason
from services.scheduler.worker_link import result_from_proto
from tests.unit.scheduler.test_scheduler import make_request, make_scheduler


def test_the_error_travels_from_the_wire_and_ends_only_its_request():
    sched = make_scheduler()
    sched.add(make_request("bad", prompt_len=4))
    sched.add(make_request("good", prompt_len=4))
    sched.schedule()
    wire = worker_pb2.StepResult(step_id=1)
    error = InvalidArgument("does not compile")
    wire.sampled.add(request_id="bad", token_id=0).error.CopyFrom(
        common_pb2.Status(code=code_number(error), message=error.message)
    )
    wire.sampled.add(request_id="good", token_id=7)
    updates = {u.request.request_id: u for u in sched.update(result_from_proto(wire).samples)}
    bad, bad_sample, good = (
        updates["bad"].request,
        updates["bad"].samples[0],
        updates["good"].request,
    )
    assert bad.finish_reason is FinishReason.ERROR and bad.output_token_ids == []
    assert isinstance(bad.error, InvalidArgument) and bad.error.message == "does not compile"
    assert bad_sample.error is bad.error  # the engine emits it as the request's failure
    assert good.finish_reason is None and good.output_token_ids == [7]
    assert sched.kv.pool.num_free == sched.kv.pool.num_blocks - 1  # bad's block came back
