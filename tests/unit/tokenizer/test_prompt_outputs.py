"""The tokenizer's part of echo and prompt logprobs: the prompt's text and its tokens' logprobs
(with text) go out with the request's first output, once."""

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
    def abort(self, request_id: str) -> None:
        pass


def _output(prompt: list[int], token: int) -> scheduler_pb2.RequestOutput:
    scored = [common_pb2.TokenLogprob(token_id=t, logprob=-1.5) for t in prompt[1:]]
    output = scheduler_pb2.RequestOutput(request_id="r", token_ids=[token])
    output.prompt_logprobs.extend(scored)
    return output


def test_the_first_output_carries_the_prompt_once(smollm: TextModel) -> None:
    prompt = smollm.encode("The capital of France")
    outbox = _Outbox()
    stream = TextStream.create(smollm, prompt, [], True)
    sink = OutputSink(
        "r",
        "m",
        stream,
        outbox,  # type: ignore[arg-type]
        {"r"},
        _Mux(),
        echo_text="The capital of France",
        first_prompt_token=prompt[0],
    )
    token = smollm.encode(" is")[0]
    sink(_output(prompt, token))
    sink(_output(prompt, token))  # resumed on another replica: its prompt logprobs again
    first, second = outbox.items
    assert first.prompt_text == "The capital of France"
    texts = [lp.token for lp in first.prompt_logprobs]
    assert "".join(texts) == "The capital of France"
    assert [lp.logprob for lp in first.prompt_logprobs] == [0.0] + [-1.5] * (len(prompt) - 1)
    assert second.prompt_text == "" and not second.prompt_logprobs
