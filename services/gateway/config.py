"""Gateway configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common.env import env_int, env_list, env_str
from services.gateway.api_keys import load_api_keys


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str
    http_port: int
    grpc_port: int
    tokenizer: str
    api_keys: frozenset[str]

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> GatewayConfig:
        p = argparse.ArgumentParser(prog="python -m services.gateway")
        p.add_argument("--host", default=env_str("GATEWAY_HOST", "127.0.0.1"))
        p.add_argument("--http-port", type=int, default=env_int("HTTP_PORT", 8000))
        p.add_argument("--grpc-port", type=int, default=env_int("GRPC_PORT", 50051))
        p.add_argument("--tokenizer", default=env_str("TOKENIZER_ADDRESS", "127.0.0.1:50059"))
        p.add_argument(
            "--api-keys-file",
            default=env_str("API_KEYS_FILE", "") or None,
            help="one key per line; adds to LAYERSERVE_API_KEYS",
        )
        a = p.parse_args(argv)
        keys = load_api_keys(env_list("API_KEYS"), a.api_keys_file)
        return cls(a.host, a.http_port, a.grpc_port, a.tokenizer, keys)
