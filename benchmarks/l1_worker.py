"""L1: the worker's ModelRunner on one static batch, batch x context as the Scale says: prefill
latency (the whole batch's prompts in one step), per-step decode latency, and MBU = bytes one
decode step reads (weights + the KV of every sequence) / (step time x the copy bandwidth
measured at the start of the run). On CUDA also the device-busy share of the decode wall
time (torch.profiler); on the CPU the device is the CPU itself, so there is none."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.model_decode import _Batch, busy_share, kv_bytes, weight_bytes
from benchmarks.offline import BLOCK_SIZE, make_runner
from benchmarks.progress import Progress
from benchmarks.scales import Scale
from benchmarks.workload import VOCAB
from services.worker.model.loader import LoadedModel


@dataclass(frozen=True, slots=True)
class L1Plan:
    scale: Scale
    seed: int
    repeats: int

    def runs(self) -> int:
        return len(self.scale.l1_batches) * len(self.scale.l1_contexts) * self.repeats


def run_l1(plan: L1Plan, loaded: LoadedModel, copy_gb_s: float, progress: Progress) -> dict:
    """{"rows": [one per (batch, context)]}; each figure the median of `plan.repeats` runs."""
    s = plan.scale
    need = max(s.l1_batches) * (-(-(max(s.l1_contexts) + s.l1_decode_steps) // BLOCK_SIZE) + 1)
    runner = make_runner(loaded, need)
    device = str(loaded.model.embed_tokens.device)
    rng = random.Random(plan.seed)
    warm = _Batch(runner, [[rng.randint(*VOCAB) for _ in range(16)]], "l1-warm")
    warm.step()
    warm.finish()
    rows = []
    for batch in s.l1_batches:
        for context in s.l1_contexts:
            progress.stage(f"L1 batch {batch} context {context}")
            prompts = [[rng.randint(*VOCAB) for _ in range(context)] for _ in range(batch)]
            runs = []
            for r in range(plan.repeats):
                runs.append(
                    _one_run(
                        runner, prompts, s.l1_decode_steps, device, f"l1-{batch}-{context}-{r}"
                    )
                )
                progress.advance()
            rows.append(_row(loaded, runner, prompts, runs, copy_gb_s, s.l1_decode_steps))
    return {"rows": rows, "decode_steps": s.l1_decode_steps}


def _one_run(runner, prompts: list[list[int]], steps: int, device: str, tag: str) -> dict:
    _sync(device)
    started = time.perf_counter()
    batch = _Batch(runner, prompts, tag)  # the prefill step, every prompt at once
    _sync(device)
    prefill = time.perf_counter() - started
    step_times = []
    for _ in range(steps):
        started = time.perf_counter()
        batch.step()
        _sync(device)
        step_times.append(time.perf_counter() - started)
    batch.finish()
    return {"prefill_s": prefill, "step_s": statistics.median(step_times)}


def _row(loaded, runner, prompts, runs: list[dict], copy_gb_s: float, steps: int) -> dict:
    config, dtype = loaded.config, loaded.model.embed_tokens.dtype
    batch, context = len(prompts), len(prompts[0])
    step = statistics.median(r["step_s"] for r in runs)
    mean_context = context + steps / 2  # the KV a decode step reads grows by one per step
    step_bytes = weight_bytes(config, dtype) + kv_bytes(config, dtype, int(batch * mean_context))
    device = str(loaded.model.embed_tokens.device)
    share = None
    if device.startswith("cuda"):
        profiled = _Batch(runner, prompts, f"l1-prof-{batch}-{context}")
        share = busy_share(profiled.step, device, steps)
        profiled.finish()
    return {
        "batch": batch,
        "context": context,
        "prefill_ms": 1000 * statistics.median(r["prefill_s"] for r in runs),
        "decode_step_ms": 1000 * step,
        "decode_tok_s": batch / step,
        "step_GB": step_bytes / 1e9,
        "mbu": step_bytes / step / 1e9 / copy_gb_s,
        "busy_share": share,
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
