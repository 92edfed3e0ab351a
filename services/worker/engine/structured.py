"""Constrained decoding on the worker: one llguidance matcher per constrained sequence, the
token masks of a step filled in one parallel call, each sampled token consumed by its matcher.

The idea: a constrained row may only take tokens its grammar allows next; once the grammar is
complete its mask allows only EOS, so the scheduler ends the request as for any EOS
(finish_reason stop). Masks are applied in the Sampler after penalties and logprobs, before
temperature and the draw.

Compilation never runs in an engine step: a NewSequence with a constraint starts it on a
thread pool (GrammarCache; the same constraint compiles once and is then deep-copied). Its
first token is due at the end of its prefill, one step later at least, and llguidance compiles
a typical schema in ~1 ms, so the future is nearly always done when the row samples; when it
is not, the step waits for that future only, up to COMPILE_WAIT_S (the first constrained
request of a worker also waits for the vocabulary, ~0.5 s once). Waiting is simpler than
telling the scheduler a row is not ready, and costs one step at worst.

A resumed sequence (preempted, or sent again with generated tokens) replays its generated
tokens into a fresh matcher. Errors stay with their sequence: a grammar that does not compile,
a replay the grammar rejects or a timeout ends that request (Sampled.error); the step and the
other rows go on."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.common.errors import Internal, InvalidArgument, LayerserveError
from services.common.sampling import StructuredOutput
from services.worker.model.loaded import LoadedModel

if TYPE_CHECKING:
    import llguidance

# llguidance (and gguf and tokenizers, for the vocabulary) are imported where a constraint is
# first compiled or masked: a runner that is never sent one runs without them (the GPU check's
# bare machine has only torch and triton); there a constrained request ends with an error.

log = logging.getLogger(__name__)

# How long a row that must sample waits for its grammar (see the module docstring).
COMPILE_WAIT_S = 30.0
# Compiled grammars kept (each a matcher in its start state, tens of KB to a few MB).
GRAMMAR_CACHE_SIZE = 256
COMPILE_THREADS = 2


class GrammarError(Exception):
    """A constraint that does not compile: the client's mistake."""


