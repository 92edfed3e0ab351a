"""The extension's 4-bit linear with float32 activations (csrc/q4_matmul.cpp, what a float32
model's Int4Weight computes every linear with, issue 29): the file's 4-bit weights times
float32 rows as dequantize-then-GEMM gives them, up to float32 rounding, at odd shapes and row
counts on both sides of its register tiles, its 64-row blocks and its two paths (up to 4 rows
streaming, above them decoded to float32 per block), for GGUF's Q4_0, Q4_1 and Q4_K blocks
(float16 and float32 scale pairs), with one thread and two; the weight read back exactly from
the op's layout; bad inputs refused with a message saying what was expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from services.worker.layers.gguf_quant import (
    BLOCK_BYTES,
    Q4_0,
    Q4_1,
    Q4_K,
    GroupQuant,
    decode_blocks,
)
from services.worker.layers.int4_weight import (
    Q4_OP,
    Int4Weight,
    pack_nibbles,
    pack_q4_columns,
    quantize_int4,
)

pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be


def _groups(out: int, cols: int, seed: int = 0, float16: bool = False) -> GroupQuant:
    """Random 4-bit groups; float16: scales and offsets rounded to float16, as GGUF's are."""
    generator = torch.Generator().manual_seed(seed)
    groups = quantize_int4(torch.randn(out, cols, generator=generator))
    if not float16:
        return groups
    scale, offset = groups.scale.half().float(), groups.offset.half().float()
    return GroupQuant(groups.q, scale, offset, bits=4)


