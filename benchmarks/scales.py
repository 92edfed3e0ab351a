"""How big a `layerserve bench` run is: one Scale per name, from a smoke test (`tiny`) to the
project's full benchmark sizes (`full`: hours on the CPU box, minutes on a GPU). CPU-sized by
default: SmolLM2-135M in float32 decodes ~60 tok/s on two cores, so `small` finishes L2 and
L3 of one workload in a few minutes on a quiet machine.

- `tiny`: a smoke test (seconds per workload): a few requests of tens of tokens; the
  long-context workload is 4 streams of 96-192-token prompts.
- `small`: a 2-core CPU in minutes: 12 requests of up to a few hundred tokens; long-context is
  8 streams of 512-1024-token prompts (prefill runs at ~450 tok/s in float32 there, so one
  run's prompts take ~15 s).
- `full`: the project's sizes (docs/benchmarks.md's workloads a-e): 256 requests of
  100..1024 tokens; long-context is 64 streams of 1-2k-token prompts, 128 tokens out each.
- `small-16`, `small-64`: `small` with 16 and 64 `mixed` requests, all in flight at once
  (max_num_seqs 16 and 64), of shorter prompts, so the concurrency the issue-29 goal names
  finishes in minutes.

`single-stream` is the same at every scale but `tiny`: requests sent one at a time, each a
128-token prompt and 256 tokens out (what one user at a time gets: batch-1 decode)."""

from __future__ import annotations

from dataclasses import dataclass, replace

Range = tuple[int, int]  # inclusive bounds


@dataclass(frozen=True, slots=True)
class Scale:
    name: str
    requests: int  # per workload
    mixed_in: Range  # (a) prompt lengths, uniform
    mixed_out: Range  # (a) output lengths, uniform
    fixed: Range  # (b) (prompt length, output length)
    prefill_heavy: Range  # (c) (prompt length, output length)
    decode_heavy: Range  # (c) (prompt length, output length)
    prefix_len: int  # (d) tokens every prompt shares
    prefix_suffix: Range  # (d) each prompt's own tokens after the prefix, uniform
    prefix_out: int  # (d) output length
    long_streams: int  # (e) long-context: requests, all in flight at once (<= max_num_seqs)
    long_in: Range  # (e) prompt lengths, uniform
    long_out: int  # (e) output length
    single: Range  # single-stream: (prompt length, output length), one request at a time
    single_requests: int  # single-stream: requests, sent one after the other
    l1_batches: tuple[int, ...]
    l1_contexts: tuple[int, ...]
    l1_decode_steps: int
    concurrency: tuple[int, ...]  # L3 max-concurrency sweep
    rates: tuple[float, ...]  # L3 Poisson arrival rates, requests/s
    repeats: int  # each timed figure is the median of this many runs
    gate_prompts: int  # correctness gate: prompts compared with transformers
    gate_tokens: int  # ... for this many greedy tokens
    max_num_seqs: int  # engine's running requests and transformers' static batch (equal budgets)
    max_num_batched_tokens: int


SCALES = {
    "tiny": Scale(
        name="tiny", requests=4, mixed_in=(16, 48), mixed_out=(4, 8), fixed=(32, 8),
        prefill_heavy=(64, 2), decode_heavy=(16, 16), prefix_len=64, prefix_suffix=(8, 16),
        prefix_out=4, long_streams=4, long_in=(96, 192), long_out=4, single=(16, 8),
        single_requests=2, l1_batches=(1, 2),
        l1_contexts=(32,), l1_decode_steps=4,
        concurrency=(1, 4), rates=(2.0,), repeats=1, gate_prompts=2, gate_tokens=4,
        max_num_seqs=8, max_num_batched_tokens=512,
    ),
    "small": Scale(
        name="small", requests=12, mixed_in=(32, 256), mixed_out=(8, 48), fixed=(256, 32),
        prefill_heavy=(460, 16), decode_heavy=(128, 64), prefix_len=512, prefix_suffix=(16, 64),
        prefix_out=16, long_streams=8, long_in=(512, 1024), long_out=16, single=(128, 256),
        single_requests=1, l1_batches=(1, 8),
        l1_contexts=(128,), l1_decode_steps=8,
        concurrency=(1, 8), rates=(1.0,), repeats=3, gate_prompts=4, gate_tokens=16,
        max_num_seqs=16, max_num_batched_tokens=2048,
    ),
    # (a) 256 requests of 100..1024 in and out, (b) 1024/128, (c) ~460/16 and ~460/256,
    # (d) a 2k-token shared system prompt, (e) 64 streams of 1-2k-token prompts.
    "full": Scale(
        name="full", requests=256, mixed_in=(100, 1024), mixed_out=(100, 1024),
        fixed=(1024, 128), prefill_heavy=(460, 16), decode_heavy=(460, 256), prefix_len=2048,
        prefix_suffix=(32, 128), prefix_out=64, long_streams=64, long_in=(1024, 2048),
        long_out=128, single=(128, 256), single_requests=4, l1_batches=(1, 8, 32, 64),
        l1_contexts=(128, 1024), l1_decode_steps=32, concurrency=(1, 8, 32, 64, 256),
        rates=(1.0, 4.0, 16.0), repeats=3, gate_prompts=8, gate_tokens=16, max_num_seqs=64,
        max_num_batched_tokens=4096,
    ),
}  # fmt: skip
for _streams in (16, 64):  # all in flight at once: each request is a stream
    SCALES[f"small-{_streams}"] = replace(
        SCALES["small"], name=f"small-{_streams}", requests=_streams, mixed_in=(32, 128),
        mixed_out=(16, 48), max_num_seqs=_streams, concurrency=(_streams,),
    )  # fmt: skip


def scale_named(name: str) -> Scale:
    if name not in SCALES:
        raise ValueError(f"unknown scale {name!r}: choose from {', '.join(SCALES)}")
    return SCALES[name]
