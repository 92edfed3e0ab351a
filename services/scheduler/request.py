"""A generation request as the scheduler tracks it: tokens, progress, blocks, outcome."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from services.common.block_hash import BlockHash
from services.common.errors import LayerserveError
from services.common.sampling import SamplingOptions
from services.scheduler.spec_policy import Acceptance


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True)
class Request:
    """Each request has num_computed_tokens; every step assigns it tokens so that it catches up
    with all_token_ids (the prompt while prefilling, then the one token sampled last step).

    With asynchronous scheduling the next step is scheduled before the last one's token is
    known: that token is a placeholder (num_output_placeholders), which the worker fills in
    with what it sampled. It counts as a token to compute and to hold KV for, but not as
    output until the step's result brings it."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # resolved: never 0
    sampling: SamplingOptions
    stop_token_ids: frozenset[int]
    priority: int = 0
    tenant: str = ""  # non-secret id of the caller's API key; "" = anonymous
    trace_context: dict[str, str] = field(default_factory=dict)
    arrival: float = field(default_factory=time.monotonic)  # restamped by Scheduler.add
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)
    num_computed_tokens: int = 0
    # Tokens sampled in steps still in flight (their ids not yet back): 0 or 1 synchronously,
    # up to 2 with one step scheduled ahead.
    num_output_placeholders: int = 0
    # Proposed tokens the step in flight computes after the known ones (speculative decoding).
    spec_token_ids: list[int] = field(default_factory=list)
    # Speculative decoding's record for this request: steps that carried proposals, the tokens
    # proposed, and those the worker accepted (metrics and its span).
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Its recent proposals' verdicts: how many the next steps should propose (spec_policy.py).
    spec_acceptance: Acceptance = field(default_factory=Acceptance)
    # One block table per KV cache group, group 0 first (kv_cache_manager.py); empty while the
    # request holds no blocks. A sliding-window group's table has -1 for blocks it dropped.
    block_tables: list[list[int]] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: LayerserveError | None = None  # why it ended, when finish_reason is ERROR
    on_worker: bool = False  # the worker holds its state (it was sent in full)
    num_preemptions: int = 0
    num_migrations: int = 0  # moves to another worker after its own was lost (migration.py)
    started: bool = False  # admitted to run at least once (a preempted request has)
    # Prefix caching: the chained hashes of the full blocks of the known tokens (a router may
    # precompute them; the KVCacheManager extends them as blocks fill), how many leading
    # entries of every block table were offered to the cache (the tables grow in lockstep, so
    # one count serves all groups), and the prompt tokens served from the cache at first
    # admission (reported to the client as cached_tokens).
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_cached_tokens: int = 0
    # Its prompt logprobs or embedding went out (a recomputation after preemption sends them
    # again, to be dropped).
    prompt_outputs_sent: bool = False
    # The prompt tokens the router expected this worker's cache to hold when it sent the
    # request here (None: the routing mode does not look at caches), to set against
    # num_cached_tokens, the tokens actually reused.
    predicted_cached_tokens: int | None = None

    @property
    def block_ids(self) -> list[int]:
        """Group 0's block table (the only one for a worker with one group). Read-only."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def reads_every_prompt_position(self) -> bool:
        """Prompt logprobs and mean pooling need every prompt position computed: no prefix
        comes from the cache."""
        return self.sampling.prompt_logprobs is not None or self.sampling.pooling == "mean"

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens_to_compute(self) -> int:
        return (
            self.num_tokens
            + self.num_output_placeholders
            + len(self.spec_token_ids)
            - self.num_computed_tokens
        )

    @property
    def num_outputs_coming(self) -> int:
        """Output tokens known or in flight: what max_tokens is checked against ahead."""
        return len(self.output_token_ids) + self.num_output_placeholders

    def preempted(self) -> None:
        """Its blocks are gone: it waits to be computed again from its first token (a run whose
        tokens still in flight are dropped on arrival: Scheduled.is_current)."""
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.spec_token_ids = []
        self.status = Status.WAITING
        self.num_preemptions += 1

    def moved(self) -> None:
        """Its worker is gone, with its KV cache: it waits to be computed again from its first
        token on another worker, its output so far kept (the sampler counts positions from it).
        The tokens of steps in flight are lost; the client never saw them."""
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.spec_token_ids = []
        self.block_tables = []
        self.num_cached_blocks = 0
        self.status = Status.WAITING
        self.on_worker = False
        self.num_migrations += 1

    def last_token_in_flight(self, max_model_len: int) -> bool:
        """A step in flight samples its last token (max_tokens or the context length reached
        by its placeholders): it needs no other step."""
        if not self.num_output_placeholders:
            return False
        if self.num_outputs_coming >= self.max_tokens or self.sampling.pooling is not None:
            return True  # (an embedding ends with its prompt's pass: result_applier.py)
        return self.num_tokens + self.num_output_placeholders >= max_model_len

    @property
    def num_tokens_expected_to_compute(self) -> int:
        """num_tokens_to_compute, less the cached prefix the router expects while it has not
        started (then the scheduler knows the real one)."""
        if self.started or not self.predicted_cached_tokens:
            return self.num_tokens_to_compute
        return self.num_tokens_to_compute - self.predicted_cached_tokens
