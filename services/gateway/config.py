"""Gateway configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common.env import env_float, env_int, env_list, env_str
from services.common.serve import DEFAULT_DRAIN_TIMEOUT_S, add_drain_timeout_flag
from services.gateway.api_keys import KeyLimits, KeyRing, load_key_ring
from services.gateway.request_limits import RequestLimits


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str
    http_port: int
    grpc_port: int
    tokenizer: str
    keys: KeyRing
    redis_url: str  # "" = rate limits and usage kept in this process only
    rate_limit_fail_open: bool
    max_inflight: int  # requests in flight across all keys; 0 = unbounded
    limits: RequestLimits
    log_prompts: bool  # prompts and completions in the log: only when the operator asks
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, for requests in flight

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> GatewayConfig:
        p = argparse.ArgumentParser(prog="python -m services.gateway")
        p.add_argument("--host", default=env_str("GATEWAY_HOST", "127.0.0.1"))
        p.add_argument("--http-port", type=int, default=env_int("HTTP_PORT", 8000))
        p.add_argument("--grpc-port", type=int, default=env_int("GRPC_PORT", 50051))
        p.add_argument("--tokenizer", default=env_str("TOKENIZER_ADDRESS", "127.0.0.1:50059"))
        _key_flags(p)
        _limit_flags(p)
        add_drain_timeout_flag(p)
        a = p.parse_args(argv)
        defaults = KeyLimits(
            a.default_requests_per_minute, a.default_tokens_per_minute, a.default_max_concurrent
        )
        try:
            keys = load_key_ring(env_list("API_KEYS"), a.api_keys_file, defaults)
            limits = RequestLimits(
                max_body_bytes=a.max_body_bytes,
                max_prompt_tokens=a.max_prompt_tokens,
                max_tokens=a.max_tokens,
                max_n=a.max_n,
                max_stop_sequences=a.max_stop_sequences,
                max_request_tokens=a.max_request_tokens,
                default_max_tokens=a.default_max_tokens,
                max_stop_length=a.max_stop_length,
                max_stop_token_ids=a.max_stop_token_ids,
                max_bytes_per_token=a.max_bytes_per_token,
                stalled_client_seconds=a.stalled_client_seconds,
            )
        except ValueError as err:
            p.error(str(err))
        if not a.drain_timeout_s >= 0:
            p.error("--drain-timeout-s must be >= 0")
        if a.rate_limit_on_redis_failure not in ("open", "closed"):
            p.error("--rate-limit-on-redis-failure must be 'open' or 'closed'")
        return cls(
            host=a.host,
            http_port=a.http_port,
            grpc_port=a.grpc_port,
            tokenizer=a.tokenizer,
            keys=keys,
            redis_url=a.redis_url,
            rate_limit_fail_open=a.rate_limit_on_redis_failure == "open",
            max_inflight=a.max_inflight,
            limits=limits,
            log_prompts=env_str("LOG_PROMPTS", "0").lower() in ("1", "true", "yes"),
            drain_timeout_s=a.drain_timeout_s,
        )


def _key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api-keys-file",
        default=env_str("API_KEYS_FILE", "") or None,
        help="a TOML file of hashed keys with per-key limits (see services/gateway/api_keys.py); "
        "adds to LAYERSERVE_API_KEYS",
    )
    p.add_argument(
        "--redis-url",
        default=env_str("REDIS_URL", ""),
        help="Redis for rate limits and usage shared by every gateway replica",
    )
    p.add_argument(
        "--rate-limit-on-redis-failure",
        default=env_str("RATE_LIMIT_ON_REDIS_FAILURE", "open"),
        help="'open': admit requests unlimited while Redis is unreachable; 'closed': refuse "
        "them (503)",
    )
    for name in ("requests-per-minute", "tokens-per-minute", "max-concurrent"):
        env = "DEFAULT_" + name.upper().replace("-", "_")
        p.add_argument(
            f"--default-{name}",
            type=int,
            default=env_int(env, 0),
            help="for keys that set no such limit; 0 = unlimited",
        )


def _limit_flags(p: argparse.ArgumentParser) -> None:
    d = RequestLimits()
    p.add_argument("--max-inflight", type=int, default=env_int("MAX_INFLIGHT", 1024))
    p.add_argument(
        "--max-body-bytes", type=int, default=env_int("MAX_BODY_BYTES", d.max_body_bytes)
    )
    p.add_argument("--max-prompt-tokens", type=int, default=env_int("MAX_PROMPT_TOKENS", 0))
    p.add_argument("--max-tokens", type=int, default=env_int("MAX_TOKENS", 0))
    p.add_argument("--max-n", type=int, default=env_int("MAX_N", d.max_n))
    for name, text in (
        ("max-stop-sequences", "stop strings per request"),
        ("max-stop-length", "characters of one stop string"),
        ("max-stop-token-ids", "stop_token_ids per request"),
        (
            "max-request-tokens",
            "n x max_tokens of one request; also what it reserves against "
            "its key's tokens_per_minute",
        ),
        (
            "default-max-tokens",
            "max_tokens of a chat or gRPC request that sets none (fewer "
            "when the prompt leaves less room)",
        ),
        (
            "max-bytes-per-token",
            "UTF-8 bytes of the longest token: a prompt of more than "
            "max_prompt_tokens (else the context length) times this is refused untokenized",
        ),
    ):
        attr = name.replace("-", "_")
        env = attr.upper()
        p.add_argument(f"--{name}", type=int, default=env_int(env, getattr(d, attr)), help=text)
    p.add_argument(
        "--stalled-client-seconds",
        type=float,
        default=env_float("STALLED_CLIENT_SECONDS", d.stalled_client_seconds),
        help="a stream whose client takes nothing for this long is cut off and aborted",
    )
