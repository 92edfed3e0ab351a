"""Two architectures served at once: SmolLM2 (Llama) and Gemma 3 270M (from its PyPI chunk
packages), listed by /v1/models and routed by the request's model name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.stack import Stack
from services.stack_file import ModelSpec, read_stack_file
from services.worker.model.packaged import packaged_path
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack

pytestmark = pytest.mark.e2e
GEMMA = "gemma3-270m"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONFIG_FILE = Path(__file__).parents[2] / "configs" / "smollm2-and-gemma3.toml"


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("gemma3-logs")
    config = loopback_config(
        worker_ports=tuple(free_ports(2)),
        models=(ModelSpec(MODEL), ModelSpec(GEMMA, str(packaged_path()))),
        worker_args=["--num-blocks", "128", "--max-model-len", "2048"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY},
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


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
