"""How busy one worker is at this instant: what the router weighs, the Admin API lists and
GetStats reports. A snapshot: plain numbers, read from the worker's Scheduler on demand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    num_blocks: int
    free_blocks: int  # cached blocks nobody uses count as free
    num_running: int
    num_waiting: int
    num_requests: int  # running and waiting
    # Tokens its requests still have to compute (queued prompts, chunks, decodes); a request
    # not started yet counts as the tokens the router expected it to compute.
    pending_tokens: int
    num_steps: int
    num_preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_rejected: int
    num_expired: int
