"""The tokenizer names the stop string that ended a request (GenerateOutput.stop_sequence), so
that the Anthropic API can say stop_reason "stop_sequence"; an output ended otherwise names none."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from services.tokenizer.output_sink import OutputSink
from services.tokenizer.text_model import TextModel
from services.tokenizer.text_stream import TextStream


class _Outbox:
    def __init__(self) -> None:
        self.items: list = []

    def put(self, output) -> None:
        self.items.append(output)


class _Mux:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _run(smollm: TextModel, stop: list[str], text: str, finish: int) -> list:
    outbox, mux = _Outbox(), _Mux()
    stream = TextStream.create(smollm, smollm.encode("Hi"), stop, True)
    sink = OutputSink("r", "m", stream, outbox, {"r"}, mux)  # type: ignore[arg-type]
    ids = smollm.encode(text)
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        reason = finish if last else common_pb2.FINISH_REASON_UNSPECIFIED
        sink(scheduler_pb2.RequestOutput(request_id="r", token_ids=[token], finish_reason=reason))
    return outbox.items


def test_the_stop_string_that_ended_the_output_is_named(smollm: TextModel) -> None:
    outputs = _run(
        smollm, ["END", " Lyon"], "Paris and Lyon and more", common_pb2.FINISH_REASON_LENGTH
    )
    assert outputs[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert outputs[-1].stop_sequence == " Lyon"
    assert "".join(o.text for o in outputs) == "Paris and"
    assert all(not o.stop_sequence for o in outputs[:-1])


def test_an_output_ended_otherwise_names_none(smollm: TextModel) -> None:
    outputs = _run(smollm, ["END"], "Paris and Lyon", common_pb2.FINISH_REASON_STOP)
    assert outputs[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert outputs[-1].stop_sequence == ""
