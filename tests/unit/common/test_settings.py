"""The config helper: a flag wins over its LAYERSERVE_* variable, which wins over the default;
values parse by the field's annotation; a bad value says which flag and variable it came from."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.settings import (
    SettingError,
    at_least,
    check_settings,
    in_range,
    positive,
    read_settings,
    setting,
)


def _name(spec: str) -> tuple[str, str]:
    name, _, value = spec.partition("=")
    if not name:
        raise ValueError(f"--pair needs a name: {spec!r}")
    return name, value


@dataclass(frozen=True, slots=True)
class Demo:
    port: int = setting("--port", env="DEMO_PORT", default=8000, check=positive)
    ratio: float = setting("--ratio", env="DEMO_RATIO", default=0.5, check=in_range(0, 1))
    host: str = setting("--host", env="DEMO_HOST", default="127.0.0.1")
    size: int | None = setting("--size", env="DEMO_SIZE")  # None: the device's default
    path: str | None = setting("--path", env="DEMO_PATH")
    mode: str = setting("--mode", env="DEMO_MODE", default="fast", choices=("fast", "slow"))
    cache: bool = setting("--cache", env="DEMO_CACHE", default=True)
    dry_run: bool = setting("--dry-run", default=False, negatable=False)
    peers: tuple[str, ...] = setting("--peer", env="DEMO_PEERS", default=("a:1",))
    pairs: tuple[tuple[str, str], ...] = setting(
        "--pair", env="DEMO_PAIRS", default=(), parse=_name
    )
    secret: str = setting(env="DEMO_SECRET", default="", repr=False)
    copies: int = setting("--copies", env="DEMO_COPIES", default=1, check=at_least(1))

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_args(cls, argv: list[str]) -> Demo:
        return cls(**read_settings(cls, argv, prog="demo"))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "RATIO", "HOST", "SIZE", "PATH", "MODE", "CACHE", "PEERS", "PAIRS"):
        monkeypatch.delenv(f"LAYERSERVE_DEMO_{name}", raising=False)
    monkeypatch.delenv("LAYERSERVE_DEMO_SECRET", raising=False)
    monkeypatch.delenv("LAYERSERVE_DEMO_COPIES", raising=False)


def test_flag_over_variable_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Demo.from_args([]).port == 8000
    monkeypatch.setenv("LAYERSERVE_DEMO_PORT", "9000")
    assert Demo.from_args([]).port == 9000
    assert Demo.from_args(["--port", "9100"]).port == 9100
    monkeypatch.setenv("LAYERSERVE_DEMO_PORT", "")  # empty: unset
    assert Demo.from_args([]).port == 8000


def test_numbers_parse_and_a_bad_variable_names_itself_and_its_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAYERSERVE_DEMO_RATIO", "0.25")
    assert Demo.from_args([]).ratio == 0.25
    monkeypatch.setenv("LAYERSERVE_DEMO_PORT", "eighty")
    with pytest.raises(
        ValueError, match=r"LAYERSERVE_DEMO_PORT must be an integer, got 'eighty'.*--port"
    ):
        Demo.from_args([])
    # Even when a flag overrides it: a variable that does not parse is a mistake to report.
    with pytest.raises(ValueError, match="LAYERSERVE_DEMO_PORT"):
        Demo.from_args(["--port", "1"])
    monkeypatch.delenv("LAYERSERVE_DEMO_PORT")
    monkeypatch.setenv("LAYERSERVE_DEMO_RATIO", "half")
    with pytest.raises(
        ValueError, match=r"LAYERSERVE_DEMO_RATIO must be a number, got 'half'.*--ratio"
    ):
        Demo.from_args([])


def test_a_bad_flag_value_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        Demo.from_args(["--port", "eighty"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == "demo: error: argument --port: must be an integer, got 'eighty'\n"


def test_checks_name_the_flag_or_the_variable_the_value_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match=r"^--port must be positive, got 0$"):
        Demo.from_args(["--port", "0"])
    monkeypatch.setenv("LAYERSERVE_DEMO_RATIO", "2")
    with pytest.raises(
        SettingError,
        match=r"^LAYERSERVE_DEMO_RATIO=2.0: must be in 0..1, got 2.0 \(the variable of --ratio\)$",
    ):
        Demo.from_args([])
    with pytest.raises(ValueError, match=r"^--copies must be >= 1, got 0$"):
        Demo(copies=0)


def test_choices_are_offered_by_the_flag_and_checked_from_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Demo.from_args(["--mode", "slow"]).mode == "slow"
    with pytest.raises(SystemExit):
        Demo.from_args(["--mode", "warp"])
    monkeypatch.setenv("LAYERSERVE_DEMO_MODE", "warp")
    with pytest.raises(
        SettingError, match=r"^LAYERSERVE_DEMO_MODE=warp: must be one of \('fast', 'slow'\)"
    ):
        Demo.from_args([])


def test_optional_values_unset_by_an_empty_or_zero_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = Demo.from_args([])
    assert config.size is None and config.path is None
    monkeypatch.setenv("LAYERSERVE_DEMO_SIZE", "0")  # 0: "unset", the device's default
    monkeypatch.setenv("LAYERSERVE_DEMO_PATH", "")
    config = Demo.from_args([])
    assert config.size is None and config.path is None
    monkeypatch.setenv("LAYERSERVE_DEMO_SIZE", "12")
    monkeypatch.setenv("LAYERSERVE_DEMO_PATH", "/m")
    assert (Demo.from_args([]).size, Demo.from_args([]).path) == (12, "/m")
    assert Demo.from_args(["--size", "0"]).size == 0  # a flag means what it says


def test_a_string_variable_may_be_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_DEMO_HOST", "")
    assert Demo.from_args([]).host == ""


def test_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Demo.from_args([]).cache is True
    assert Demo.from_args(["--no-cache"]).cache is False
    monkeypatch.setenv("LAYERSERVE_DEMO_CACHE", "0")
    assert Demo.from_args([]).cache is False
    assert Demo.from_args(["--cache"]).cache is True
    monkeypatch.setenv("LAYERSERVE_DEMO_CACHE", "2")
    assert Demo.from_args([]).cache is True
    monkeypatch.setenv("LAYERSERVE_DEMO_CACHE", "maybe")
    with pytest.raises(ValueError, match="LAYERSERVE_DEMO_CACHE must be an integer, got 'maybe'"):
        Demo.from_args([])
    monkeypatch.delenv("LAYERSERVE_DEMO_CACHE")
    assert Demo.from_args(["--dry-run"]).dry_run is True
    with pytest.raises(SystemExit):
        Demo.from_args(["--no-dry-run"])  # negatable=False: no such flag


def test_lists_repeat_the_flag_or_split_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Demo.from_args([]).peers == ("a:1",)
    monkeypatch.setenv("LAYERSERVE_DEMO_PEERS", " b:2, ,c:3,")
    assert Demo.from_args([]).peers == ("b:2", "c:3")
    assert Demo.from_args(["--peer", "d:4", "--peer", "e:5"]).peers == ("d:4", "e:5")
    assert Demo.from_args(["--pair", "x=1", "--pair", "y"]).pairs == (("x", "1"), ("y", ""))
    monkeypatch.setenv("LAYERSERVE_DEMO_PAIRS", "z=2")
    assert Demo.from_args([]).pairs == (("z", "2"),)
    with pytest.raises(ValueError, match="--pair needs a name: '=3'"):
        Demo.from_args(["--pair", "=3"])


def test_a_secret_comes_from_the_environment_only_and_stays_out_of_repr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LAYERSERVE_DEMO_SECRET", "hunter2")
    config = Demo.from_args([])
    assert config.secret == "hunter2"
    assert "hunter2" not in repr(config)
    with pytest.raises(SystemExit):
        Demo.from_args(["--secret", "x"])
    capsys.readouterr()


def test_a_setting_needs_a_flag_or_a_variable() -> None:
    with pytest.raises(TypeError):
        setting(default=1)
