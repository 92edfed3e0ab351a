"""An operator's bad setting, flag or variable, in any service or the launcher: one line on
stderr naming the variable (or flag), its value and what is allowed, exit status 2, no
traceback (issue 27: LAYERSERVE_SPECULATION_POLICY=bogus stopped the stack with a traceback
naming the flag, not the variable)."""

from __future__ import annotations

import os
import subprocess
import sys

# (module, arguments, variable, value, what the message must say)
CASES = [
    ("services.scheduler", [], "SPECULATION_POLICY", "bogus", "must be one of ('adaptive'"),
    ("services.gateway", [], "HTTP_PORT", "abc", "must be an integer, got 'abc'"),
    ("services.tokenizer", [], "LOG_LEVEL", "loud", "must be one of DEBUG, INFO"),
    ("services.worker", ["--null"], "GRAMMAR_TIMEOUT_S", "soon", "must be a number, got 'soon'"),
    ("services.worker", ["--null"], "GRPC_KEEPALIVE_S", "x", "must be a number, got 'x'"),
    ("services.launcher", [], "GRPC_PORT", "5005l", "must be an integer, got '5005l'"),
    ("services.scheduler", ["--max-num-seqs", "x"], "", "", "--max-num-seqs: must be an integer"),
]  # fmt: skip


def test_each_bad_setting_is_one_line_and_status_2() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAYERSERVE_")}
    runs = []
    for module, args, variable, value, _ in CASES:
        env = {**base, f"LAYERSERVE_{variable}": value} if variable else base
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", module, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for run, (module, _, variable, value, allowed) in zip(runs, CASES, strict=True):
        out, err = run.communicate(timeout=120)
        lines = (out + err).strip().splitlines()
        assert run.returncode == 2, (module, lines)
        assert len(lines) == 1 and "Traceback" not in err, (module, lines)
        if variable:
            assert f"LAYERSERVE_{variable}" in lines[0] and value in lines[0], lines
        assert allowed in lines[0], lines