class GrammarCache:
    """StructuredOutput -> future of its compiled matcher (start state), LRU-bounded. The
    vocabulary (load_tokenizer) is built on first use, in the pool too."""

    def __init__(
        self,
        load_tokenizer: Callable[[], llguidance.LLTokenizer],
        pool: ThreadPoolExecutor,
        capacity: int = GRAMMAR_CACHE_SIZE,
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self._pool = pool
        self._capacity = capacity
        self._compiled: OrderedDict[StructuredOutput, Future[llguidance.LLMatcher]] = OrderedDict()

    def get(self, structured: StructuredOutput) -> Future[llguidance.LLMatcher]:
        """Called from the engine thread only; never blocks."""
        future = self._compiled.get(structured)
        if future is not None:
            self._compiled.move_to_end(structured)
            return future
        future = self._pool.submit(self._compile, structured)
        self._compiled[structured] = future
        if len(self._compiled) > self._capacity:
            self._compiled.popitem(last=False)
        return future

    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            return self._tokenizer

    def _compile(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        import llguidance

        from services.common.grammar_pool import grammar_pool
        from services.common.structured_output import grammar_text, short_error

        try:
            # Limits and a trial compile in a grammar process first: a grammar that would crash
            # llguidance or run away costs that process and this request, not the worker.
            grammar_pool().check(structured, "the output constraint")
            grammar = grammar_text(structured)
        except InvalidArgument as err:
            raise GrammarError(err.message) from None
        except ValueError as err:
            raise GrammarError(str(err)) from None
        # Compiling drops the GIL; log_level 0: errors reach the client, not stderr.
        matcher = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(short_error(matcher.get_error()))
        return matcher


@dataclass(slots=True)
class _Constraint:
    compiled: Future[llguidance.LLMatcher]
    replay: list[int]  # generated tokens the matcher consumes once it exists (a resumed sequence)
    matcher: llguidance.LLMatcher | None = None
    error: LayerserveError | None = None


@dataclass(slots=True)
class StepMasks:
    """The masks of one step's constrained rows. rows: their indices among the step's sampled
    rows; allowed [N, V] bool on the logits' device (True = may be sampled; rows without a
    constraint, or failed ones, allow everything); errors: row index -> why it failed."""

    request_ids: Sequence[str]  # of every row
    rows: list[int]
    matchers: list[llguidance.LLMatcher]
    allowed: torch.Tensor
    errors: dict[int, LayerserveError] = field(default_factory=dict)


class StructuredDecoder:
    """The constrained sequences a runner holds, by request id."""

    def __init__(
        self,
        load_tokenizer: Callable[[], llguidance.LLTokenizer],
        vocab_size: int,
        *,
        compile_threads: int = COMPILE_THREADS,
        mask_threads: int | None = None,
        compile_wait_s: float = COMPILE_WAIT_S,
    ) -> None:
        self._pool = ThreadPoolExecutor(compile_threads, thread_name_prefix="grammar")
        self.cache = GrammarCache(load_tokenizer, self._pool)
        self._vocab_size = vocab_size
        self._mask_threads = mask_threads
        self._executor: llguidance.LLExecutor | None = None  # its threads start on first use
        self._wait_s = compile_wait_s
        self._held: dict[str, _Constraint] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def add(
        self, request_id: str, structured: StructuredOutput | None, generated: Sequence[int]
    ) -> None:
        """Starts compiling (or reuses) the sequence's grammar (None: unconstrained, nothing to
        do); `generated`: its tokens generated so far (a resumed sequence's), replayed."""
        if structured is None:
            return
        self._held[request_id] = _Constraint(self.cache.get(structured), list(generated))

    def drop(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._held.pop(request_id, None)

    def masks(self, request_ids: Sequence[str], device: torch.device) -> StepMasks | None:
        """The masks for the rows about to sample, in order; None when no row is constrained."""
        rows = [i for i, rid in enumerate(request_ids) if rid in self._held]
        if not rows:
            return None
        out = StepMasks(request_ids, [], [], torch.empty(0, dtype=torch.bool))
        for i in rows:
            constraint = self._held[request_ids[i]]
            self._ensure_matcher(request_ids[i], constraint)
            if constraint.error is not None:
                out.errors[i] = constraint.error
            else:
                assert constraint.matcher is not None
                out.rows.append(i)
                out.matchers.append(constraint.matcher)
        out.allowed = self._allowed(out, len(request_ids), device)
        return out

    def advance(
        self, masks: StepMasks | None, token_ids: Sequence[int]
    ) -> dict[int, LayerserveError]:
        """Each constrained row's matcher consumes its sampled token. Returns every row that
        failed in this step (masks.errors too), by row index; a failed sequence keeps failing
        until it is dropped."""
        if masks is None:
            return {}
        errors = dict(masks.errors)
        pairs = [(m, token_ids[i]) for i, m in zip(masks.rows, masks.matchers, strict=True)]
        if pairs:
            from services.common.structured_output import short_error

            accepted = self._mask_executor().consume_token_par(pairs)
            for i, (matcher, _), ok in zip(masks.rows, pairs, accepted, strict=True):
                if not ok or matcher.is_error():
                    error = Internal(
                        f"the output constraint failed: {short_error(matcher.get_error())}"
                    )
                    self._held[masks.request_ids[i]].error = errors[i] = error
        return errors

    def _ensure_matcher(self, request_id: str, constraint: _Constraint) -> None:
        if constraint.matcher is not None or constraint.error is not None:
            return
        try:
            template = constraint.compiled.result(timeout=self._wait_s)
        except FutureTimeout:
            constraint.error = Internal(
                f"compiling the output constraint took longer than {self._wait_s:g}s"
            )
            return
        except GrammarError as err:
            constraint.error = InvalidArgument(f"the output constraint does not compile: {err}")
            return
        except Exception:  # a bug or the vocabulary failing to load: the log has the traceback
            log.exception("compiling the output constraint of %s failed", request_id)
            constraint.error = Internal("the output constraint could not be compiled")
            return
        from services.common.structured_output import short_error

        matcher = template.deep_copy()
        if constraint.replay and not matcher.consume_tokens(constraint.replay):
            constraint.error = Internal(
                "the tokens generated before this request was resumed do not match its "
                f"output constraint: {short_error(matcher.get_error())}"
            )
            return
        constraint.matcher = matcher

    def _allowed(self, masks: StepMasks, num_rows: int, device: torch.device) -> torch.Tensor:
        allowed = torch.ones((num_rows, self._vocab_size), dtype=torch.bool, device=device)
        if not masks.rows:
            return allowed
        import llguidance.torch

        bitmask = llguidance.torch.allocate_token_bitmask(len(masks.rows), self._vocab_size)
        llguidance.torch.fill_next_token_bitmask_par(
            self._mask_executor(), [(m, j) for j, m in enumerate(masks.matchers)], bitmask
        )
        rows = torch.tensor(masks.rows, device=device)
        allowed[rows] = unpack_bitmask(bitmask.to(device), self._vocab_size)
        return allowed

    def _mask_executor(self) -> llguidance.LLExecutor:
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor(num_threads=self._mask_threads)
        return self._executor

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def structured_decoder(loaded: LoadedModel) -> StructuredDecoder:
    """The decoder for a loaded model; its vocabulary is read on the first constraint."""
    config = loaded.config
    return StructuredDecoder(
        partial(model_grammar_tokenizer, loaded.path, config.eos_token_ids, config.vocab_size),
        config.vocab_size,
    )


def model_grammar_tokenizer(
    path: Path, eos_token_ids: Sequence[int], vocab_size: int
) -> llguidance.LLTokenizer:
    """The model's vocabulary for llguidance, from the files the tokenizer service reads: a
    checkpoint directory's tokenizer.json, or the tokenizer embedded in a GGUF file."""
    from services.common.gguf_tokenizer import load_gguf_tokenizer
    from services.common.structured_output import grammar_tokenizer

    if path.is_dir():
        text = (path / "tokenizer.json").read_text(encoding="utf-8")
    else:
        text = load_gguf_tokenizer(path).tokenizer.to_str()
    return grammar_tokenizer(text, eos_token_ids, vocab_size)


_BIT = torch.arange(8, dtype=torch.uint8)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed mask [R, W] int32 (bit b of word w = token 32w + b) -> [R, V]
    bool. Unpacked by bytes (little-endian): an [R, 4W, 8] uint8 temporary, not int32."""
    as_bytes = bitmask.contiguous().view(torch.uint8)  # [R, 4W]
    bits = (as_bytes[:, :, None] >> _BIT.to(bitmask.device)) & 1  # [R, 4W, 8]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
