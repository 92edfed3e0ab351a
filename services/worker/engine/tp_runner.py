"""One rank's engine in a tensor-parallel worker: a ModelRunner that runs rank 0's plans.

Rank 0 is the worker the scheduler talks to. Its execute() first broadcasts the plan to the
other ranks, which run the same plan through the same ModelRunner code: every rank holds the
same sequence state and block tables, and its own slice of the model and of the KV cache (its
KV heads, in the same blocks). Only rank 0 samples; it broadcasts the tokens, and the other
ranks append them to their sequences, so every rank feeds the same tokens to the next step.

Plans and tokens travel over a gloo group on the CPU (they are Python objects and a few
integers), the model's all-reduces over the default group (NCCL on CUDA, gloo on the CPU)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import Sampled, StepPlan
from services.worker.engine.sampler import SampleOutput
from services.worker.engine.sequences import SequenceState
from services.worker.engine.spec_verify import DraftRows
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import LoadedModel

_SAMPLING_FAILED = -1  # broadcast instead of tokens when rank 0's sampler raised


class TensorParallelRunner(ModelRunner):
    def __init__(
        self,
        loaded: LoadedModel,
        kv_cache: PagedKVCache,
        *,
        rank: int,
        world_size: int,
        control: dist.ProcessGroup,
        on_close: Callable[[], None] | None = None,
        **runner_args,
    ) -> None:
        """loaded: this rank's shard (tensor_parallel.shard_model); kv_cache: sized with its
        KV heads; control: the gloo group for plans and tokens; on_close: runs after close()
        told the other ranks to stop (rank 0: wait for them). runner_args go to ModelRunner."""
        super().__init__(loaded, kv_cache, **runner_args)
        self._rank = rank
        self._world_size = world_size
        self._control = control
        self._on_close = on_close
        # execute() runs on the model thread, close() at shutdown: never both at once, or
        # the ranks would see a stop in the middle of a step.
        self._lock = threading.Lock()
        self._closed = False

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def tensor_parallel_size(self) -> int:
        return self._world_size

    def execute(self, plan: StepPlan) -> list[Sampled]:
        """Rank 0: runs one step on every rank; see ModelRunner.execute."""
        if self._rank != 0:
            raise RuntimeError("only rank 0 takes plans; the other ranks run follow()")
        with self._lock:
            if self._closed:
                raise RuntimeError("the tensor-parallel group has been closed")
            _broadcast_plan(plan, self._control)
            return super().execute(plan)

    def follow(self) -> None:
        """Ranks 1..N-1: runs rank 0's plans until it closes the group. Raises when rank 0 is
        gone (the broadcast fails) or a step fails here: this rank is then out of step and
        must exit. A plan that fails validation fails on rank 0 too, which reports it."""
        while (plan := _broadcast_plan(None, self._control)) is not None:
            try:
                super().execute(plan)
            except ValueError:
                pass

    def close(self) -> None:
        """Rank 0: tells the other ranks to stop, then runs on_close. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._rank == 0:
                _broadcast_plan(None, self._control)  # None: stop
        if self._on_close is not None:
            self._on_close()

    def _sample(self, logits: torch.Tensor, states: list[SequenceState]) -> list[Sampled]:
        """Rank 0 samples and broadcasts the tokens; the other ranks take them."""
        if self._rank == 0:
            try:
                results = super()._sample(logits, states)
            except BaseException:
                self._broadcast_tokens(torch.full((len(states),), _SAMPLING_FAILED))
                raise
            self._broadcast_tokens(torch.tensor([r.token_id for r in results]))
            return results
        tokens = torch.empty(len(states), dtype=torch.int64)
        self._broadcast_tokens(tokens)
        if bool((tokens == _SAMPLING_FAILED).any()):
            raise RuntimeError("rank 0 failed to sample a step; this rank is out of step")
        token_ids = tokens.tolist()
        for state, token in zip(states, token_ids, strict=True):
            state.token_ids.append(token)
        return [Sampled(s.request_id, t) for s, t in zip(states, token_ids, strict=True)]

    def _draw(self, logits: torch.Tensor, rows: DraftRows) -> SampleOutput:
        """Speculative rows: rank 0 draws and broadcasts the tokens; every rank then keeps the
        same proposals (spec_verify.accept)."""
        count = len(rows.options)
        if self._rank == 0:
            try:
                out = super()._draw(logits, rows)
            except BaseException:
                self._broadcast_tokens(torch.full((count,), _SAMPLING_FAILED))
                raise
            self._broadcast_tokens(torch.tensor(out.token_ids))
            return out
        tokens = torch.empty(count, dtype=torch.int64)
        self._broadcast_tokens(tokens)
        if bool((tokens == _SAMPLING_FAILED).any()):
            raise RuntimeError("rank 0 failed to sample a step; this rank is out of step")
        return SampleOutput(tokens.tolist(), [None] * count, [[] for _ in range(count)])

    def _broadcast_tokens(self, tokens: torch.Tensor) -> None:
        """tokens: [N] int64 on the CPU; rank 0's values end up on every rank."""
        dist.broadcast(tokens, src=0, group=self._control)


def _broadcast_plan(plan: StepPlan | None, control: dist.ProcessGroup) -> StepPlan | None:
    """Rank 0 sends `plan` (None: stop); the others pass None and receive what it sent."""
    box: list[object] = [plan]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]  # type: ignore[return-value]
