"""The llama.cpp baseline: llama-cpp-python on the very GGUF layerserve serves (quantised as
shipped), continuous batching the way llama-server does it, through llama.cpp's low-level
batch API: one context whose KV cache all sequences share (`kv_unified`), one sequence id per
request in flight (at most `n_seq_max`), and every llama_decode() carries each running
request's next token first, then as many prompt tokens of the requests being admitted as the
`n_batch` budget leaves (llama-server's update_slots()). Same token ids in, exactly each
request's output length out (EOS ignored), the same sampling: temperature -> top_p -> a draw
seeded per request (llama_sampler's `dist`), or greedy.

llama-cpp-python builds llama.cpp from source: it is the optional extra `llama-cpp`
(pip install -e '.[llama-cpp]'); without it the baseline reports itself as not installed.
The bench runs it in a child process (open_llama_cpp, benchmarks/baseline_process.py): a
llama.cpp built for another CPU can die with SIGSEGV, and only its row may go with it."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from benchmarks.sampling import Sampling

NOT_INSTALLED = "not installed: pip install -e '.[llama-cpp]'"


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_version() -> str | None:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class LlamaCppBudget:
    """The engine's budgets, set equal to layerserve's: KV tokens, tokens per llama_decode(),
    requests in flight, threads."""

    n_ctx: int  # KV cache tokens shared by every sequence
    n_batch: int  # tokens per llama_decode() (layerserve's max_num_batched_tokens)
    n_seq_max: int  # requests in flight (layerserve's max_num_seqs)
    n_threads: int


@dataclass(slots=True)
class _Slot:
    """One request in flight: its sequence id, how much of its prompt is in the KV cache."""

    index: int  # the request's position in the caller's list
    seq_id: int
    prompt: list[int]
    output_len: int
    sampler: object  # llama_sampler_p
    n_past: int = 0
    output: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)


def open_llama_cpp(gguf: Path, budget: LlamaCppBudget, file_type: str, workdir: Path):
    """A LlamaCppEngine on `gguf` as shipped (file_type "as shipped"), or on the same weights
    that llama.cpp converts to `file_type` (a key of precision.LLAMA_CPP_TYPES, e.g. "F32"),
    written once into `workdir` and reused by later calls."""
    from benchmarks.precision import AS_SHIPPED

    if file_type != AS_SHIPPED:
        gguf = convert_gguf(gguf, file_type, workdir)
    return LlamaCppEngine(gguf, budget)


def convert_gguf(gguf: Path, file_type: str, workdir: Path) -> Path:
    """gguf's weights in `file_type`, by llama.cpp's own quantizer (quantised tensors are
    dequantised first: the values are the shipped file's, stored wider)."""
    import llama_cpp as ll

    from benchmarks.precision import LLAMA_CPP_TYPES

    out = workdir / f"{gguf.stem}.{file_type}.gguf"
    if out.exists():
        return out
    params = ll.llama_model_quantize_default_params()
    params.ftype = LLAMA_CPP_TYPES[file_type]
    params.allow_requantize = True
    partial = out.with_suffix(".partial")
    done = ll.llama_model_quantize(str(gguf).encode(), str(partial).encode(), ctypes.byref(params))
    if done != 0:
        raise RuntimeError(f"llama.cpp could not convert {gguf.name} to {file_type}")
    partial.rename(out)
    return out


def shipped_type(gguf: Path) -> str:
    """The packaged file's type from its name (SmolLM2-135M-Instruct.Q4_1.gguf: Q4_1)."""
    return gguf.stem.rsplit(".", 1)[-1] if "." in gguf.stem else "the packaged type"


class LlamaCppEngine:
    def __init__(self, gguf: Path, budget: LlamaCppBudget) -> None:
        import llama_cpp as ll

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # no per-load banner
        self._ll = ll
        self.gguf = gguf
        self.budget = budget
        ll.llama_backend_init()
        model_params = ll.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = ll.llama_model_load_from_file(str(gguf).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        ctx_params = ll.llama_context_default_params()
        ctx_params.n_ctx = budget.n_ctx
        ctx_params.n_batch = budget.n_batch
        ctx_params.n_ubatch = min(512, budget.n_batch)  # llama.cpp's default physical batch
        ctx_params.n_seq_max = budget.n_seq_max
        ctx_params.kv_unified = True  # one KV buffer for all sequences, as llama-server's slots
        ctx_params.n_threads = ctx_params.n_threads_batch = budget.n_threads
        self._ctx = ll.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self._memory = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(budget.n_batch, 0, 1)

    def describe(self) -> str:
        """The GGUF's file name (its quantisation as shipped) and llama-cpp-python's version."""
        return f"{self.gguf.name}, llama-cpp-python {llama_cpp_version()}"

    def close(self) -> None:
        ll = self._ll
        ll.llama_batch_free(self._batch)
        ll.llama_free(self._ctx)
        ll.llama_model_free(self._model)

    def generate(
        self,
        prompts: list[list[int]],
        output_lens: list[int],
        sampling: Sampling,
        seeds: list[int],
    ) -> list[list[int]]:
        """Every request queued at once; exactly output_lens[i] tokens for prompt i."""
        ll = self._ll
        ll.llama_memory_clear(self._memory, True)
        queue = deque(range(len(prompts)))
        free_ids = list(range(self.budget.n_seq_max))
        slots: list[_Slot] = []
        results: list[list[int]] = [[] for _ in prompts]
        while queue or slots:
            while queue and free_ids:
                i = queue.popleft()
                sampler = self._sampler(sampling, seeds[i])
                slots.append(_Slot(i, free_ids.pop(), prompts[i], output_lens[i], sampler))
            outputs = self._fill_batch(slots)
            if ll.llama_decode(self._ctx, self._batch) != 0:
                raise RuntimeError("llama_decode failed: the KV cache is too small for the batch")
            for slot, row in outputs:
                token = ll.llama_sampler_sample(slot.sampler, self._ctx, row)
                slot.output.append(token)
            for slot in [s for s in slots if len(s.output) == s.output_len]:
                results[slot.index] = slot.output
                ll.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
                ll.llama_sampler_free(slot.sampler)
                free_ids.append(slot.seq_id)
                slots.remove(slot)
        return results

    def _fill_batch(self, slots: list[_Slot]) -> list[tuple[_Slot, int]]:
        """Decode tokens first, then prompt chunks while the budget lasts. Returns (slot, batch
        row) for every slot whose logits this step yields."""
        batch, n, outputs = self._batch, 0, []
        for slot in slots:
            if not slot.prefilling:
                self._put(n, slot.output[-1], slot.n_past, slot.seq_id, True)
                slot.n_past += 1
                outputs.append((slot, n))
                n += 1
        for slot in slots:
            if not slot.prefilling or n >= self.budget.n_batch:
                continue
            take = min(len(slot.prompt) - slot.n_past, self.budget.n_batch - n)
            for k in range(take):
                last = slot.n_past + k == len(slot.prompt) - 1
                self._put(n + k, slot.prompt[slot.n_past + k], slot.n_past + k, slot.seq_id, last)
            slot.n_past += take
            n += take
            if not slot.prefilling:
                outputs.append((slot, n - 1))
        batch.n_tokens = n
        return outputs

    def _put(self, row: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        b = self._batch
        b.token[row], b.pos[row], b.n_seq_id[row] = token, pos, 1
        b.seq_id[row][0] = seq_id
        b.logits[row] = logits

    def _sampler(self, sampling: Sampling, seed: int):
        """A sampler chain per request: greedy, or temperature then top_p (the order layerserve
        and transformers use; llama-server's default puts top_p first) then a seeded draw."""
        ll = self._ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if sampling.greedy:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            return chain
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(sampling.temperature))
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(sampling.top_p, 1))
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed))
        return chain
