"""Two architectures served at once: SmolLM2 (Llama) and Gemma 3 270M (from its PyPI chunk
packages), listed by /v1/models and routed by the request's model name; Gemma's sliding-window
layers hand back the KV blocks their window has passed."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack
from services.stack_file import read_stack_file
from services.worker.model.packaged import packaged_path
from tests.e2e.conftest import API_KEY, GEMMA, GEMMA_BLOCK, GEMMA_NUM_BLOCKS, MODEL
from tests.e2e.helpers import sse_events

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONFIG_FILE = Path(__file__).parents[2] / "configs" / "smollm2-and-gemma3.toml"
NUM_BLOCKS, BLOCK = GEMMA_NUM_BLOCKS, GEMMA_BLOCK


@pytest.fixture
def both(smollm_and_gemma: Stack) -> Stack:
    """The package's stack of both models (tests/e2e/conftest.py), SmolLM2 greedy by default
    there: these tests give their temperature."""
    return smollm_and_gemma


def _complete(stack: Stack, model: str, prompt: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{stack.http_url}/v1/completions", json=body, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_models_lists_both_and_routes_by_name(both: Stack) -> None:
    listed = httpx.get(f"{both.http_url}/v1/models", headers=AUTH, timeout=30).json()
    assert {m["id"] for m in listed["data"]} >= {MODEL, GEMMA}
    prompt = "The capital of France is"
    answers = {name: _complete(both, name, prompt) for name in (MODEL, GEMMA)}
    for name, answer in answers.items():
        assert answer["model"] == name
        assert answer["choices"][0]["text"].strip(), f"{name} answered nothing"
    # Gemma's prompt is 6 tokens (<bos> + 5), SmolLM2's 5: each was tokenized by its own model.
    assert answers[GEMMA]["usage"]["prompt_tokens"] == 6
    assert answers[MODEL]["usage"]["prompt_tokens"] == 5
    assert answers[GEMMA]["choices"][0]["text"] != answers[MODEL]["choices"][0]["text"]


def test_gemma_chat_uses_its_turn_format(both: Stack) -> None:
    body = {
        "model": GEMMA,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = httpx.post(
        f"{both.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120
    )
    assert response.status_code == 200, response.text
    # <bos><start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n
    assert response.json()["usage"]["prompt_tokens"] == 12


def test_config_file_serves_both_models() -> None:
    """The shipped config points where `make install` joins the Gemma file (.venv/models)."""
    packaged_path(cache_dir=CONFIG_FILE.parents[1] / ".venv" / "models")
    stack_file = read_stack_file(CONFIG_FILE)
    assert [m.name for m in stack_file.models] == [MODEL, GEMMA]
    assert Path(stack_file.models[1].path or "").name == packaged_path().name


def test_gemma_serves_a_context_longer_than_its_blocks_would_hold_without_the_window(
    both: Stack,
) -> None:
    """A ~1,200-token prompt: all-layer blocks in the same memory would hold 880 tokens. While
    it decodes, the sliding groups hold about one window each, not the whole sequence; at the
    end every block is free again."""
    channel = grpc.insecure_channel(f"127.0.0.1:{both.config.scheduler_port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    def gemma_stats() -> scheduler_pb2.WorkerStats:
        request = scheduler_pb2.GetStatsRequest(model=GEMMA)
        return stub.GetStats(request, timeout=5).workers[0]

    prompt = " ".join(f"Note {i}: the ferry leaves the north pier at {i % 12 + 1} o'clock."
                      for i in range(72))  # fmt: skip
    body = {"model": GEMMA, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    url = f"{both.http_url}/v1/completions"
    held_while_decoding = []
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=300) as response:
        assert response.status_code == 200, response.read()
        events = list(_held_per_event(sse_events(response), gemma_stats, held_while_decoding))
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    num_prompt = usage["prompt_tokens"]
    assert 1000 < num_prompt < 1400 and usage["completion_tokens"] == 8
    assert num_prompt > 55 * BLOCK, "longer than all-layer blocks in this memory would hold"
    full = -(-(num_prompt + 8) // BLOCK)  # the global group's blocks at the end
    per_window = -(-(512 - 1) // BLOCK) + 1  # a sliding group's blocks while decoding
    assert held_while_decoding and max(held_while_decoding) <= full + 5 * per_window
    assert max(held_while_decoding) < 6 * (num_prompt // BLOCK), "sliding blocks were freed"
    after = gemma_stats()
    assert after.free_blocks == after.num_blocks == NUM_BLOCKS
    channel.close()


def _held_per_event(events, stats, held: list[int]):
    """Passes the stream's events through, noting the blocks the worker holds at each token."""
    for event in events:
        if isinstance(event, dict) and event.get("choices"):
            s = stats()
            held.append(s.num_blocks - s.free_blocks)
        yield event
