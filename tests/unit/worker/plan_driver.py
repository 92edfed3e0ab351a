"""A tiny scheduler stand-in for tests: block allocation from a free list and StepPlans.

With several KV cache groups (the runner's kv_cache_groups), each sequence gets a table per
group; a sliding-window group's blocks wholly before the window of a step's first query are
dropped (-1) and returned to the free list, as the real scheduler does."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.sampling import SamplingOptions
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan


@dataclass
class Tracked:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingOptions
    num_computed: int = 0
    tables: list[list[int]] = field(default_factory=list)  # per KV cache group
    sent: bool = False  # the worker holds it

    @property
    def output(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


class Driver:
    """Schedules sequences on a ModelRunner like a scheduler would, chunking long prefills."""

    def __init__(self, runner: ModelRunner, chunk: int = 10_000) -> None:
        self.runner = runner
        self.chunk = chunk
        self.free = list(range(runner.num_blocks))
        self.windows = [g.window for g in runner.kv_cache_groups] or [None]
        self.seqs: dict[str, Tracked] = {}
        self.to_forget: list[str] = []
        self.peak_held = 0  # most blocks held at once, all groups together

    def add(
        self,
        request_id: str,
        prompt: list[int],
        sampling: SamplingOptions | None = None,
        *,
        cached_tables: list[list[int]] | None = None,
        num_cached: int = 0,
    ) -> None:
        """Queues a prompt; cached_tables (one per KV cache group) already hold the K/V of its
        first num_cached tokens."""
        seq = Tracked(request_id, list(prompt), len(prompt), sampling or SamplingOptions())
        seq.tables = [list(t) for t in cached_tables or [[] for _ in self.windows]]
        seq.num_computed = num_cached
        self.seqs[request_id] = seq

    @property
    def num_held(self) -> int:
        return self.runner.num_blocks - len(self.free)

    def preempt(self, request_id: str) -> None:
        """Frees the request's blocks; it is re-sent in full (prompt + output) later."""
        seq = self.seqs[request_id]
        self.free.extend(b for table in seq.tables for b in table if b != -1)
        seq.tables, seq.num_computed, seq.sent = [[] for _ in self.windows], 0, False
        self.to_forget.append(request_id)

    def _drop_outside_windows(self, seq: Tracked) -> None:
        size = self.runner.block_size
        for table, window in zip(seq.tables, self.windows, strict=True):
            if window is None:
                continue
            for index in range(max(seq.num_computed - window + 1, 0) // size):
                if table[index] != -1:
                    self.free.append(table[index])
                    table[index] = -1

    def _grow(self, seq: Tracked, upto: int) -> list[list[int]]:
        """Appends blocks to every group's table; returns them per group."""
        added = []
        for table in seq.tables:
            need = -(-upto // self.runner.block_size) - len(table)
            new = [self.free.pop(0) for _ in range(max(need, 0))]
            table.extend(new)
            added.append(new)
        self.peak_held = max(self.peak_held, self.num_held)
        return added

    def plan(self, max_new_tokens: int) -> StepPlan:
        plan = StepPlan(finished_ids=self.to_forget)
        self.to_forget = []
        for seq in self.seqs.values():
            if len(seq.output) >= max_new_tokens:
                continue
            num_new = min(self.chunk, len(seq.token_ids) - seq.num_computed)
            self._drop_outside_windows(seq)
            new_blocks = self._grow(seq, seq.num_computed + num_new)
            if not seq.sent:
                plan.new.append(
                    NewSequence(seq.request_id, list(seq.token_ids), seq.num_prompt_tokens,
                                seq.num_computed, num_new, [list(t) for t in seq.tables],
                                seq.sampling)
                )  # fmt: skip
                seq.sent = True
            else:
                plan.running.append(RunningSequence(seq.request_id, num_new, new_blocks))
            seq.num_computed += num_new
        return plan

    def step(self, max_new_tokens: int) -> bool:
        """One engine step; False when nothing was left to schedule."""
        plan = self.plan(max_new_tokens)
        if not (plan.new or plan.running or plan.finished_ids):
            return False
        for sampled in self.runner.execute(plan):
            self.seqs[sampled.request_id].token_ids.append(sampled.token_id)
        return True

    def run(self, max_new_tokens: int) -> dict[str, list[int]]:
        """Steps until every sequence has max_new_tokens outputs; returns them."""
        while self.step(max_new_tokens):
            pass
        return {rid: seq.output for rid, seq in self.seqs.items()}
