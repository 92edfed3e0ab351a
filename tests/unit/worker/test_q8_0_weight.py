"""GGUF's Q8_0 embedding / output head kept as the file stores it (issue 29): the op gives the
float weight's matmul up to float32 summation order, a lookup gives the float rows exactly, and
the packaged SmolLM2 under --quantization gguf keeps its tied table in a quarter of the bytes
with the same greedy text as with the table in float32."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from tokenizers import Tokenizer
from torch import nn

from services.worker.layers.gguf_quant import GroupQuant
from services.worker.layers.q8_0_weight import (
    DEQUANTIZED_SLICE_ROWS,
    Q8_0_OP_MAX_ROWS,
    Q8_0Weight,
    q8_0_op_available,
)
from services.worker.model.loader import LoadedModel
from services.worker.model.quant import weight_bytes
from tests.unit.worker.test_quant import PROMPTS, _greedy

pytestmark = pytest.mark.skipif(
    not q8_0_op_available(), reason="C++ extension not built (make install)"
)


def _random_q8_0(rows: int, cols: int, seed: int = 0, activations: str = "float32") -> Q8_0Weight:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=generator)
    # float16 scales, as the file's d: their products with q are exact in float32
    scale = (torch.rand(rows, cols // 32, generator=generator) * 0.02).half().float()
    groups = GroupQuant(q, scale, torch.zeros_like(scale), bits=8)
    return Q8_0Weight(groups, activations=activations)


@pytest.mark.parametrize("cols", [576, 96])  # 96: a multiple of 32, not of 64
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_head_matmul_equals_the_float_weights_up_to_summation_order(rows: int, cols: int) -> None:
    weight = _random_q8_0(300, cols)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1))
    got = torch.nn.functional.linear(x, weight)
    expected = x.double() @ weight.dequantized().double().T
    assert got.dtype == torch.float32 and got.shape == (rows, 300)
    # float32 sums of `cols` products, each |x * w| small: a few ulps of the magnitudes summed
    bound = (x.double().abs() @ weight.dequantized().double().abs().T) * cols * 2**-24
    assert torch.all((got.double() - expected).abs() <= bound)


@pytest.mark.parametrize("activations, bound", [("int8", 0.02), ("int16", 1e-4)])
def test_with_integer_activations_every_row_count_gives_each_row_the_same_bits(
    activations: str, bound: float
) -> None:
    """The head beside the int8act or int16act linears: integer activations and int32 sums at
    every row count (no BLAS slices above 32 rows), so a row's logits do not depend on its
    batch; within the activations' rounding of the float weights' matmul."""
    weight = _random_q8_0(300, 96, activations=activations)
    assert weight.packed is not None
    x = torch.randn(70, 96, generator=torch.Generator().manual_seed(3))
    together = torch.nn.functional.linear(x, weight)
    alone = torch.cat([torch.nn.functional.linear(row[None], weight) for row in x])
    assert torch.equal(together, alone)
    expected = x @ weight.dequantized().T
    # measured ~0.005 (int8), ~2e-5 (int16)
    assert (together - expected).norm() / expected.norm() < bound
    assert torch.equal(weight.embedding(torch.tensor([5])), weight.dequantized()[5:6])


@pytest.mark.parametrize("rows", [Q8_0_OP_MAX_ROWS + 1, 70])
def test_many_rows_take_dequantized_slices_and_equal_the_float_weights(rows: int) -> None:
    """Above the op's rows, BLAS on the weight dequantized slice by slice (a last slice
    shorter): the float weights' own GEMM, slice by slice."""
    out_rows = 2 * DEQUANTIZED_SLICE_ROWS + 77
    weight = _random_q8_0(out_rows, 96)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(2))
    got = torch.nn.functional.linear(x, weight)
    expected = x.double() @ weight.dequantized().double().T
    assert got.shape == (rows, out_rows)
    bound = (x.double().abs() @ weight.dequantized().double().abs().T) * 96 * 2**-24
    assert torch.all((got.double() - expected).abs() <= bound)


def test_embedding_lookup_gives_the_dequantized_rows_exactly() -> None:
    weight = _random_q8_0(300, 576)
    ids = torch.tensor([[0, 299, 7], [7, 150, 3]])
    rows = torch.nn.functional.embedding(ids, weight)
    assert torch.equal(rows, weight.dequantized()[ids])


def test_embedding_lookup_from_the_packed_layout_is_exact() -> None:
    """A head packed for the integer ops (32 rows a unit, the last one padded) looks its rows
    up in one op (q8_0_rows): the dequantized rows exactly, any shape of ids; a bad id is an
    error, not a read outside the weight."""
    weight = _random_q8_0(300, 576, activations="int16")
    assert weight.packed is not None
    ids = torch.tensor([[0, 299, 7], [7, 150, 3]])
    rows = torch.nn.functional.embedding(ids, weight)
    assert rows.shape == (2, 3, 576)
    assert torch.equal(rows, weight.dequantized()[ids])
    with pytest.raises(RuntimeError, match="outside"):
        weight.embedding(torch.tensor([300]))


def test_tied_q8_0_table_is_kept_as_the_files_values_in_a_quarter_of_the_bytes(
    smollm: LoadedModel, smollm_gguf: LoadedModel
) -> None:
    table = smollm_gguf.model.embed_tokens
    assert isinstance(table, Q8_0Weight)
    assert torch.equal(table.dequantized(), smollm.model.embed_tokens)
    kept = weight_bytes(smollm_gguf.model)
    with _float_table(smollm_gguf.model):
        saved = weight_bytes(smollm_gguf.model) - kept
    assert 80e6 < saved < 90e6  # 113 MB of float32 against 28 MB of int8 + 3.5 MB of scales


def test_greedy_text_equals_the_float_tables(
    smollm_gguf: LoadedModel, tokenizer: Tokenizer
) -> None:
    prompts = [tokenizer.encode(text).ids for text in PROMPTS[:3]]
    kept = _greedy(smollm_gguf, prompts)
    with _float_table(smollm_gguf.model):
        assert kept == _greedy(smollm_gguf, prompts)


@contextlib.contextmanager
def _float_table(model: nn.Module) -> Iterator[None]:
    """`model` with its Q8_0 table as the float32 parameter the loader made, for the block."""
    kept = model._buffers.pop("embed_tokens")
    model.embed_tokens = nn.Parameter(kept.dequantized(), requires_grad=False)
    try:
        yield
    finally:
        del model._parameters["embed_tokens"]
        model.register_buffer("embed_tokens", kept)
