"""The stack config file: models, replicas and worker flags, and what the launcher makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.launcher import parse_args
from services.stack_file import ModelSpec, read_stack_file

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "two-models.toml"


def test_example_config_places_a_worker_per_replica() -> None:
    config = parse_args(["--config", str(EXAMPLE), "--internal-port-base", "51000"])
    assert (config.tokenizer_port, config.scheduler_port) == (51000, 51001)
    placed = [(spec.name, port) for spec, port in config.placements()]
    assert placed == [("smollm2-135m-instruct", 51002), ("smollm2-135m-instruct-bf16", 51003)]
    assert config.aliases_file == EXAMPLE


def test_relative_paths_and_replicas(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "stack.toml").write_text(
        """
[[models]]
name = "a"
replicas = 2

[[models]]
name = "b"
path = "ckpt"
worker_args = ["--num-blocks", "64"]
"""
    )
    file = read_stack_file(tmp_path / "stack.toml")
    assert file.models == (
        ModelSpec("a", None, 2),
        ModelSpec("b", str(tmp_path / "ckpt"), 1, ("--num-blocks", "64")),
    )
    config = parse_args(["--config", str(tmp_path / "stack.toml")])
    assert [s.name for s, _ in config.placements()] == ["a", "a", "b"]


def test_without_config_one_model_as_before() -> None:
    config = parse_args(["--workers", "2", "--model-name", "m", "--embedding-model", "off"])
    assert [(s.name, p) for s, p in config.placements()] == [("m", 50061), ("m", 50062)]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("", "at least one"),
        ('[[models]]\nname = "a"\n[[models]]\nname = "a"', "given twice"),
        ('[[models]]\nname = "a"\nreplicas = 0', "replicas"),
        ('[[models]]\nname = "a"\npath = "nowhere.gguf"', "does not exist"),
        ('[[models]]\nname = "a"\nwokrer_args = []', "only the keys"),
        ('[[models]]\nname = "a"\n[aliases.a]\nweights = { "a" = 1 }', "model's name"),
        ('[[model]]\nname = "a"', "unknown top-level"),
    ],
)
def test_malformed_files_are_refused_with_the_reason(tmp_path: Path, body: str, error: str):
    path = tmp_path / "stack.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match=error):
        read_stack_file(path)
