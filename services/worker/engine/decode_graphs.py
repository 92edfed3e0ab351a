"""Decode steps replayed as CUDA graphs, one graph per captured batch size.

A decode step of a small model launches a few hundred kernels whose launch cost, not the memory
traffic, sets the step time. Capturing the forward once per batch size and replaying it makes a
step one launch. A graph freezes its inputs' addresses and shapes, so every step copies its
token ids, positions, slots, block tables and context lengths into static buffers and pads the
batch up to the next captured size: padding rows write their K/V nowhere (slot -1) and attend to
one key of block 0, and their outputs are dropped.

The decode kernel's split count is frozen too: it is sized for max_model_len, so shorter
contexts leave some splits empty, which the kernel skips.

On a device without CUDA graphs (the CPU, in tests) the same static buffers and padding are run
eagerly: the code that fills them is the same either way; only the split count then fits the
step's longest context."""

from __future__ import annotations

import bisect
import logging
import time

import torch

from services.worker.layers.attention import AttentionBackend, StepAttention
from services.worker.layers.attention_metadata import AttentionMetadata
from services.worker.layers.kv_cache import PagedKVCache

log = logging.getLogger(__name__)

# Every size up to 8, then steps that waste at most a third of a padded batch.
_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
PAD_SLOT = -1


def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes to capture: the ladder up to max_batch, and max_batch itself."""
    if max_batch < 1:
        raise ValueError(f"the CUDA graph max batch must be >= 1, got {max_batch}")
    sizes = [size for size in _CAPTURE_SIZES if size < max_batch]
    return sizes + [max_batch]


class DecodeGraphs:
    """The model's forward for decode-only steps of up to max_batch sequences.

    forward() returns the final hidden states [B, d] of B sequences, one new token each."""

    def __init__(
        self,
        model: torch.nn.Module,
        cache: PagedKVCache,
        backend: AttentionBackend,
        *,
        max_batch: int,
        max_model_len: int,
        hidden_size: int,
    ) -> None:
        self._model = model
        self._cache = cache
        self._backend = backend  # one whose metadata holds device tensors only (Triton's)
        self._sizes = capture_sizes(max_batch)
        self._max_model_len = max_model_len
        keys = cache.layer(0)[0]  # [num_blocks, block_size, Hkv, D]
        self._device = keys.device
        self._use_graphs = self._device.type == "cuda"
        block_size = cache.block_size
        largest = self._sizes[-1]
        max_blocks = -(-max_model_len // block_size)
        index = {"dtype": torch.int64, "device": self._device}
        self._input_ids = torch.zeros(largest, **index)
        self._positions = torch.zeros(largest, **index)
        self._slots = torch.full((largest,), PAD_SLOT, **index)
        self._context_lens = torch.ones(largest, **index)
        self._block_tables = torch.zeros((largest, max_blocks), **index)
        self._query_start = torch.arange(largest + 1, **index)
        self._eager_out = torch.empty((largest, hidden_size), dtype=keys.dtype, device=keys.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.steps_run = 0  # forward() calls: how many decode steps went through here

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def max_batch(self) -> int:
        return self._sizes[-1]

    @property
    def uses_cuda_graphs(self) -> bool:
        return self._use_graphs

    def can_run(self, batch: int, max_context_len: int) -> bool:
        return 0 < batch <= self.max_batch and max_context_len <= self._max_model_len

    def capture(self) -> float:
        """Captures a graph per batch size, largest first (so the shared memory pool is sized
        once); returns the seconds it took. A no-op off CUDA."""
        if not self._use_graphs:
            return 0.0
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self._sizes):
            self._capture_one(size, pool)
        torch.cuda.synchronize(self._device)
        elapsed = time.perf_counter() - started
        log.info("captured decode CUDA graphs for batch sizes %s in %.1f s", self._sizes, elapsed)
        return elapsed

    def _capture_one(self, size: int, pool: tuple[int, int]) -> None:
        attn = self._metadata(size)
        ids, positions = self._input_ids[:size], self._positions[:size]
        # Eager runs first: Triton compiles this size's kernel variants outside the capture.
        side = torch.cuda.Stream(self._device)
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._model(ids, positions, attn, self._cache)
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._outputs[size] = self._model(ids, positions, attn, self._cache)
        self._graphs[size] = graph

    def forward(
        self,
        input_ids: list[int],
        positions: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
    ) -> torch.Tensor:
        """One token per sequence: ids, positions, context lengths [B] and block tables (each
        covering its context) -> final-normed hidden states [B, d]."""
        batch = len(input_ids)
        size = self._sizes[bisect.bisect_left(self._sizes, batch)]
        self._fill(input_ids, positions, context_lens, block_tables, size)
        self.steps_run += 1
        if self._use_graphs:
            self._graphs[size].replay()
            return self._outputs[size][:batch]
        # Eager, nothing is frozen: the kernel's splits fit this step's longest context.
        attn = self._metadata(size, max_context_len=max(context_lens))
        out = self._model(self._input_ids[:size], self._positions[:size], attn, self._cache)
        self._eager_out[:size].copy_(out)
        return self._eager_out[:batch]

    def _fill(
        self,
        input_ids: list[int],
        positions: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        size: int,
    ) -> None:
        """Writes this step's inputs into rows [0, B) and padding into rows [B, size)."""
        batch, block_size = len(input_ids), self._cache.block_size
        slots = [
            table[pos // block_size] * block_size + pos % block_size
            for table, pos in zip(block_tables, positions, strict=True)
        ]
        widest = max(len(table) for table in block_tables)
        tables = torch.zeros((batch, widest), dtype=torch.int64)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int64)
        rows = torch.tensor([input_ids, positions, slots, context_lens], dtype=torch.int64)
        self._input_ids[:batch].copy_(rows[0], non_blocking=True)
        self._positions[:batch].copy_(rows[1], non_blocking=True)
        self._slots[:batch].copy_(rows[2], non_blocking=True)
        self._context_lens[:batch].copy_(rows[3], non_blocking=True)
        # Columns past a row's context are never read, so stale entries there are harmless.
        self._block_tables[:batch, :widest].copy_(tables, non_blocking=True)
        if size > batch:
            self._input_ids[batch:size].zero_()
            self._positions[batch:size].zero_()
            self._slots[batch:size].fill_(PAD_SLOT)
            self._context_lens[batch:size].fill_(1)
            self._block_tables[batch:size, 0].zero_()

    def _metadata(self, size: int, max_context_len: int | None = None) -> StepAttention:
        """The attention layout every captured step of this size shares: views of the buffers
        (one KV cache group: the runner captures graphs only for one-group models).

        max_context_len bounds the contexts; captured graphs take max_model_len."""
        longest = max_context_len or self._max_model_len
        group = AttentionMetadata(
            query_start=self._query_start[: size + 1],
            query_lens=[1] * size,
            context_lens=[longest] * size,
            block_tables=self._block_tables[:size],
            slot_mapping=self._slots[:size],
            positions=self._positions[:size],
            block_size=self._cache.block_size,
            max_query_len=1,
            max_context_len=longest,
            context_lens_device=self._context_lens[:size],
        )
        return StepAttention((group,), self._backend)
