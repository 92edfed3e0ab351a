"""configs/smollm2-int8.toml: one checkpoint served in float32 and in int8 at once, under two
names, both answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.stack import Stack
from services.stack_file import read_stack_file
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.multi_model import AUTH, complete

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-int8.toml"
INT8 = "smollm2-135m-instruct-int8"


@pytest.fixture(scope="module")
def two_precisions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    file = read_stack_file(CONFIG)
    config = loopback_config(
        models=file.models,
        model_name=file.models[0].name,
        aliases_file=file.path,
        worker_ports=tuple(free_ports(2)),
        worker_args=["--num-blocks", "256"],
        log_dir=tmp_path_factory.mktemp("int8-logs"),
        env={"LAYERSERVE_API_KEYS": API_KEY},
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def test_both_precisions_are_listed(two_precisions: Stack) -> None:
    response = httpx.get(f"{two_precisions.http_url}/v1/models", headers=AUTH)
    assert response.status_code == 200, response.text
    assert {m["id"] for m in response.json()["data"]} == {MODEL, INT8, "smollm2-int8-canary"}


def test_each_worker_loaded_its_precision(two_precisions: Stack) -> None:
    log_dir = two_precisions.config.log_dir
    assert log_dir is not None
    loaded = {}  # model name -> the worker's "loaded ..." line
    for log in log_dir.glob("worker*.log"):
        line = next(x for x in log.read_text().splitlines() if " loaded smollm2" in x)
        loaded[line.split(" loaded ", 1)[1].split()[0]] = line
    assert "with int8 weights" in loaded[INT8]
    assert "int8" not in loaded[MODEL]


def test_both_precisions_answer(two_precisions: Stack) -> None:
    """int8 is checked for sense (greedy: the fact the float model also states), not for the
    float model's exact text."""
    for model in (MODEL, INT8):
        response = complete(two_precisions, model, "The capital of France is", max_tokens=8)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == model
        assert "Paris" in body["choices"][0]["text"], body
