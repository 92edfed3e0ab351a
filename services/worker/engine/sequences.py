"""What the worker remembers about each request between steps, and the plan checks that must
pass before a step touches that state or the KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidArgument
from services.common.sampling import SamplingOptions
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan


@dataclass(slots=True)
class SequenceState:
    request_id: str
    token_ids: list[int]  # prompt, then every token generated so far (sampled ones appended)
    num_prompt_tokens: int
    num_computed: int  # tokens whose K/V are in the cache
    block_tables: list[list[int]]  # per KV cache group, its block table in sequence order
    sampling: SamplingOptions
    # Until the first token is sampled (then sent with it): the prompt tokens' logprobs
    # (prompt_logprobs.py), the running sum of pooled rows [d] and the finished embedding
    # (pooling.py).
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    pooled_sum: Any = None  # torch.Tensor [d] float32 while a mean-pooled prompt is computed
    embedding: list[float] | None = None

    @classmethod
    def of(cls, seq: NewSequence) -> SequenceState:
        """A new sequence's state as the plan sends it (token ids and tables copied)."""
        return cls(
            request_id=seq.request_id,
            token_ids=list(seq.token_ids),
            num_prompt_tokens=seq.num_prompt_tokens,
            num_computed=seq.num_computed_tokens,
            block_tables=[list(table) for table in seq.block_tables],
            sampling=seq.sampling,
        )

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


@dataclass(frozen=True, slots=True)
class PlanLimits:
    block_size: int
    num_blocks: int
    max_model_len: int
    vocab_size: int
    windows: tuple[int | None, ...] = (None,)  # per KV cache group: its sliding window or None


def validate_plan(plan: StepPlan, held: Mapping[str, SequenceState], limits: PlanLimits) -> None:
    """Raises ValueError naming the first inconsistency; reads, never writes, the state."""
    finished = set(plan.finished_ids)
    new_ids: set[str] = set()
    for seq in plan.new:
        if seq.request_id in new_ids or (seq.request_id in held and seq.request_id not in finished):
            raise ValueError(f"new sequence {seq.request_id!r} is already held by the worker")
        new_ids.add(seq.request_id)
        _check_new(seq, limits)
    running_ids: set[str] = set()
    for diff in plan.running:
        rid = diff.request_id
        if rid not in held or rid in finished:
            raise ValueError(f"running sequence {rid!r} is unknown to the worker")
        if rid in running_ids or rid in new_ids:
            raise ValueError(f"sequence {rid!r} appears twice in the plan")
        running_ids.add(rid)
        _check_running(diff, held[rid], limits)


def _check_new(seq: NewSequence, limits: PlanLimits) -> None:
    rid, known = seq.request_id, len(seq.token_ids)
    if not 1 <= seq.num_prompt_tokens <= known:
        raise ValueError(f"{rid!r}: num_prompt_tokens {seq.num_prompt_tokens} not in [1, {known}]")
    if seq.num_computed_tokens < 0 or seq.num_new_tokens < 0:
        raise ValueError(f"{rid!r}: negative num_computed_tokens or num_new_tokens")
    bad_ids = [t for t in seq.token_ids if not 0 <= t < limits.vocab_size]
    if bad_ids:
        raise ValueError(f"{rid!r}: token id {bad_ids[0]} outside the vocabulary")
    try:
        seq.sampling.validate()
    except InvalidArgument as err:
        raise ValueError(f"{rid!r}: {err.message}") from None
    _check_group_count(rid, len(seq.block_tables), limits)
    tables = [(0, table) for table in seq.block_tables]
    _check_extent(rid, seq.num_computed_tokens, seq.num_new_tokens, known, tables, limits)


def _check_running(diff: RunningSequence, state: SequenceState, limits: PlanLimits) -> None:
    rid = diff.request_id
    if diff.num_new_tokens < 0:
        raise ValueError(f"{rid!r}: negative num_new_tokens {diff.num_new_tokens}")
    _check_group_count(rid, len(diff.new_block_tables), limits)
    # The held blocks were checked when they arrived: each step checks only what it appends.
    appended = zip(state.block_tables, diff.new_block_tables, strict=True)
    tables = [(len(held), new) for held, new in appended]
    known = len(state.token_ids) + len(diff.draft_token_ids)
    if diff.draft_token_ids:
        _check_drafts(diff, state, known, limits)
    _check_extent(rid, state.num_computed, diff.num_new_tokens, known, tables, limits)


def _check_drafts(
    diff: RunningSequence, state: SequenceState, known: int, limits: PlanLimits
) -> None:
    """Proposed tokens are real tokens, follow the known ones in a step that reaches their end
    (it samples), and never meet an output constraint (its matcher cannot take them back)."""
    rid = diff.request_id
    if state.num_computed + diff.num_new_tokens != known:
        raise ValueError(f"{rid!r}: draft tokens in a step that does not reach their end")
    bad_ids = [t for t in diff.draft_token_ids if not 0 <= t < limits.vocab_size]
    if bad_ids:
        raise ValueError(f"{rid!r}: draft token id {bad_ids[0]} outside the vocabulary")
    if state.sampling.structured is not None:
        raise ValueError(f"{rid!r}: draft tokens for a sequence with an output constraint")


def _check_group_count(rid: str, num_tables: int, limits: PlanLimits) -> None:
    if num_tables != len(limits.windows):
        raise ValueError(
            f"{rid!r}: {num_tables} block tables for {len(limits.windows)} KV cache groups"
        )


def _check_extent(
    rid: str,
    computed: int,
    new: int,
    known: int,
    tables: list[tuple[int, list[int]]],
    limits: PlanLimits,
) -> None:
    """The tokens to compute exist, fit the model and are covered by valid blocks in every KV
    cache group; only a sliding group may have dropped (-1) blocks, and only before the window
    of the step's first query. tables: per group, (how many leading blocks were checked
    before, the blocks that follow them)."""
    end = computed + new
    if end > known:
        raise ValueError(f"{rid!r}: computing up to token {end} but only {known} are known")
    if end > limits.max_model_len:
        raise ValueError(f"{rid!r}: {end} tokens exceed max_model_len {limits.max_model_len}")
    size = limits.block_size
    for group, ((checked, blocks), window) in enumerate(zip(tables, limits.windows, strict=True)):
        if (checked + len(blocks)) * size < end:
            raise ValueError(
                f"{rid!r}: {checked + len(blocks)} blocks of {size} cannot hold {end} tokens "
                f"(KV cache group {group})"
            )
        first_read = 0 if window is None else max(computed - window + 1, 0) // size
        for index, block in enumerate(blocks, start=checked):
            if block == -1 and index < first_read:
                continue
            if not 0 <= block < limits.num_blocks:
                raise ValueError(
                    f"{rid!r}: block id {block} not in [0, {limits.num_blocks}) "
                    f"(KV cache group {group}, block {index})"
                )
