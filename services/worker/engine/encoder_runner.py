"""The worker's engine for an encoder (a sentence-embedding model, model/bert.py): it executes
the scheduler's plans as ModelRunner does, prefill only.

Bidirectional attention needs every token of a prompt at once, and the worker has them all from
the plan that brings a sequence (NewSequence.token_ids): the whole prompt is encoded in that
step, whatever chunk of it the scheduler budgeted, and pooled as the request asks (mean or
last position, L2-normalised). Its later chunks cost nothing. When the scheduler's count of
computed tokens reaches the prompt's end, the sequence's answer carries the embedding, with a
placeholder token that nobody keeps. Nothing is kept between requests, so the KV blocks the
scheduler hands out are bookkeeping only: num_blocks bounds the tokens in flight, it allocates
no memory. A request for text ends with an error: an encoder has no output head.

execute() is synchronous and meant for the worker's model thread, like ModelRunner's."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from services.common.errors import InvalidArgument
from services.worker.engine.plan import NewSequence, Sampled, StepPlan
from services.worker.engine.sequences import PlanLimits, SequenceState, validate_plan
from services.worker.model.loaded import LoadedModel

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The token_id of an encoder's answers: id 0 exists in every vocabulary; an embedding request's
# answer brings its vector, not a token.
PLACEHOLDER_TOKEN = 0
# Without --num-blocks: 65,536 tokens in flight at 16 a block (bookkeeping, no memory).
DEFAULT_NUM_BLOCKS = 4096


class EncoderRunner:
    kernels = "torch"  # attention is torch's scaled_dot_product_attention
    kv_cache_groups = ()  # one group of every layer, as far as the scheduler is concerned

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        model_name: str,
        max_model_len: int | None = None,
        block_size: int = 16,
        num_blocks: int = DEFAULT_NUM_BLOCKS,
    ) -> None:
        config = loaded.config
        limit = config.max_position_embeddings
        if max_model_len is not None and not 0 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}], got {max_model_len}")
        self._model = loaded.model
        self.model_name = model_name
        self.fingerprint = loaded.fingerprint
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len or limit
        self.vocab_size = config.vocab_size
        self.eos_token_ids: tuple[int, ...] = ()
        first = next(self._model.parameters())
        self._device = first.device
        self.device, self.dtype = str(first.device), str(first.dtype).removeprefix("torch.")
        self._requests: dict[str, SequenceState] = {}
        self._limits = PlanLimits(block_size, num_blocks, self.max_model_len, self.vocab_size)

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        model_name: str,
        dtype: str = "float32",
        device: str = "cpu",
        block_size: int = 16,
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        quantization: str = "none",
    ) -> EncoderRunner:
        """Loads the encoder checkpoint at `path` (a Hugging Face directory). Its weights stay
        in the compute dtype: quantization "auto" means none, another method is refused."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if quantization not in ("none", "auto"):
            raise ValueError(f"--quantization {quantization}: an encoder's weights stay as loaded")
        from services.worker.model.loader import load_model  # imports safetensors, gguf

        loaded = load_model(path, dtype=DTYPES[dtype], device=torch.device(device))
        return cls(
            loaded,
            model_name=model_name,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks or DEFAULT_NUM_BLOCKS,
        )

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def execute(self, plan: StepPlan) -> list[Sampled]:
        """Encodes the new sequences' prompts; answers those whose prompt is now all counted.

        The plan is checked in full first: a ValueError leaves the requests untouched."""
        validate_plan(plan, self._requests, self._limits)
        for seq in plan.new:
            if seq.num_prompt_tokens > self.max_model_len:
                raise ValueError(f"{seq.request_id!r}: prompt longer than {self.max_model_len}")
        for request_id in plan.finished_ids:
            self._requests.pop(request_id, None)
        new = [self._register(seq) for seq in plan.new]
        if new:
            with torch.inference_mode():
                self._encode(new)
        stepped = [(state, seq.num_new_tokens) for state, seq in zip(new, plan.new, strict=True)]
        stepped += [(self._requests[d.request_id], d.num_new_tokens) for d in plan.running]
        results = []
        for state, num_new in stepped:
            if num_new == 0:
                continue
            state.num_computed += num_new
            if state.num_computed >= len(state.token_ids):
                results.append(self._answer(state))
        return results

    def _register(self, seq: NewSequence) -> SequenceState:
        state = SequenceState.of(seq)
        self._requests[seq.request_id] = state
        return state

    def _encode(self, states: list[SequenceState]) -> None:
        """One padded forward over the states' whole prompts; each state.embedding set."""
        prompts = [state.token_ids[: state.num_prompt_tokens] for state in states]
        lengths = torch.tensor([len(p) for p in prompts], device=self._device)
        padded = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.int64)
        for row, prompt in zip(padded, prompts, strict=True):
            row[: len(prompt)] = torch.tensor(prompt)
        hidden = self._model(padded.to(self._device), lengths)  # [S, L, d]
        for i, state in enumerate(states):
            rows = hidden[i, : len(prompts[i])].float()  # [n, d]
            vector = rows[-1] if state.sampling.pooling == "last" else rows.mean(dim=0)
            state.embedding = F.normalize(vector, dim=0).tolist()

    def _answer(self, state: SequenceState) -> Sampled:
        state.token_ids.append(PLACEHOLDER_TOKEN)
        if state.sampling.pooling is None:
            error = InvalidArgument(
                f"model {self.model_name!r} is a sentence-embedding model: it serves "
                "/v1/embeddings (and gRPC Embed) only, not text generation"
            )
            return Sampled(state.request_id, PLACEHOLDER_TOKEN, error=error)
        embedding, state.embedding = state.embedding, None  # sent once, with this token
        return Sampled(state.request_id, PLACEHOLDER_TOKEN, embedding=embedding)
