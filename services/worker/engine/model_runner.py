"""The worker's engine: per-request state, the paged KV cache and one model step per plan.

execute() is synchronous and meant for a dedicated thread; nothing here touches asyncio."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from services.worker.engine.decode_graphs import DecodeGraphs
from services.worker.engine.plan import Sampled, StepPlan
from services.worker.engine.pooling import pool_prompts
from services.worker.engine.prompt_logprobs import collect_prompt_logprobs
from services.worker.engine.sampler import SampleOutput, Sampler
from services.worker.engine.sequences import PlanLimits, SequenceState, validate_plan
from services.worker.engine.spec_verify import DraftRows, accept, draft_rows, logit_rows
from services.worker.engine.structured import structured_decoder
from services.worker.kernel_choice import check_kernel_device
from services.worker.layers.attention import AttentionBackend, StepAttention
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.kv_cache import (
    KVCacheGroup,
    PagedKVCache,
    kv_cache_groups,
    num_blocks_for_bytes,
)
from services.worker.model.flat_layers import FlatLayers
from services.worker.model.loaded import LoadedModel
from services.worker.model.quant import quantize_loaded
from services.worker.model.quant_choice import activation_kernel

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# --kv-cache-dtype: auto stores K and V in the compute dtype; int8 quantizes them (kv_cache.py).
KV_CACHE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}
# Without an explicit size, a CPU cache gets 1 GiB (about 23k tokens of SmolLM2-135M) and a
# GPU cache this share of the memory still free once the weights are loaded.
DEFAULT_CPU_KV_BYTES = 1 << 30
DEFAULT_GPU_KV_FRACTION = 0.8
# Decode steps of up to this many sequences replay CUDA graphs (vLLM captures up to 512).
DEFAULT_CUDA_GRAPH_MAX_BATCH = 256


@dataclass(slots=True)
class _Scheduled:
    state: SequenceState
    num_new: int  # tokens computed this step, starting at state.num_computed
    num_drafts: int = 0  # of those, proposed tokens at the end of state.token_ids (to verify)


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        kv_cache: PagedKVCache,
        *,
        max_model_len: int,
        model_name: str,
        backend: AttentionBackend,
        cuda_graph_max_batch: int = 0,
    ) -> None:
        """backend: who runs attention and the ops around it, chosen once at start-up
        (layers/attention_backends.py: choose_attention_backend for --kernels).

        cuda_graph_max_batch > 0 runs decode-only steps of up to that many sequences through
        DecodeGraphs (decode_graphs.py) when the Triton kernels run; capture_decode_graphs()
        captures them. 0 runs every step eagerly.

        ValueError if the backend cannot read this cache (an int8 one on the Triton kernels)."""
        if kv_cache.quantized and not backend.supports_int8_kv:
            raise ValueError(
                f"--kv-cache-dtype int8 runs on the torch kernels only, not {backend.name}: "
                "use --kernels torch, or another --kv-cache-dtype"
            )
        self._loaded = loaded
        self._model = loaded.model
        # Steps within its max_rows (decoding) run a Llama model's layers as one flat loop: the
        # same ops without the module tree's Python frames (model/flat_layers.py). None: every
        # step through the modules (another model, or hooked layers: tensor parallelism).
        flat_loop = getattr(loaded.model, "flat_loop", None)  # Llama models have one
        self._flat = flat_loop() if flat_loop is not None else None
        self._cache = kv_cache
        self._sampler = Sampler()
        self._structured = structured_decoder(loaded)  # constrained rows' grammars and masks
        self._max_model_len = max_model_len
        self._model_name = model_name
        self._device = loaded.model.embed_tokens.device
        self._dtype = loaded.model.embed_tokens.dtype
        self._backend = backend
        self._requests: dict[str, SequenceState] = {}
        self._limits = PlanLimits(
            block_size=kv_cache.block_size,
            num_blocks=kv_cache.num_blocks,
            max_model_len=max_model_len,
            vocab_size=loaded.config.vocab_size,
            windows=tuple(group.window for group in kv_cache.groups),
        )
        self._graphs: DecodeGraphs | None = None
        one_group = len(kv_cache.groups) == 1  # the graphs' static buffers hold one table
        if cuda_graph_max_batch > 0 and self._backend.supports_decode_graphs and one_group:
            self._graphs = DecodeGraphs(
                self._model,
                kv_cache,
                self._backend,
                max_batch=cuda_graph_max_batch,
                max_model_len=max_model_len,
                hidden_size=loaded.config.hidden_size,
            )

    @classmethod
    def create(
        cls,
        path: str | Path | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        max_model_len: int | None = None,
        model_name: str | None = None,
        num_threads: int | None = None,
        kernels: str = "auto",
        cuda_graph_max_batch: int | None = None,
        quantization: str = "none",
        kv_cache_dtype: str = "auto",
        activations: str = "auto",
    ) -> ModelRunner:
        """Loads the model (the bundled SmolLM2 GGUF by default) and allocates the KV cache.

        num_blocks wins over kv_cache_bytes; with neither, see DEFAULT_*_KV_* above.
        cuda_graph_max_batch: None = DEFAULT_CUDA_GRAPH_MAX_BATCH on CUDA; 0 = eager only.
        quantization: "none" or "int8" (weight-only, model/quant.py), applied after loading.
        kv_cache_dtype: "auto" (dtype), or one of KV_CACHE_DTYPES.
        activations: what 4-bit weights' kernels take (quant_choice.ACTIVATION_CHOICES)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_CACHE_DTYPES:
            choices = ", ".join(["auto", *KV_CACHE_DTYPES])
            raise ValueError(f"kv_cache_dtype must be one of {choices}, got {kv_cache_dtype!r}")
        four_bit_kernel = activation_kernel(activations)  # a bad name fails before the load
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        # Here, not at the top: the loaders import gguf and safetensors, which running a model
        # (the GPU check, a runner built around weights in memory) does not need.
        from services.worker.model.loader import default_path, load_model

        torch_device = torch.device(device)
        check_kernel_device(kernels, torch_device)  # before seconds of loading, not after
        torch_dtype = DTYPES[dtype]
        kv_dtype = torch_dtype if kv_cache_dtype == "auto" else KV_CACHE_DTYPES[kv_cache_dtype]
        loaded = load_model(path or default_path(), dtype=torch_dtype, device=torch_device)
        loaded = quantize_loaded(loaded, quantization, four_bit_kernel)
        limit = loaded.config.max_position_embeddings
        if max_model_len is not None and not 0 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}], got {max_model_len}")
        groups = kv_cache_groups(loaded.config)
        if num_blocks is None:
            budget = (
                kv_cache_bytes if kv_cache_bytes is not None else default_kv_bytes(torch_device)
            )
            num_blocks = num_blocks_for_bytes(loaded.config, block_size, kv_dtype, budget, groups)
        cache = PagedKVCache(loaded.config, num_blocks, block_size, kv_dtype, torch_device, groups)
        name = model_name or (DEFAULT_MODEL_NAME if path is None else Path(path).stem.lower())
        if cuda_graph_max_batch is None:
            cuda_graph_max_batch = (
                DEFAULT_CUDA_GRAPH_MAX_BATCH if torch_device.type == "cuda" else 0
            )
        runner = cls(
            loaded,
            cache,
            max_model_len=max_model_len or limit,
            model_name=name,
            backend=choose_attention_backend(kernels, torch_device, loaded.config.head_dim),
            cuda_graph_max_batch=cuda_graph_max_batch,
        )
        runner.capture_decode_graphs()
        return runner

    # Read-only facts the server reports to the scheduler.
    @property
    def block_size(self) -> int:
        return self._cache.block_size

    @property
    def num_blocks(self) -> int:
        return self._cache.num_blocks

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def kv_cache_groups(self) -> list[KVCacheGroup]:
        return self._cache.groups

    @property
    def vocab_size(self) -> int:
        return self._loaded.config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._loaded.config.eos_token_ids

    @property
    def fingerprint(self) -> str:
        return self._loaded.fingerprint

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def dtype(self) -> str:
        return str(self._dtype).removeprefix("torch.")

    @property
    def cuda_graph_sizes(self) -> list[int]:
        """Batch sizes whose decode steps replay a CUDA graph; [] when steps run eagerly."""
        if self._graphs is None or not self._graphs.uses_cuda_graphs:
            return []
        return self._graphs.sizes

    def capture_decode_graphs(self) -> None:
        """Captures the decode CUDA graphs (seconds, on CUDA only); call before serving."""
        if self._graphs is not None:
            with torch.inference_mode():
                self._graphs.capture()

    @property
    def flat_layers(self) -> FlatLayers | None:
        """The flat layer loop small steps run through (None: the module tree only)."""
        return self._flat

    @property
    def kernels(self) -> str:
        """Who runs attention and KV cache writes: "triton" or "torch"."""
        return self._backend.name

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def num_requests(self) -> int:
        """How many requests the worker holds state for."""
        return len(self._requests)

    def execute(self, plan: StepPlan) -> list[Sampled]:
        """Runs one step; returns a token for each sequence whose known tokens are all computed.

        The plan is checked in full first: a ValueError leaves requests and cache untouched."""
        validate_plan(plan, self._requests, self._limits)
        for request_id in plan.finished_ids:
            self._requests.pop(request_id, None)
        self._structured.drop(plan.finished_ids)
        scheduled = self._apply(plan)
        if not scheduled:
            return []
        with torch.inference_mode():
            return self._run(scheduled)

    def _apply(self, plan: StepPlan) -> list[_Scheduled]:
        """Registers new sequences and running diffs; the work of this step, in plan order."""
        scheduled = []
        for seq in plan.new:
            state = SequenceState.of(seq)
            self._requests[seq.request_id] = state
            self._structured.add(seq.request_id, seq.sampling.structured, state.output_token_ids)
            scheduled.append(_Scheduled(state, seq.num_new_tokens))
        for diff in plan.running:
            state = self._requests[diff.request_id]
            for table, appended in zip(state.block_tables, diff.new_block_tables, strict=True):
                table.extend(appended)
            state.token_ids.extend(diff.draft_token_ids)  # until verified: spec_verify.py
            scheduled.append(_Scheduled(state, diff.num_new_tokens, len(diff.draft_token_ids)))
        return [item for item in scheduled if item.num_new > 0]

    def _run(self, scheduled: list[_Scheduled]) -> list[Sampled]:
        """Forward over the flattened batch, then sample the sequences that reached their end."""
        graphs = self._graphs
        if graphs is not None and _is_graphable(graphs, scheduled):
            hidden = _decode_with_graphs(graphs, scheduled)  # [S, d]: one row per sequence
            last_rows = torch.arange(len(scheduled), device=self._device)
        else:
            hidden, last_rows = self._forward(scheduled)
        collect_prompt_logprobs(self._model.compute_logits, hidden, last_rows, scheduled)
        pool_prompts(hidden, last_rows, scheduled)
        for item in scheduled:
            item.state.num_computed += item.num_new
        # Logits only where a token is due: the last row of each sequence that is caught up.
        caught_up = [
            (i, item.state)
            for i, item in enumerate(scheduled)
            if item.state.num_computed == len(item.state.token_ids)
        ]
        # An embedding ends with its prompt: its vector goes back, and no token is sampled.
        pooled = [_pooled(state) for _, state in caught_up if state.sampling.pooling is not None]
        ready = [(i, state) for i, state in caught_up if state.sampling.pooling is None]
        if not ready:
            return pooled
        drafted = [item for item in scheduled if item.num_drafts]
        if drafted:
            return pooled + self._sample_with_drafts(hidden, last_rows, scheduled)
        rows = last_rows[torch.tensor([i for i, _ in ready], device=self._device)]
        logits = self._model.compute_logits(hidden[rows])  # [N, V] float32
        return pooled + self._sample(logits, [state for _, state in ready])

    def _sample_with_drafts(
        self, hidden: torch.Tensor, last_rows: torch.Tensor, scheduled: list[_Scheduled]
    ) -> list[Sampled]:
        """Speculative decoding (spec_verify.py): one pass over the output head for the caught-up
        sequences without proposals and the 1 + d last rows of each with d; the proposals are
        kept while the sampler picks them itself."""
        caught_up = [item.state.num_computed == len(item.state.token_ids) for item in scheduled]
        plain = [
            i
            for i, item in enumerate(scheduled)
            if caught_up[i] and not item.num_drafts and item.state.sampling.pooling is None
        ]
        drafted = [(i, item.num_drafts) for i, item in enumerate(scheduled) if item.num_drafts]
        logits = self._model.compute_logits(hidden[logit_rows(last_rows, plain, drafted)])
        results = (
            self._sample(logits[: len(plain)], [scheduled[i].state for i in plain]) if plain else []
        )
        states, num_drafts = [scheduled[i].state for i, _ in drafted], [d for _, d in drafted]
        out = self._draw(logits[len(plain) :], draft_rows(states, num_drafts))
        return results + accept(states, num_drafts, out, self._cache.block_size)

    def _draw(self, logits: torch.Tensor, rows: DraftRows) -> SampleOutput:
        """Samples proposal rows (never constrained); the tensor-parallel runner shares them."""
        return self._sampler.sample(
            logits, rows.options, rows.prompt_token_ids, rows.output_token_ids
        )

    def _forward(self, scheduled: list[_Scheduled]) -> tuple[torch.Tensor, torch.Tensor]:
        """Eager forward: hidden states [T, d] and the last row of each sequence [S]."""
        input_ids: list[int] = []
        for item in scheduled:
            start = item.state.num_computed
            input_ids.extend(item.state.token_ids[start : start + item.num_new])
        attn = StepAttention.build(
            query_lens=[item.num_new for item in scheduled],
            context_lens=[item.state.num_computed + item.num_new for item in scheduled],
            block_tables=[
                [item.state.block_tables[group] for item in scheduled]
                for group in range(len(self._cache.groups))
            ],
            block_size=self._cache.block_size,
            device=self._device,
            backend=self._backend,
        )
        tokens = torch.tensor(input_ids, dtype=torch.int64, device=self._device)
        if self._flat is None:
            hidden = self._model(tokens, attn.positions, attn, self._cache)  # [T, d]
        else:
            hidden = self._model(tokens, attn.positions, attn, self._cache, flat=self._flat)
        return hidden, attn.query_start[1:] - 1

    def _sample(self, logits: torch.Tensor, states: list[SequenceState]) -> list[Sampled]:
        masks = self._structured.masks([s.request_id for s in states], logits.device)
        out = self._sampler.sample(
            logits,
            [s.sampling for s in states],
            [s.token_ids[: s.num_prompt_tokens] for s in states],
            [s.output_token_ids for s in states],
            allowed=masks.allowed if masks is not None else None,
        )
        errors = self._structured.advance(masks, out.token_ids)  # rows whose constraint failed
        results = []
        for i, state in enumerate(states):
            token = out.token_ids[i]
            state.token_ids.append(token)
            results.append(
                Sampled(
                    request_id=state.request_id,
                    token_id=token,
                    logprob=out.logprobs[i],
                    top_logprobs=out.top_logprobs[i],
                    error=errors.get(i),
                    prompt_logprobs=state.prompt_logprobs,
                    embedding=state.embedding,
                )
            )
            state.prompt_logprobs, state.embedding = [], None  # sent with this first token
        return results


