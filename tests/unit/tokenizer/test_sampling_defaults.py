"""A model's recommended sampling settings: where they are read, and what they change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerserve.common.v1 import common_pb2
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.sampling_defaults import (
    NO_DEFAULTS,
    default_defaults_file,
    sampling_defaults_for,
)

ALL_UNSET = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _checkpoint(tmp_path: Path, generation: dict) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_a_checkpoint_recommends_what_its_generation_config_says(tmp_path: Path) -> None:
    generation = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                  "repetition_penalty": 1.05, "eos_token_id": [1, 2]}  # fmt: skip
    defaults = sampling_defaults_for(_checkpoint(tmp_path, generation), "/nonexistent.toml")
    assert defaults.given() == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }
    assert "generation_config.json" in defaults.describe()


def test_a_generation_config_without_sampling_values_recommends_nothing(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, {"bos_token_id": 1, "eos_token_id": 2})
    assert sampling_defaults_for(checkpoint, "/nonexistent.toml") == NO_DEFAULTS


def test_a_value_out_of_range_names_the_file_and_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation_config.json: temperature"):
        sampling_defaults_for(_checkpoint(tmp_path, {"temperature": 5}), "/nonexistent.toml")


def test_a_gguf_file_takes_the_first_entry_its_name_matches(tmp_path: Path) -> None:
    table = tmp_path / "defaults.toml"
    table.write_text(
        '[[gguf]]\nfile = "Other*.gguf"\ntemperature = 0.9\n'
        '[[gguf]]\nfile = "My-Model*.gguf"\ntemperature = 0.3\nmin_p = 0.05\n'
        '[[gguf]]\nfile = "*.gguf"\ntemperature = 1.5\n'
    )
    defaults = sampling_defaults_for(tmp_path / "My-Model.Q4_0.gguf", table)
    assert defaults.given() == {"temperature": 0.3, "min_p": 0.05}
    assert sampling_defaults_for(tmp_path / "x.gguf", table).given() == {"temperature": 1.5}


def test_an_unknown_setting_in_the_table_is_an_error(tmp_path: Path) -> None:
    table = tmp_path / "defaults.toml"
    table.write_text('[[gguf]]\nfile = "*.gguf"\ntemprature = 0.3\n')
    with pytest.raises(ValueError, match="unknown setting 'temprature'"):
        sampling_defaults_for(tmp_path / "m.gguf", table)


def test_the_embedded_model_recommends_its_model_cards_settings() -> None:
    model = load_tokenizer(None, default_defaults_file())
    assert model.sampling_defaults.given() == {"temperature": 0.2, "top_p": 0.9}


def test_only_fields_the_client_left_out_take_the_defaults() -> None:
    model = load_tokenizer(None, default_defaults_file())
    sent = common_pb2.SamplingParams(temperature=1.0, top_p=1.0, seed=7)
    applied = model.sampling_defaults.apply(sent, ["top_p", "top_k"])
    assert (applied.temperature, round(applied.top_p, 6), applied.top_k) == (1.0, 0.9, 0)
    assert applied.seed == 7 and sent.top_p == 1.0  # the request's own message is untouched
    everything = model.sampling_defaults.apply(common_pb2.SamplingParams(), ALL_UNSET)
    assert round(everything.temperature, 6) == 0.2


def test_off_reads_no_defaults() -> None:
    assert TokenizerConfig(generation_config="off").defaults_file() is None
    assert load_tokenizer(None, None).sampling_defaults == NO_DEFAULTS
    assert TokenizerConfig().defaults_file() == str(default_defaults_file())
