"""`python -m services.gateway.keygen NAME`: a new API key, and its entry for the keys file.

The key is printed once; only its SHA-256 goes into the file (see api_keys.py).
"""

from __future__ import annotations

import argparse
import secrets

from services.gateway.api_keys import hash_key


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m services.gateway.keygen", description=__doc__)
    p.add_argument("name", help="a label for the key (logs and usage show it, never the key)")
    p.add_argument("--requests-per-minute", type=int, default=0)
    p.add_argument("--tokens-per-minute", type=int, default=0)
    p.add_argument("--max-concurrent", type=int, default=0)
    p.add_argument("--models", nargs="*", help="the models the key may use (default: all)")
    a = p.parse_args(argv)
    key = "ls-" + secrets.token_urlsafe(32)
    lines = [
        "[[keys]]",
        f'name = "{a.name}"',
        f'sha256 = "{hash_key(key)}"',
        f"requests_per_minute = {a.requests_per_minute}",
        f"tokens_per_minute = {a.tokens_per_minute}",
        f"max_concurrent = {a.max_concurrent}",
    ]
    if a.models:
        lines.append("models = [" + ", ".join(f'"{m}"' for m in a.models) + "]")
    print(f"# API key (shown once; give it to the client): {key}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
