"""A grammar process: `python -m services.common.grammar_child READ_FD WRITE_FD`, started and
fed by grammar_pool.py. It checks one grammar at a time with llguidance, so that a grammar that
crashes the engine (or runs away) costs this process, never the service that sent it.

Messages (pickled over the two pipes), each answered by one reply (and ("ok", "ready") once the
process has imported llguidance):
    ("vocabulary", key, tokenizer_json, eos_token_ids, vocab_size) -> ("ok", "")
    ("check", StructuredOutput, param, GrammarSettings, key | None)  -> ("ok", "") or
                                                                        ("invalid", message)
The process ends when its parent closes the pipe (or dies)."""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from services.common.errors import InvalidArgument


def serve(requests: Connection, replies: Connection) -> None:
    from services.common.grammar_limits import check_grammar_limits
    from services.common.structured_output import check_structured, grammar_tokenizer

    vocabularies: dict[int, Any] = {}
    replies.send(("ok", "ready"))  # imports done: the time budget counts compiles only
    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):
            return
        if message[0] == "vocabulary":
            _, key, tokenizer_json, eos, size = message
            vocabularies[key] = grammar_tokenizer(tokenizer_json, eos, size)
            replies.send(("ok", ""))
            continue
        _, structured, param, limits, key = message
        try:
            check_grammar_limits(structured, limits, param)
            check_structured(structured, vocabularies.get(key), param)
        except InvalidArgument as err:
            replies.send(("invalid", err.message))
        else:
            replies.send(("ok", ""))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    requests = Connection(int(sys.argv[1]), writable=False)
    replies = Connection(int(sys.argv[2]), readable=False)
    serve(requests, replies)


if __name__ == "__main__":
    main()
