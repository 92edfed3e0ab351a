"""Issue 17's probes of the front door, as docs/reliability.md's "Hostile clients" table: what
each did before (measured on a stack started by `make run`, as the issue reports) and what the
test that now guards it asserts. The figures of the stalled-client rows come from their records
in the same run (tests/reliability/test_stalled_clients.py)."""

from __future__ import annotations

# (probe, before, after, the test that fails on the old behaviour)
ROWS = [
    (
        "key with tokens_per_minute=1000, max_concurrent=2; 2 concurrent requests, max_tokens 8000",
        "both 200, 16,000 tokens used; key free again after 61 s",
        "prompt + n x max_tokens reserved at admission: the first is admitted, the second gets "
        "429 at once; the real count is settled at the end; max_concurrent holds across "
        "gateway replicas through Redis leases that expire if a gateway dies",
        "tests/unit/gateway/test_hostile_clients.py",
    ),
    (
        "chat, n=16, no max_tokens",
        "200, 130,576 completion tokens, 509 KB, 11.7 s",
        "at most 16 x 1,024 (LAYERSERVE_DEFAULT_MAX_TOKENS) tokens; n x max_tokens over "
        "LAYERSERVE_MAX_REQUEST_TOKENS (32,768) is a 400 naming max_tokens",
        "tests/unit/gateway/test_hostile_clients.py",
    ),
    (
        "streaming clients (n=16, no max_tokens; and 100 of 8,000 tokens) that stop reading",
        "gateway RSS +215 to +400 MB in 25 s, still rising, not returned after close",
        "a bounded send buffer makes the stall visible, queued deltas merge per choice, and "
        "after LAYERSERVE_STALLED_CLIENT_SECONDS the client is cut off and its request aborted "
        "(KV freed): see the two stalled-client sections below for this run's figures",
        "tests/reliability/test_stalled_clients.py, tests/unit/gateway/test_backpressure.py",
    ),
    (
        "`model` holding a newline and a forged log line; a 7 MB model name",
        "a forged log line; a 7 MB log line and a 7 MB 404 body",
        "400 naming model (1-256 visible ASCII characters), a message under 300 characters; "
        "untrusted text logged escaped and cut at 500 characters",
        "tests/unit/gateway/test_hostile_clients.py",
    ),
    (
        'gRPC Generate: role "evil", stop [""], a 20 MB prompt',
        "OK, OK, tokenized for 20.9 s before a 400",
        "INVALID_ARGUMENT naming messages[0].role and stop, as HTTP's 400 does (one validator; "
        "400 generated requests get the same answer on both); RESOURCE_EXHAUSTED from the "
        "public port's receive limit, which is the HTTP body limit",
        "tests/unit/gateway/test_front_end_parity.py",
    ),
    (
        "7.8 MB prompt over HTTP",
        "5.2 s of tokenizer CPU, then 400",
        "400 naming the prompt before anything is tokenized (bytes over the prompt limit x "
        "the longest token's bytes)",
        "tests/unit/gateway/test_hostile_clients.py",
    ),
    (
        "kill the Redis that `make run` started",
        "the launcher stopped the whole stack",
        "the launcher starts it again with backoff; requests keep being served meanwhile "
        "(rate limits fail open by default)",
        "tests/reliability/test_launcher.py",
    ),
    (
        "internal ports bound to 0.0.0.0 without mutual TLS",
        "anyone reaching the scheduler or tokenizer submitted with any tenant",
        "every internal rpc but health checks needs the internal token (UNAUTHENTICATED "
        "otherwise); a non-loopback bind with neither token nor mutual TLS refuses to start",
        "tests/reliability/test_launcher.py, tests/unit/common/test_internal_auth.py",
    ),
    (
        "`Authorization: bearer k`; `Content-Type: text/plain`; a 1 MB stop string; "
        "thousands of stop_token_ids",
        "401; 200; 200; 200",
        "accepted; 415; 400 naming stop; 400 naming stop_token_ids",
        "tests/unit/gateway/test_hostile_clients.py",
    ),
]


def section() -> list[str]:
    lines = [
        "## Hostile clients",
        "",
        "Issue 17's probes: what each did before, and what its test now asserts.",
        "",
        "| probe | before | after | checked by |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {p} | {b} | {a} | `{t}` |" for p, b, a, t in ROWS]
    return lines