def _gguf_groups(tensor_type: int, out: int, cols: int, seed: int) -> GroupQuant:
    """A GGUF tensor of random blocks (finite float16 d and m, random nibbles), decoded as the
    loader decodes a file's (Q4_K: cols a multiple of its 256-weight super-blocks)."""
    rng = np.random.default_rng(seed)
    per_block = 256 if tensor_type == Q4_K else 32
    blocks = rng.integers(0, 256, (out, cols // per_block, BLOCK_BYTES[tensor_type]), np.uint8)
    halves = 1 if tensor_type == Q4_0 else 2  # d, and Q4_1's m or Q4_K's dmin
    scales = rng.normal(0, 0.05, (out, cols // per_block, halves)).astype(np.float16)
    blocks[..., : 2 * halves] = scales.view(np.uint8).reshape(*scales.shape[:2], 2 * halves)
    return decode_blocks(blocks.reshape(out, -1), tensor_type)


def _assert_close_to_reference(got: torch.Tensor, x: torch.Tensor, groups: GroupQuant) -> None:
    """Within float32 rounding of the exact product: up to 4 rows the op sums q * x per group,
    then scales and adds offset * sum(x); above, it sums w * x with w = q * scale + offset.
    Either way at most K ulps of |x| . (|q * scale| + |offset|) an output."""
    expected = x.double() @ groups.dequantized().double().T
    q = groups.q.double().unflatten(-1, (-1, 32))
    magnitude = (q * groups.scale.double()[..., None]).abs() + groups.offset.double()[
        ..., None
    ].abs()
    bound = (x.double().abs() @ magnitude.flatten(-2).T) * x.shape[-1] * 2**-24
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert torch.all((got.double() - expected).abs() <= bound)


def _op(x: torch.Tensor, groups: GroupQuant) -> torch.Tensor:
    packed, pairs = pack_q4_columns(pack_nibbles(groups.q), groups.scale, groups.offset)
    return torch.ops.layerserve.q4_linear(x, packed, pairs, groups.q.shape[0])


ROWS = [1, 2, 3, 4, 5, 7, 16, 33, 64, 300]  # both paths, whole and partial tiles and panels


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out, cols", [(37, 96), (576, 64), (130, 32), (200, 1152)])
@pytest.mark.parametrize("float16", [True, False])
def test_matches_dequantize_then_gemm(rows: int, out: int, cols: int, float16: bool) -> None:
    groups = _groups(out, cols, seed=rows, float16=float16)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(out))
    _assert_close_to_reference(_op(x, groups), x, groups)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tensor_type", [Q4_0, Q4_1, Q4_K])
def test_gguf_blocks_match_dequantize_then_gemm(tensor_type: int, threads: int) -> None:
    groups = _gguf_groups(tensor_type, out=130, cols=512, seed=tensor_type)
    weight = Int4Weight(groups, torch.float32)
    # Q4_0's d and -8d and Q4_1's d and m are float16; Q4_K's d * sc and -dmin * m are not
    assert weight.pairs.dtype == (torch.float32 if tensor_type == Q4_K else torch.float16)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in ROWS:
            x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
            _assert_close_to_reference(F.linear(x, weight), x, groups)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("rows", [1, 3, 5, 64, 300])
@pytest.mark.parametrize("out", [192, 320, 1536])
def test_two_threads_give_the_same_result_as_one(rows: int, out: int) -> None:
    """However the work is cut for the threads (halves of K at few blocks, panels of rows),
    each output is summed in one order."""
    groups, x = _groups(out, 576), torch.randn(rows, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _op(x, groups)
        torch.set_num_threads(2)
        two = _op(x, groups)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_the_weight_reads_back_exactly_from_the_ops_layout() -> None:
    groups = _groups(80, 96, float16=True)  # 80: a padded second block
    weight = Int4Weight(groups, torch.float32, "q4_linear")
    assert weight.kernel is Q4_OP and weight.pairs.dtype == torch.float16
    assert torch.equal(weight.nibbles, pack_nibbles(groups.q))
    assert torch.equal(weight.scale, groups.scale) and torch.equal(weight.offset, groups.offset)
    assert torch.equal(weight.dequantized(), groups.dequantized())
    ids = torch.tensor([[79, 0], [64, 3]])
    assert torch.equal(F.embedding(ids, weight), groups.dequantized()[ids])
    assert Int4Weight(_groups(80, 96), torch.float32).pairs.dtype == torch.float32  # min/max


def test_other_layouts_go_through_the_kernel_and_bad_inputs_are_refused() -> None:
    groups = _groups(48, 64)
    weight = Int4Weight(groups, torch.float32, "q4_linear")
    columns = torch.randn(64, 2).t()  # not contiguous: the kernel makes it so
    _assert_close_to_reference(Q4_OP(columns, weight), columns, groups)
    batched = torch.randn(2, 1, 64)
    assert Q4_OP(batched, weight).shape == (2, 1, 48)
    op, packed, pairs = torch.ops.layerserve.q4_linear, weight.packed, weight.pairs
    with pytest.raises(RuntimeError, match="x \\[M, K\\] float32 contiguous"):
        op(columns, packed, pairs, 48)
    with pytest.raises(RuntimeError, match="x \\[M, K\\] float32"):
        op(torch.randn(2, 64, dtype=torch.bfloat16), packed, pairs, 48)
    with pytest.raises(RuntimeError, match="K must divide by 32 and match"):
        op(torch.randn(2, 96), packed, pairs, 48)
    with pytest.raises(RuntimeError, match="packed \\[ceil\\(N / 64\\), K / 2, 64\\] uint8"):
        op(torch.randn(2, 64), packed, pairs, 130)
    with pytest.raises(RuntimeError, match="pairs \\[ceil\\(N / 64\\), K / 32, 2, 64\\]"):
        op(torch.randn(2, 64), packed, pairs.double(), 48)


@pytest.mark.parametrize("rows", [1, 7, 257, 1024])
def test_a_float32_weight_sums_in_float32_at_every_batch_size(rows: int) -> None:
    """Int4Weight's q4_linear kernel for a float32 weight (--activations float32; "auto"
    without VNNI or AVX2): the op at every row count, summing the file's values in float32
    (int4pack's bfloat16 activations would be ~1e-2 off), with no int4pack tiles held; bfloat16
    models keep int4pack."""
    groups = _groups(96, 576, float16=True)
    weight = Int4Weight(groups, torch.float32, "q4_linear")
    x = torch.randn(rows, 576)
    exact = x.double() @ groups.dequantized().double().T
    error = (F.linear(x, weight).double() - exact).abs().max()
    assert error < 1e-4 * exact.abs().max()
    assert weight.kernel is Q4_OP and weight.linear(x, None).shape == (rows, 96)
    assert weight.tiles.numel() == 0 and weight.scales_and_zeros.numel() == 0
    bfloat16 = Int4Weight(_groups(96, 576), torch.bfloat16)
    assert bfloat16.kernel.small is not Q4_OP and bfloat16.packed.numel() == 0
