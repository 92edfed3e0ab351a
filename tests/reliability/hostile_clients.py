"""Issues 17 and 27's probes of the front door, as docs/reliability.md's "Hostile clients"
table: what each did before (measured on a stack started by `make run`, as the issues report,
unless the row says otherwise) and what the test that now guards it asserts. The figures of the
stalled-client rows come from their records in the same run
(tests/reliability/test_stalled_clients.py)."""

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
    (
        "issue 27: 4 gzip bodies of 1 MB that inflate to 1 GiB; the same without a valid key",
        "inflated on the event loop past the body limit: 413 after 6-13 s, RSS +80 MiB, every "
        "other client blocked meanwhile; 401 after 7 s",
        "aiohttp inflates nothing: a gzip or deflate body is read as sent (at most "
        "LAYERSERVE_MAX_BODY_BYTES), only after the key is checked, and inflated in a thread "
        "up to the body limit, then 413 (in the test: 0.2 CPU s for the 5 bodies, 3.0 s "
        "before); a bad key's 401 inflates nothing; other codings are 415; on the gRPC port a "
        "gzip message is bounded by the receive limit once inflated (RESOURCE_EXHAUSTED)",
        "tests/unit/gateway/test_hostile_connections.py",
    ),
    (
        "issue 27: large tools, tool-call arguments or names beside a 2-character message; "
        "250,000 empty messages",
        "neither reserved nor guarded: two requests of a 1,000 tokens/minute key admitted and "
        "charged ~9,800 tokens; 2.75 M tokens of tools tokenized, then 400 after 6-9 s; "
        "14 s and +95 MiB",
        "the size guard and the reservation count all the template renders (each message, "
        "tool call and tool at least one token): 400 naming messages before tokenizing, or "
        "429; messages, tools, content parts and one turn's tool calls are counted before "
        "anything is built (LAYERSERVE_MAX_MESSAGES 2048, LAYERSERVE_MAX_TOOLS 128, "
        "LAYERSERVE_MAX_CONTENT_PARTS 256): 400 naming the field and the limit; HTTP and gRPC "
        "alike",
        "tests/unit/gateway/test_hostile_door.py",
    ),
    (
        "issue 27: 2 concurrent chats with max_tokens 8000 on a 1,000 tokens/minute key",
        "the first admitted, 8,000 tokens generated (the bucket in debt by one request)",
        '429 "Request too large" naming the limit and the request\'s size, no Retry-After '
        "(waiting never makes it fit), over HTTP and gRPC; a key is admitted only while its "
        "bucket holds the whole reservation, so no key spends more than its budget (beyond "
        "what the prompt estimate misses)",
        "tests/unit/gateway/test_hostile_door.py, tests/unit/gateway/test_hostile_clients.py",
    ),
    (
        "issue 27: `priority` 2^31-1 from any key",
        "jumped every other tenant's queue; their running requests became the preemption victims",
        "400 naming priority over the key's max_priority (keys file; default 0: a key may only "
        "lower its own priority; without keys, any); the gRPC API carries no priority",
        "tests/unit/gateway/test_hostile_door.py",
    ),
    (
        "issue 27: 200 connections sending their request head a byte a second; a body a byte "
        "a second; the same at the gRPC port",
        "HTTP: all still open after 10 s; gRPC (measured in the test): a silent connection "
        "open beyond 8 s",
        "closed LAYERSERVE_HTTP_IDLE_TIMEOUT_S (5 s) after opening or after the last response, "
        "idle ones too; a body not whole within LAYERSERVE_HTTP_BODY_TIMEOUT_S (30 s) is a "
        "408; the gRPC port closes a connection without a handshake, or without a call, after "
        "the same 5 s",
        "tests/unit/gateway/test_hostile_connections.py",
    ),
    (
        "issue 27: an 8 MiB JSON body of 250,000 empty messages, or of millions of empty lists",
        "parsed by json.loads on the event loop: 1.2 s and 2.8 s (1M lists) with every other "
        "client waiting",
        "a body over 64 KiB is parsed in a child process and refused (400) past 262,144 JSON "
        "values, so what comes back to the gateway is bounded; smaller bodies are parsed inline "
        "(milliseconds). Measured in CPU time of the loop's thread: 2.8 M empty lists 0.04 s "
        "(1.7 s for json.loads there); in the test, 0.5 M: 0.03 s (0.6 s), 5 small chats "
        "served meanwhile",
        "tests/unit/gateway/test_hostile_bodies.py",
    ),
    (
        "issue 27: a response_format JSON schema whose $defs refer to each other a few thousand "
        "deep (under 200 KB); the same in tools[].function.parameters, over gRPC "
        "(sampling.structured), or as a Lark grammar of thousands of chained rules; an 8 MB "
        "regex; (a{1000}){1000}; a huge enum or GBNF grammar",
        "the gateway died (SIGSEGV in llguidance's grammar check; the tokenizer runs the same "
        "check), every stream in flight lost; grammars compiled on the event loop: 429s of an "
        "over-limit key and other keys' requests waited 7 s, the 8 MB regex 400 after 9 s",
        "400 (INVALID_ARGUMENT) naming the field and the LAYERSERVE_GRAMMAR_* limit (bytes, "
        "depth following $ref, rules, enum values and choices, nested repetitions), checked "
        "before llguidance; the compile runs in a grammar process under "
        "LAYERSERVE_GRAMMAR_TIMEOUT_S, after admission, off the event loop, in the gateway, "
        "the tokenizer and the worker; a crash there costs that request, the process is "
        "replaced",
        "tests/unit/common/test_grammar_pool.py, tests/unit/common/test_grammar_limits.py, "
        "tests/unit/gateway/test_tools_sdk.py",
    ),
    (
        "issue 27: `make test` with the machine busy: 100 streaming clients of 8,000 tokens "
        "that stop reading",
        "gateway +98.7 MiB against the test's 64 MiB bound (passes alone); beside a CPU hog, "
        "+55 and +68 MiB",
        "at most mux.MAX_BATCH outputs per session message (one message of 47,300 outputs, "
        "4 MB, was parsed at once) and a request stopped upstream once its reader leaves over "
        "1,024 tokens unread: +21 MiB beside a CPU hog in the test itself; bound 48 MiB",
        "tests/reliability/test_stalled_clients.py, tests/unit/common/test_outbox.py, "
        "tests/unit/gateway/test_backpressure.py",
    ),
    (
        "issue 27: LAYERSERVE_SPECULATION_POLICY=bogus, LAYERSERVE_HTTP_PORT=abc, "
        "LAYERSERVE_LOG_LEVEL=loud, a bad flag, for any service or the launcher",
        "a Python traceback naming the flag, not the variable",
        "one line naming the variable (or flag), its value and what is allowed; exit status 2",
        "tests/unit/test_setting_errors.py",
    ),
]


def section() -> list[str]:
    lines = [
        "## Hostile clients",
        "",
        "Issues 17 and 27's probes: what each did before, and what its test now asserts.",
        "",
        "| probe | before | after | checked by |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {p} | {b} | {a} | `{t}` |" for p, b, a, t in ROWS]
    return lines
