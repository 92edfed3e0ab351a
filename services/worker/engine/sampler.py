"""Batched token sampling: penalties, temperature, top-k/top-p/min-p, seeds and logprobs.

Order per row: repetition penalty (prompt + output tokens, HF: divide positive logits,
multiply negative ones), then presence/frequency penalties (output tokens only, OpenAI),
then logprobs are taken, then the allowed-token mask of a constrained row (structured.py),
then temperature, top-k, top-p, min-p and the draw.

Logprobs are log_softmax of the penalised logits, before temperature and truncation (vLLM's
"raw logprobs after penalties"): they describe the model, not the sampling knobs, so they
stay comparable across temperatures and are finite for every token. They are also taken
before a structured-output mask, so they are the model's, not the grammar's (a top
alternative may be a token the grammar forbids). Greedy rows take the exact argmax of the
penalised (and masked) logits.

The draw never sorts the vocabulary. Every random row takes one uniform number u and picks the
token where u lands in the cumulative distribution of what it keeps (inverse CDF): in vocabulary
order when nothing is truncated, else among its CANDIDATES most likely tokens (one batched
topk), which hold the whole kept set unless top-p needs more of a flat distribution; only such
rows fall back to the dense reference (`sampling_probs`). The distribution is the reference's
(tests/unit/worker/test_sampler.py compares them).

A seeded row's u comes from (seed, number of output tokens so far), hashed: the same request
gives the same tokens whatever shares its batch, and again after a preemption resumes it with
its generated tokens. Unseeded rows take u from the global RNG."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from services.common.sampling import SamplingOptions

_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class SampleOutput:
    token_ids: list[int]  # [N]
    logprobs: list[float | None]  # [N]: the sampled token's, None where not requested
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # [N][n], best first


def row_seed(seed: int, num_output_tokens: int) -> int:
    """A 63-bit generator seed mixing the request seed and its step (splitmix64 finaliser)."""
    z = (seed + (num_output_tokens + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


# Temperatures below this sample greedily (as vLLM's do): dividing logits by them overflows
# float32, and the distribution they describe is the argmax anyway.
GREEDY_BELOW = 1e-5
# MAX_LOGIT / GREEDY_BELOW stays below float32's max (3.4e38).
MAX_LOGIT = 1e30


# Truncated rows (top-k, top-p, min-p) draw among their most likely tokens: first this many
# (or their top_k), then rows whose kept set is larger try again with WIDE_CANDIDATES. topk
# costs grow with k: 64 holds top-p 0.95 of a language model's next token nearly always.
CANDIDATES = 64
WIDE_CANDIDATES = 1024


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,
        options: list[SamplingOptions],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        allowed: torch.Tensor | None = None,
    ) -> SampleOutput:
        """logits [N, V] -> one token per row, with logprobs where a row asked. Rows with
        penalties are penalised in a copy; the caller's logits are not changed.

        allowed [N, V] bool (None: every token): the tokens each row may take; every row
        must allow at least one."""
        logits = logits.float()
        if _wants_penalties(options):
            logits = logits.clone()
            apply_penalties(logits, options, prompt_token_ids, output_token_ids)
            # A tiny repetition penalty can divide a logit up to inf; keep every logit finite
            # so that no row's distribution turns into NaN (which would fail the whole step).
            logits.clamp_(min=-MAX_LOGIT, max=MAX_LOGIT)
        logprobs = torch.log_softmax(logits, dim=-1) if _wants_logprobs(options) else None
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))  # a copy
        random_rows = [i for i, o in enumerate(options) if o.temperature >= GREEDY_BELOW]
        if not random_rows:
            return _package(_argmax(logits), logprobs, options)
        chosen = [options[i] for i in random_rows]
        counts = [len(output_token_ids[i]) for i in random_rows]
        u = uniforms([o.seed for o in chosen], counts).to(logits.device)
        if len(random_rows) == len(options):  # no argmax for nothing; draw() only reads logits
            return _package(draw(logits, chosen, u), logprobs, options)
        tokens = _argmax(logits)  # [N], final for the greedy rows
        index = torch.tensor(random_rows, device=logits.device)
        tokens[index] = draw(logits[index], chosen, u)
        return _package(tokens, logprobs, options)


def _wants_penalties(options: list[SamplingOptions]) -> bool:
    return any(
        o.repetition_penalty != 1.0 or o.presence_penalty != 0 or o.frequency_penalty != 0
        for o in options
    )


def uniforms(seeds: list[int | None], counts: list[int]) -> torch.Tensor:
    """[R] float64 in [0, 1): from (seed, step) for seeded rows, the global RNG for others."""
    u = torch.rand(len(seeds), dtype=torch.float64)
    for i, seed in enumerate(seeds):
        if seed is not None:
            u[i] = (row_seed(seed, counts[i]) >> 10) / 2.0**53
    return u


def draw(logits: torch.Tensor, options: list[SamplingOptions], u: torch.Tensor) -> torch.Tensor:
    """Penalised logits [R, V] of random rows and one uniform per row [R] -> token ids [R]. The
    logits are read, never written."""
    device = logits.device
    temperature = torch.tensor([o.temperature for o in options], device=device)
    drawn = torch.empty(len(options), dtype=torch.int64, device=device)
    truncated = [i for i, o in enumerate(options) if o.top_k > 0 or o.top_p < 1 or o.min_p > 0]
    whole = sorted(set(range(len(options))) - set(truncated))
    if whole:  # exp((logit - max) / T), in the copy the indexing made
        rows = logits[whole]
        rows.sub_(rows.amax(dim=-1, keepdim=True)).div_(temperature[whole, None]).exp_()
        drawn[whole] = _inverse_cdf(rows, u[whole])
    missed = truncated
    for candidates in (CANDIDATES, WIDE_CANDIDATES):
        if not missed:
            return drawn
        rows = [options[i] for i in missed]
        every = len(missed) == len(options)  # no copy of the whole rows
        picked, exact = _draw_among_candidates(
            logits if every else logits[missed], temperature[missed], rows, u[missed], candidates
        )
        drawn[missed] = picked
        missed = [missed[j] for j, ok in enumerate(exact.tolist()) if not ok]
    if missed:  # a flat distribution: the dense reference for these rows
        probs = sampling_probs(logits[missed], [options[i] for i in missed])
        drawn[missed] = _inverse_cdf(probs, u[missed])
    return drawn


def _top_candidates(
    logits: torch.Tensor, temperature: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k largest logits / temperature per row, most likely first, their ids and each row's
    logsumexp: (values [R, k], ids [R, k], lse [R]). On the CPU one C++ op
    (csrc/sampling_ops.cpp) where the extension is built, ~6x faster than these torch ops."""
    if logits.device.type == "cpu" and _native_ops():
        return torch.ops.layerserve.top_candidates(logits, temperature.float(), k)
    scaled = logits / temperature[:, None]
    values, ids = scaled.topk(k, dim=-1)
    return values, ids, torch.logsumexp(scaled, dim=-1)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [N, V] -> each row's first largest index [N]: torch.argmax's answer, on the CPU
    by one C++ op where the extension is built (~8x faster on 49k logits)."""
    if logits.device.type == "cpu" and _native_ops():
        return torch.ops.layerserve.argmax_rows(logits)
    return logits.argmax(dim=-1)


@functools.cache
def _native_ops() -> bool:
    """Whether the C++ sampling ops (csrc/sampling_ops.cpp) are built and loaded."""
    from services.worker.layers import cpu_attention_ext

    return cpu_attention_ext.load() and hasattr(torch.ops.layerserve, "argmax_rows")


def _draw_among_candidates(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    options: list[SamplingOptions],
    u: torch.Tensor,
    candidates: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] (before temperature) -> (token ids [R], exact [R] bool: the kept set ends
    inside the candidates)."""
    device = logits.device
    vocab = logits.shape[1]
    top_k = torch.tensor([o.top_k for o in options], device=device)
    k = min(vocab, max(candidates, int(top_k.max())))
    values, ids, lse = _top_candidates(logits, temperature, k)  # [R, k], most likely first
    probs = torch.exp(values - lse[:, None])  # [R, k]
    # top-k: ties at the k-th value are kept, as in the reference.
    kth = values.gather(1, (top_k.clamp(1, k) - 1)[:, None])
    keep = (values >= kth) | (top_k[:, None] <= 0)
    # top-p over the top-k distribution: a token drops when the more likely ones reach p.
    kept = probs * keep
    mass = torch.where(top_k > 0, kept.sum(dim=-1), torch.ones_like(top_k, dtype=probs.dtype))
    before = (kept.cumsum(dim=-1) - kept) / mass[:, None]
    top_p = torch.tensor([o.top_p for o in options], device=device, dtype=probs.dtype)
    keep &= before < top_p[:, None]
    # min-p: relative to the most likely token, so renormalising does not move it.
    min_p = torch.tensor([o.min_p for o in options], device=device, dtype=probs.dtype)
    keep &= probs >= min_p[:, None] * probs[:, :1]
    exact = ~keep[:, -1] if k < vocab else torch.ones_like(keep[:, -1])
    picked = _inverse_cdf(probs * keep, u)
    return ids.gather(1, picked[:, None]).squeeze(1), exact


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [R, V] >= 0 (not normalised), u [R] in [0, 1) -> per row the index where
    u x total falls in the running sum; a zero weight is never picked."""
    cdf = weights.cumsum(dim=-1)
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    over = (index >= weights.shape[1]).nonzero().flatten().tolist()
    for row in over:  # u x total rounded up to the total: the last token with any weight
        index[row] = int(weights[row].nonzero().max())
    return index


def _wants_logprobs(options: list[SamplingOptions]) -> bool:
    return any(o.logprobs is not None for o in options)


def apply_penalties(
    logits: torch.Tensor,
    options: list[SamplingOptions],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
) -> None:
    """In place on logits [N, V]; rows without penalties are not touched."""
    device = logits.device
    rep_rows = [i for i, o in enumerate(options) if o.repetition_penalty != 1.0]
    if rep_rows:
        seen = (
            _token_counts(
                [prompt_token_ids[i] + output_token_ids[i] for i in rep_rows],
                logits.shape[1],
                device,
            )
            > 0
        )  # [R, V]
        penalty = torch.tensor([options[i].repetition_penalty for i in rep_rows], device=device)
        rows = logits[rep_rows]
        penalised = torch.where(rows > 0, rows / penalty[:, None], rows * penalty[:, None])
        logits[rep_rows] = torch.where(seen, penalised, rows)
    add_rows = [
        i for i, o in enumerate(options) if o.presence_penalty != 0 or o.frequency_penalty != 0
    ]
    if add_rows:
        counts = _token_counts([output_token_ids[i] for i in add_rows], logits.shape[1], device)
        freq = torch.tensor([options[i].frequency_penalty for i in add_rows], device=device)
        pres = torch.tensor([options[i].presence_penalty for i in add_rows], device=device)
        logits[add_rows] -= freq[:, None] * counts + pres[:, None] * (counts > 0).float()


def _token_counts(
    token_lists: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[R, V] float32: how often each token occurs in each row's list."""
    counts = torch.zeros((len(token_lists), vocab_size), dtype=torch.float32, device=device)
    for row, ids in enumerate(token_lists):
        if ids:
            index = torch.tensor(ids, dtype=torch.int64, device=device)
            counts[row].index_add_(0, index, torch.ones(len(ids), device=device))
    return counts


