"""The gateway's flags and LAYERSERVE_* variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.gateway.api_keys import hash_key
from services.gateway.config import GatewayConfig


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("LAYERSERVE_"):
            monkeypatch.delenv(name)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """from_args exits as argparse does for a bad value; returns the message."""
    with pytest.raises(SystemExit) as exited:
        GatewayConfig.from_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip()


def test_defaults() -> None:
    config = GatewayConfig.from_args([])
    assert (config.host, config.http_port, config.grpc_port) == ("127.0.0.1", 8000, 50051)
    assert config.tokenizer == "127.0.0.1:50059"
    assert not config.keys.enabled and config.redis_url == ""
    assert config.rate_limit_fail_open and config.max_inflight == 1024
    assert config.limits.max_n == 16 and config.limits.stalled_client_seconds == 30.0
    assert config.drain_timeout_s == 30.0 and config.log_prompts is False
    assert config.send_buffer_bytes == 256 * 1024


def test_flags_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_HTTP_PORT", "9000")
    monkeypatch.setenv("LAYERSERVE_MAX_N", "3")
    monkeypatch.setenv("LAYERSERVE_STALLED_CLIENT_SECONDS", "2.5")
    monkeypatch.setenv("LAYERSERVE_RATE_LIMIT_ON_REDIS_FAILURE", "closed")
    config = GatewayConfig.from_args([])
    assert (config.http_port, config.limits.max_n) == (9000, 3)
    assert config.limits.stalled_client_seconds == 2.5 and not config.rate_limit_fail_open
    config = GatewayConfig.from_args(["--http-port", "9001", "--max-n", "4"])
    assert (config.http_port, config.limits.max_n) == (9001, 4)


def test_keys_from_the_environment_and_a_file_with_the_default_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[[keys]]\nname = "k"\nsha256 = "{hash_key("filed")}"\n')
    monkeypatch.setenv("LAYERSERVE_API_KEYS", "a, b,,")
    config = GatewayConfig.from_args(
        ["--api-keys-file", str(keys_file), "--default-tokens-per-minute", "50"]
    )
    assert len(config.keys) == 3
    filed = config.keys.find("filed")
    assert filed is not None and filed.limits.tokens_per_minute == 50
    assert config.keys.find("b") is not None and config.keys.find("c") is None
    assert "'a'" not in repr(config)  # keys stay out of the repr (and so out of logs)


def test_log_prompts_reads_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, on in (("1", True), ("TRUE", True), ("yes", True), ("2", False), ("0", False)):
        monkeypatch.setenv("LAYERSERVE_LOG_PROMPTS", raw)
        assert GatewayConfig.from_args([]).log_prompts is on, raw


def test_refused_values_name_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = "python -m services.gateway: error: "
    assert _refused(["--max-n", "0"], capsys) == prefix + "max_n must be at least 1"
    assert _refused(["--max-tokens", "-1"], capsys) == (
        prefix + "max_tokens must be 0 (no limit) or positive"
    )
    assert _refused(["--stalled-client-seconds", "0"], capsys) == (
        prefix + "stalled_client_seconds must be positive"
    )
    assert _refused(["--drain-timeout-s", "-1"], capsys).startswith(
        prefix + "--drain-timeout-s must be >= 0"
    )
    assert _refused(["--rate-limit-on-redis-failure", "maybe"], capsys) == (
        prefix + "--rate-limit-on-redis-failure must be 'open' or 'closed'"
    )
    assert _refused(["--send-buffer-bytes", "-1"], capsys) == (
        prefix + "--send-buffer-bytes must be >= 0, got -1"
    )
    assert _refused(["--api-keys-file", "/nonexistent.toml"], capsys) == (
        prefix + "API keys file /nonexistent.toml does not exist"
    )
    monkeypatch.setenv("LAYERSERVE_API_KEYS", "a,a")
    assert _refused([], capsys) == prefix + "the same API key is configured twice"
    monkeypatch.setenv("LAYERSERVE_API_KEYS", "")
    monkeypatch.setenv("LAYERSERVE_MAX_N", "many")
    assert "LAYERSERVE_MAX_N must be an integer, got 'many'" in _refused([], capsys)


def test_a_config_built_directly_is_checked_too() -> None:
    with pytest.raises(ValueError, match="^max_n must be at least 1$"):
        GatewayConfig(max_n=0)
    with pytest.raises(ValueError, match="^--rate-limit-on-redis-failure must be"):
        GatewayConfig(rate_limit_on_redis_failure="ajar")


def test_the_doors_counts_and_timeouts(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("LAYERSERVE_MAX_MESSAGES", "10")
    monkeypatch.setenv("LAYERSERVE_HTTP_IDLE_TIMEOUT_S", "2.5")
    config = GatewayConfig.from_args(["--max-tools", "3", "--http-body-timeout-s", "7"])
    limits = config.limits
    assert (limits.max_messages, limits.max_tools, limits.max_content_parts) == (10, 3, 256)
    assert (limits.http_idle_timeout_s, limits.http_body_timeout_s) == (2.5, 7.0)
    assert "max_content_parts must be at least 1" in _refused(["--max-content-parts", "0"], capsys)
    assert "http_idle_timeout_s must be positive" in _refused(
        ["--http-idle-timeout-s", "0"], capsys
    )
