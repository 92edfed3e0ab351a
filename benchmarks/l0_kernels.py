"""L0: the kernel benchmarks (benchmarks/kernels/), each in its own process. On a GPU they run
for real (GB/s and TFLOP/s against torch and the device's measured ceilings); on the CPU only
as a dry run in the Triton interpreter, on tiny shapes: that proves they run and agree with
torch, and its timings measure the interpreter, not a kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from benchmarks.progress import Progress

SCRIPTS = ("benchmarks.kernels.attention", "benchmarks.kernels.small_ops")
TIMEOUT_S = 600


def l0_runs() -> int:
    return len(SCRIPTS)


def run_l0(progress: Progress) -> dict:
    """{"dry_run": bool, "scripts": [{"module", "exit_code", "output"}]}: each script's own
    markdown tables as it printed them."""
    dry_run = not torch.cuda.is_available()
    env = dict(os.environ, TRITON_INTERPRET="1") if dry_run else dict(os.environ)
    scripts = []
    for module in SCRIPTS:
        progress.stage(f"L0 {module.rsplit('.', 1)[1]}" + (" (dry run)" if dry_run else ""))
        command = [sys.executable, "-m", module] + (["--dry-run"] if dry_run else [])
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=TIMEOUT_S
            )
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            code, output = None, f"timed out after {TIMEOUT_S} s"
        scripts.append({"module": module, "exit_code": code, "output": output.strip()})
        progress.advance()
    return {"dry_run": dry_run, "scripts": scripts}
