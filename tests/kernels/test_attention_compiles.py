"""The attention kernels compile for a Hopper GPU, checked on any machine (no device needed).

The CPU tests run the kernels in the interpreter, which accepts code the GPU compiler rejects;
this compiles every variant the host wrappers launch on CUDA (tests/kernels/attention_sm90.py)
in a process of its own, since this one may have TRITON_INTERPRET=1 set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_attention_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.attention_sm90"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = [line.split()[0] for line in result.stdout.splitlines()]
    assert compiled.count("decode_attention_kernel") == 4  # split or not, D 64 and 128
    assert compiled.count("decode_reduce_kernel") == 2
    assert compiled.count("prefill_attention_kernel") == 2
