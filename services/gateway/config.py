"""Gateway configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from services.common.service_settings import drain_timeout_setting
from services.common.settings import at_least, check_settings, read_settings, setting
from services.gateway.api_keys import KeyLimits, KeyRing, load_key_ring
from services.gateway.listen_socket import DEFAULT_SEND_BUFFER_BYTES
from services.gateway.request_limits import RequestLimits

PROG = "python -m services.gateway"
_LIMITS = RequestLimits()  # the defaults of the request limits below
_UNLIMITED_DEFAULT = "for keys that set no such limit; 0 = unlimited"


def _redis_failure_mode(mode: str) -> str | None:
    return None if mode in ("open", "closed") else "must be 'open' or 'closed'"


def _truthy(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = setting("--host", env="GATEWAY_HOST", default="127.0.0.1")
    http_port: int = setting("--http-port", env="HTTP_PORT", default=8000)
    grpc_port: int = setting("--grpc-port", env="GRPC_PORT", default=50051)
    tokenizer: str = setting("--tokenizer", env="TOKENIZER_ADDRESS", default="127.0.0.1:50059")
    # From the environment only: a flag would show the keys in `ps`.
    api_keys: tuple[str, ...] = setting(env="API_KEYS", default=(), repr=False)
    api_keys_file: str | None = setting(
        "--api-keys-file",
        env="API_KEYS_FILE",
        help="a TOML file of hashed keys with per-key limits (see services/gateway/api_keys.py); "
        "adds to LAYERSERVE_API_KEYS",
    )
    redis_url: str = setting(  # "" = rate limits and usage kept in this process only
        "--redis-url",
        env="REDIS_URL",
        default="",
        repr=False,  # may hold a password
        help="Redis for rate limits and usage shared by every gateway replica",
    )
    rate_limit_on_redis_failure: str = setting(
        "--rate-limit-on-redis-failure",
        env="RATE_LIMIT_ON_REDIS_FAILURE",
        default="open",
        check=_redis_failure_mode,
        help="'open': admit requests unlimited while Redis is unreachable; 'closed': refuse "
        "them (503)",
    )
    default_requests_per_minute: int = setting(
        "--default-requests-per-minute",
        env="DEFAULT_REQUESTS_PER_MINUTE",
        default=0,
        help=_UNLIMITED_DEFAULT,
    )
    default_tokens_per_minute: int = setting(
        "--default-tokens-per-minute",
        env="DEFAULT_TOKENS_PER_MINUTE",
        default=0,
        help=_UNLIMITED_DEFAULT,
    )
    default_max_concurrent: int = setting(
        "--default-max-concurrent", env="DEFAULT_MAX_CONCURRENT", default=0, help=_UNLIMITED_DEFAULT
    )
    max_inflight: int = setting(  # requests in flight across all keys; 0 = unbounded
        "--max-inflight", env="MAX_INFLIGHT", default=1024
    )
    # The request limits: RequestLimits checks them (and names the field in its message).
    max_body_bytes: int = setting(
        "--max-body-bytes", env="MAX_BODY_BYTES", default=_LIMITS.max_body_bytes
    )
    max_prompt_tokens: int = setting("--max-prompt-tokens", env="MAX_PROMPT_TOKENS", default=0)
    max_tokens: int = setting("--max-tokens", env="MAX_TOKENS", default=0)
    max_n: int = setting("--max-n", env="MAX_N", default=_LIMITS.max_n)
    max_stop_sequences: int = setting(
        "--max-stop-sequences",
        env="MAX_STOP_SEQUENCES",
        default=_LIMITS.max_stop_sequences,
        help="stop strings per request",
    )
    max_stop_length: int = setting(
        "--max-stop-length",
        env="MAX_STOP_LENGTH",
        default=_LIMITS.max_stop_length,
        help="characters of one stop string",
    )
    max_stop_token_ids: int = setting(
        "--max-stop-token-ids",
        env="MAX_STOP_TOKEN_IDS",
        default=_LIMITS.max_stop_token_ids,
        help="stop_token_ids per request",
    )
    max_request_tokens: int = setting(
        "--max-request-tokens",
        env="MAX_REQUEST_TOKENS",
        default=_LIMITS.max_request_tokens,
        help="n x max_tokens of one request; also what it reserves against its key's "
        "tokens_per_minute",
    )
    default_max_tokens: int = setting(
        "--default-max-tokens",
        env="DEFAULT_MAX_TOKENS",
        default=_LIMITS.default_max_tokens,
        help="max_tokens of a chat or gRPC request that sets none (fewer when the prompt "
        "leaves less room)",
    )
    max_bytes_per_token: int = setting(
        "--max-bytes-per-token",
        env="MAX_BYTES_PER_TOKEN",
        default=_LIMITS.max_bytes_per_token,
        help="UTF-8 bytes of the longest token: a prompt of more than max_prompt_tokens (else "
        "the context length) times this is refused untokenized",
    )
    stalled_client_seconds: float = setting(
        "--stalled-client-seconds",
        env="STALLED_CLIENT_SECONDS",
        default=_LIMITS.stalled_client_seconds,
        help="a stream whose client takes nothing for this long is cut off and aborted",
    )
    max_messages: int = setting(
        "--max-messages",
        env="MAX_MESSAGES",
        default=_LIMITS.max_messages,
        help="messages of one chat request, empty ones included",
    )
    max_tools: int = setting(
        "--max-tools",
        env="MAX_TOOLS",
        default=_LIMITS.max_tools,
        help="tools of one request, and tool calls of one assistant message",
    )
    max_content_parts: int = setting(
        "--max-content-parts",
        env="MAX_CONTENT_PARTS",
        default=_LIMITS.max_content_parts,
        help="parts of one message's content array",
    )
    http_idle_timeout_s: float = setting(
        "--http-idle-timeout-s",
        env="HTTP_IDLE_TIMEOUT_S",
        default=_LIMITS.http_idle_timeout_s,
        help="an HTTP connection without a whole request head this long after it opened or "
        "after its last response is closed (idle and slow-header connections alike); on the "
        "gRPC port, the handshake's limit and an idle connection's",
    )
    http_body_timeout_s: float = setting(
        "--http-body-timeout-s",
        env="HTTP_BODY_TIMEOUT_S",
        default=_LIMITS.http_body_timeout_s,
        help="a request body not received whole this long after its head gets 408",
    )
    send_buffer_bytes: int = setting(  # see listen_socket.py for the default
        "--send-buffer-bytes",
        env="SEND_BUFFER_BYTES",
        default=DEFAULT_SEND_BUFFER_BYTES,
        check=at_least(0),
        help="each HTTP connection's kernel send buffer (SO_SNDBUF), so that a client that "
        "stops reading blocks a write soon and is cut off; 0 = the kernel's own, autotuned",
    )
    drain_timeout_s: float = drain_timeout_setting()
    # Prompts and completions in the log: only when the operator asks. From the environment
    # only, read as before: 1, true or yes (any case) turn it on.
    log_prompts: bool = setting(env="LOG_PROMPTS", default=False, parse=_truthy)
    # Built from the settings above by __post_init__.
    keys: KeyRing = dataclasses.field(init=False, repr=False, compare=False)
    limits: RequestLimits = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        defaults = KeyLimits(
            self.default_requests_per_minute,
            self.default_tokens_per_minute,
            self.default_max_concurrent,
        )
        keys = load_key_ring(list(self.api_keys), self.api_keys_file, defaults)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "limits", self._request_limits())
        check_settings(self)

    def _request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_body_bytes=self.max_body_bytes,
            max_prompt_tokens=self.max_prompt_tokens,
            max_tokens=self.max_tokens,
            max_n=self.max_n,
            max_stop_sequences=self.max_stop_sequences,
            max_request_tokens=self.max_request_tokens,
            default_max_tokens=self.default_max_tokens,
            max_stop_length=self.max_stop_length,
            max_stop_token_ids=self.max_stop_token_ids,
            max_bytes_per_token=self.max_bytes_per_token,
            stalled_client_seconds=self.stalled_client_seconds,
            max_messages=self.max_messages,
            max_tools=self.max_tools,
            max_content_parts=self.max_content_parts,
            http_idle_timeout_s=self.http_idle_timeout_s,
            http_body_timeout_s=self.http_body_timeout_s,
        )

    @property
    def rate_limit_fail_open(self) -> bool:
        return self.rate_limit_on_redis_failure == "open"

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> GatewayConfig:
        """The config from `argv` (default: sys.argv[1:]) and the environment. A value that is
        refused exits as argparse does for a bad flag: the message on stderr, status 2."""
        try:
            return cls(**read_settings(cls, argv, prog=PROG))
        except ValueError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