def sampling_probs(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    """Penalised logits [R, V] of random rows -> the distribution to draw from [R, V]."""
    device = logits.device
    temperature = torch.tensor([o.temperature for o in options], device=device)
    logits = logits / temperature[:, None]
    if any(o.top_k > 0 for o in options):
        logits = _top_k(logits, [o.top_k for o in options])
    if any(o.top_p < 1.0 for o in options):
        logits = _top_p(logits, torch.tensor([o.top_p for o in options], device=device))
    probs = torch.softmax(logits, dim=-1)
    if any(o.min_p > 0 for o in options):
        min_p = torch.tensor([o.min_p for o in options], device=device)
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < threshold, 0.0, probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Keeps each row's k largest logits (k = 0: all); ties at the k-th value are kept."""
    vocab = logits.shape[1]
    k = torch.tensor([min(t, vocab) if t > 0 else 1 for t in top_k], device=logits.device)
    # topk of the largest k needed is far cheaper than sorting the whole vocabulary.
    largest = logits.topk(int(k.max()), dim=-1).values  # [R, kmax], descending
    kth = largest.gather(1, k[:, None] - 1)  # [R, 1]
    disabled = torch.tensor([t <= 0 for t in top_k], device=logits.device)
    kth = kth.masked_fill(disabled[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # A token drops when the more likely ones already reach top_p; the first never drops.
    drop_sorted = mass_before >= top_p[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _package(
    tokens: torch.Tensor, logprobs: torch.Tensor | None, options: list[SamplingOptions]
) -> SampleOutput:
    token_list = tokens.tolist()
    out = SampleOutput(token_ids=token_list, logprobs=[None] * len(token_list))
    out.top_logprobs = [[] for _ in token_list]
    if logprobs is None:
        return out
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
    max_n = max(o.logprobs or 0 for o in options)
    top_values, top_ids = logprobs.topk(max_n, dim=-1) if max_n else (None, None)
    for i, option in enumerate(options):
        if option.logprobs is None:
            continue
        out.logprobs[i] = chosen[i]
        if option.logprobs and top_values is not None and top_ids is not None:
            ids = top_ids[i, : option.logprobs].tolist()
            values = top_values[i, : option.logprobs].tolist()
            out.top_logprobs[i] = list(zip(ids, values, strict=True))
    return out