def _pooled(state: SequenceState) -> Sampled:
    """An embedding request's answer: token_id means nothing (the scheduler ends the request
    with the embedding and no token), and none joins the sequence."""
    embedding, state.embedding = state.embedding, None
    return Sampled(state.request_id, 0, embedding=embedding)


def _is_graphable(graphs: DecodeGraphs, scheduled: list[_Scheduled]) -> bool:
    """A decode-only step (one new token per sequence) of a size the graphs cover."""
    if any(item.num_new != 1 for item in scheduled):
        return False
    longest = max(item.state.num_computed + 1 for item in scheduled)
    return graphs.can_run(len(scheduled), longest)


def _decode_with_graphs(graphs: DecodeGraphs, scheduled: list[_Scheduled]) -> torch.Tensor:
    states = [item.state for item in scheduled]
    return graphs.forward(
        input_ids=[s.token_ids[s.num_computed] for s in states],
        positions=[s.num_computed for s in states],
        context_lens=[s.num_computed + 1 for s in states],
        block_tables=[s.block_tables[0] for s in states],  # graphs run one-group models only
    )


def default_kv_bytes(device: torch.device) -> int:
    """The KV cache size without --kv-cache-gb / --num-blocks (DEFAULT_*_KV_* above)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * DEFAULT_GPU_KV_FRACTION)
    return DEFAULT_CPU_KV_BYTES
