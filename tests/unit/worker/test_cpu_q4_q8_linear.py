"""The extension's 4-bit linears with int8 and int16 activations (csrc/q4_q8_matmul.cpp,
Int4Weight's kernels "int8act" and "int16act"), each: bit for bit the formula
csrc/int_activations.h states (int8_activations' reference_q4_linear), each output row the
same whatever the call's row count and thread count (what lets a speculative verify step
reproduce single-row steps), within the activations' rounding bound of float32 x dequantized
weight, at odd shapes, for GGUF's Q4_0, Q4_1 and Q4_K blocks; the weight read back exactly from
the op's layout; bad inputs refused with a message saying what was expected. The Q8_0 head's
ops (q8_0_q8_matmul.cpp) are held to the same; and the served SmolLM2 with int8act or int16act
weights gives a sequence the same hidden states however its prompt is chunked or batched."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from services.worker.layers import cpu_attention_ext
from services.worker.layers.attention import StepAttention
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.gguf_quant import (
    Q4_0,
    Q4_1,
    Q4_K,
    GroupQuant,
)
from services.worker.layers.int4_weight import Q4_OP, Int4Weight, int4_kernel, pack_nibbles
from services.worker.layers.int8_activations import (
    INT8,
    INT8ACT,
    INT16,
    INT16ACT,
    IntActivationsOp,
    amx_tiles,
    instruction_set,
    pack_q4_q8,
    pack_q8_0_q8,
    quantize_activations,
    reference_q4_linear,
    reference_q8_0_linear,
)
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import LoadedModel
from services.worker.model.quant import quantize_loaded
from tests.unit.worker.test_cpu_q4_linear import _gguf_groups, _groups

pytestmark = pytest.mark.usefixtures("cpu_extension")  # conftest: built if need be

KINDS = [INT8ACT, INT16ACT]
LIMIT = {INT8ACT: INT8, INT16ACT: INT16}  # the activations' largest |xq|


def _rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random activations with the cases the quantization treats apart: a group of zeros
    (d == 0), ties of x / d (127 makes d exactly 1: 0.5, 1.5 and -2.5 round to even), a group
    of one value repeated, an outlier column."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0.0
    if rows > 1:
        x[1, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])
    if rows > 2:
        x[-1, -32:] = -0.75
    x[rows // 2, -1] = 40.0
    return x


def _op(x: torch.Tensor, groups: GroupQuant, kind: IntActivationsOp) -> torch.Tensor:
    packed, pairs = pack_q4_q8(groups.q, groups.scale, groups.offset)
    return kind.op(x, packed, pairs, groups.q.shape[0])


def _reference(x: torch.Tensor, groups: GroupQuant, kind: IntActivationsOp) -> torch.Tensor:
    return reference_q4_linear(x, groups.q, groups.scale, groups.offset, LIMIT[kind])


def test_the_default_sums_integers_with_the_cpus_vector_instructions() -> None:
    """The extension is built -march=native: on a CPU with AVX512-VNNI or AVX2 the integer
    sums use them, and a float32 model's 4-bit weights default to int16act (on AVX2 alone the
    float32 op it replaces is 5-13x slower); only a CPU with neither keeps the float32 op."""
    flags = set(cpu_attention_ext._cpu_flags().split())
    isa = instruction_set()
    if {"avx512_vnni", "avx512bw"} <= flags:
        assert isa == "avx512_vnni"
    elif {"avx2", "fma", "f16c"} <= flags:
        assert isa == "avx2"
    else:
        assert isa == "plain"
    kernel = int4_kernel("auto", torch.device("cpu"), torch.float32)
    assert kernel is (INT16ACT if isa != "plain" else Q4_OP)


def test_amx_tiles_are_used_where_the_cpu_has_them_and_give_the_vector_kernels_bits() -> None:
    """On a CPU with AMX tiles (and a kernel that grants them), calls of 4 rows or more go
    through the tiles: every output is the VNNI kernel's bit for bit (a verify step still
    reproduces plain steps), for 4-bit and Q8_0 weights, int8 and int16 activations, row
    counts around the tile's 16 rows, an output count that is not a multiple of 32."""
    flags = set(cpu_attention_ext._cpu_flags().split())
    if not {"amx_tile", "amx_int8", "avx512_vnni"} <= flags:
        assert not amx_tiles()
        pytest.skip("this CPU has no AMX tiles (the vector kernel's bits are tested above)")
    assert amx_tiles()
    groups = _groups(200, 1152, seed=3, float16=True)
    q8 = torch.randint(-127, 128, (70, 576), generator=torch.Generator().manual_seed(4))
    q8_packed = pack_q8_0_q8(q8.to(torch.int8), torch.rand(70, 18).half().float())
    try:
        for rows in (4, 9, 16, 17, 40):
            for kind in KINDS:
                x = _rows(rows, 1152, seed=rows)
                x8 = _rows(rows, 576, seed=rows + 1)
                q8_op = torch.ops.layerserve.q8_0_q8_linear
                if kind is INT16ACT:
                    q8_op = torch.ops.layerserve.q8_0_q16_linear
                amx_tiles(True)
                tiles = _op(x, groups, kind), q8_op(x8, *q8_packed, 70)
                amx_tiles(False)
                vectors = _op(x, groups, kind), q8_op(x8, *q8_packed, 70)
                assert torch.equal(tiles[0], vectors[0]) and torch.equal(tiles[1], vectors[1])
    finally:
        amx_tiles(True)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 33])
@pytest.mark.parametrize("out, cols", [(37, 96), (576, 64), (130, 32), (200, 1152)])
@pytest.mark.parametrize("float16", [True, False])
def test_matches_the_reference_formula_bit_for_bit(
    kind: IntActivationsOp, rows: int, out: int, cols: int, float16: bool
) -> None:
    """Bit-equal: the reference rounds each fused multiply-add in float64 then float32, which
    differs from the op's single rounding only on a float32 tie (~2^-29 an operation); these
    fixed seeds hit none."""
    groups = _groups(out, cols, seed=rows, float16=float16)
    x = _rows(rows, cols, seed=out)
    got = _op(x, groups, kind)
    assert got.dtype == torch.float32 and got.shape == (rows, out)
    assert torch.equal(got, _reference(x, groups, kind))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("tensor_type", [Q4_0, Q4_1, Q4_K])
def test_gguf_blocks_through_int4weight_match_the_reference(
    kind: IntActivationsOp, tensor_type: int
) -> None:
    groups = _gguf_groups(tensor_type, out=130, cols=512, seed=tensor_type)
    weight = Int4Weight(groups, torch.float32, kernel=kind.name)
    assert weight.kernel is kind and weight.activations == kind.activations
    assert weight.pairs.dtype == (torch.float32 if tensor_type == Q4_K else torch.float16)
    x = _rows(5, 512, seed=tensor_type)
    expected = _reference(x, groups, kind)
    assert torch.equal(F.linear(x, weight), expected)
    assert torch.equal(weight.linear(x, None), expected)
    direct, max_rows = weight.direct_linear()
    assert torch.equal(direct(x), expected) and max_rows >= 1 << 32


BATCHES = [1, 2, 3, 4, 5, 7, 8, 16, 33, 130]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("out, cols", [(192, 576), (576, 1536), (1000, 96)])
def test_each_row_is_the_same_whatever_the_batch_and_thread_count(
    kind: IntActivationsOp, out: int, cols: int
) -> None:
    """Row i of an M-row call equals the 1-row call on row i, bit for bit, for every M, with
    one thread and two: a stream's logits do not depend on what it is batched with."""
    groups = _groups(out, cols, seed=out, float16=True)
    x = _rows(max(BATCHES), cols, seed=cols)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([_op(x[i : i + 1], groups, kind) for i in range(x.shape[0])])
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in BATCHES:
                got = _op(x[:rows].contiguous(), groups, kind)
                assert torch.equal(got, alone[:rows]), (rows, count)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("out, cols", [(192, 576), (1536, 576), (576, 1536), (45, 32)])
def test_within_the_activations_rounding_of_float32_times_the_dequantized_weight(
    kind: IntActivationsOp, out: int, cols: int
) -> None:
    """Each x moves by at most d / 2 when rounded, so an output moves by at most sum over
    groups of d / 2 * sum |q * scale| (plus float32 rounding): a bound that holds for any data.
    On random data the error is ~1% of the outputs' size (relative RMS) with int8, ~258x less
    (32767 / 127) with int16."""
    groups = _groups(out, cols, seed=cols, float16=True)
    x = torch.randn(64, cols, generator=torch.Generator().manual_seed(out))
    got = _op(x, groups, kind).double()
    exact = x.double() @ groups.dequantized().double().T
    _, d, _ = quantize_activations(x, LIMIT[kind])
    steps = (groups.q.double().unflatten(-1, (-1, 32)) * groups.scale.double()[..., None]).abs()
    bound = (d.double() / 2) @ steps.sum(-1).T
    magnitude = x.double().abs() @ groups.dequantized().double().abs().T
    assert torch.all((got - exact).abs() <= bound + magnitude * cols * 2**-23)
    relative = (got - exact).norm() / exact.norm()
    finer = INT8 / LIMIT[kind]
    assert 1e-3 * finer < relative < 0.03 * finer  # the rounding shows, and stays small


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_weight_reads_back_exactly_from_the_ops_layout(kind: IntActivationsOp) -> None:
    groups = _groups(80, 96, float16=True)  # 80: a padded third unit of 32 rows
    weight = Int4Weight(groups, torch.float32, kernel=kind.name)
    assert weight.packed.shape == (3, 12, 128) and weight.pairs.dtype == torch.float16
    assert torch.equal(weight.nibbles, pack_nibbles(groups.q))
    assert torch.equal(weight.scale, groups.scale) and torch.equal(weight.offset, groups.offset)
    assert torch.equal(weight.dequantized(), groups.dequantized())
    assert kind.name in repr(weight) and weight.tiles.numel() == 0


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_odd_shapes_and_bad_inputs(kind: IntActivationsOp) -> None:
    groups = _groups(48, 64, float16=False)  # N not a multiple of 32 or 16 units
    weight = Int4Weight(groups, torch.float32, kernel=kind.name)
    columns = torch.randn(64, 2).t()  # not contiguous: the kernel makes it so
    expected = _reference(columns.contiguous(), groups, kind)
    assert torch.equal(kind(columns, weight), expected)
    assert kind(torch.randn(2, 1, 64), weight).shape == (2, 1, 48)
    assert _op(torch.randn(0, 64), groups, kind).shape == (0, 48)
    op, packed, pairs = kind.op, weight.packed, weight.pairs
    with pytest.raises(RuntimeError, match="x \\[M, K\\] float32 contiguous"):
        op(columns, packed, pairs, 48)
    with pytest.raises(RuntimeError, match="x \\[M, K\\] float32"):
        op(torch.randn(2, 64, dtype=torch.bfloat16), packed, pairs, 48)
    with pytest.raises(RuntimeError, match="K must divide by 32 and match"):
        op(torch.randn(2, 96), packed, pairs, 48)
    with pytest.raises(RuntimeError, match="packed \\[ceil\\(N / 32\\), K / 8, 128\\] uint8"):
        op(torch.randn(2, 64), packed, pairs, 130)
    with pytest.raises(RuntimeError, match="pairs \\[ceil\\(N / 32\\), K / 32, 2, 32\\]"):
        op(torch.randn(2, 64), packed, pairs.double(), 48)
    with pytest.raises(ValueError, match=f"{kind.name} kernel needs float32 on the CPU"):
        Int4Weight(groups, torch.bfloat16, kernel=kind.name)


# The Q8_0 head's ops with int8 and int16 activations (csrc/q8_0_q8_matmul.cpp): the same
# properties.


def _q8_0(out: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random Q8_0 values (int8 q, -128 included) and float16-exact scales."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (out, cols), generator=generator).to(torch.int8)
    scale = (torch.rand(out, cols // 32, generator=generator) * 0.01).half().float()
    return q, scale


def _q8_0_op(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, kind: IntActivationsOp
) -> torch.Tensor:
    packed, scales = pack_q8_0_q8(q, scale)
    return getattr(torch.ops.layerserve, kind.head_op_name)(x, packed, scales, q.shape[0])


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("out, cols", [(37, 96), (130, 32), (1000, 576)])
def test_q8_0_matches_its_reference_and_is_batch_invariant(
    kind: IntActivationsOp, out: int, cols: int
) -> None:
    q, scale = _q8_0(out, cols, seed=out)
    x = _rows(max(BATCHES), cols, seed=cols)
    expected = reference_q8_0_linear(x, q, scale, LIMIT[kind])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in BATCHES:
                got = _q8_0_op(x[:rows].contiguous(), q, scale, kind)
                assert torch.equal(got, expected[:rows]), (rows, count)
    finally:
        torch.set_num_threads(threads)
    exact = (
        x.double() @ (q.double().unflatten(-1, (-1, 32)) * scale.double()[..., None]).flatten(1).T
    )
    relative = (expected.double() - exact).norm() / exact.norm()
    finer = INT8 / LIMIT[kind]
    assert 1e-3 * finer < relative < 0.02 * finer  # the activations' rounding, nothing more


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_q8_0_bad_inputs_are_refused(kind: IntActivationsOp) -> None:
    q, scale = _q8_0(48, 64, seed=0)
    packed, scales = pack_q8_0_q8(q, scale)
    assert packed.shape == (2, 16, 128) and scales.dtype == torch.float16
    op = getattr(torch.ops.layerserve, kind.head_op_name)
    with pytest.raises(RuntimeError, match="x \\[M, K\\] float32 contiguous"):
        op(torch.randn(64, 2).t(), packed, scales, 48)
    with pytest.raises(RuntimeError, match="K must divide by 32 and match packed's K / 4"):
        op(torch.randn(2, 96), packed, scales, 48)
    with pytest.raises(RuntimeError, match="packed \\[ceil\\(N / 32\\), K / 4, 128\\] uint8"):
        op(torch.randn(2, 64), packed, scales, 100)
    with pytest.raises(RuntimeError, match="scales \\[ceil\\(N / 32\\), K / 32, 32\\]"):
        op(torch.randn(2, 64), packed, scales.double(), 48)


# The served model with kernel "int8act" or "int16act": a sequence's hidden states do not depend
# on how its prompt is chunked or what it is batched with (what a speculative verify step needs).

BLOCK = 16
CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: k.name)
def int_model(
    smollm: LoadedModel, request: pytest.FixtureRequest
) -> tuple[IntActivationsOp, LoadedModel]:
    """The session's SmolLM2, copied, with its Q4_1 weights kept and computed by the kernel."""
    copied = dataclasses.replace(smollm, model=copy.deepcopy(smollm.model))
    return request.param, quantize_loaded(copied, "gguf", request.param.name)


def _prefill(loaded: LoadedModel, prompts: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """Each prompt's hidden states [T, d], the prompts prefilled together `chunk` tokens a step
    each, in a fresh KV cache."""
    backend = choose_attention_backend("auto", CPU, loaded.config.head_dim)
    cache = PagedKVCache(loaded.config, 2 * len(prompts), BLOCK, torch.float32, CPU)
    tables = [[2 * i, 2 * i + 1] for i in range(len(prompts))]
    done, outputs = 0, [[] for _ in prompts]
    while done < max(len(p) for p in prompts):
        query = [min(chunk, max(len(p) - done, 0)) for p in prompts]
        active = [i for i, q in enumerate(query) if q]
        context = [done + query[i] for i in active]
        attn = StepAttention.build(
            [query[i] for i in active], context, [[tables[i] for i in active]], BLOCK, CPU, backend
        )
        ids = torch.cat([prompts[i][done : done + query[i]] for i in active])
        with torch.no_grad():
            hidden = loaded.model(ids, attn.positions, attn, cache)
        for i, part in zip(active, hidden.split([query[i] for i in active]), strict=True):
            outputs[i].append(part)
        done += chunk
    return [torch.cat(parts) for parts in outputs]


def test_the_models_rows_are_the_same_however_a_prompt_is_chunked_or_batched(
    int_model: tuple[IntActivationsOp, LoadedModel],
) -> None:
    kind, model = int_model
    weights = [b for m in model.model.modules() for b in m.buffers()]
    assert any(isinstance(w, Int4Weight) for w in weights)
    assert all(w.kernel is kind for w in weights if isinstance(w, Int4Weight))
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt, other = (torch.randint(vocab, (n,), generator=generator) for n in (21, 13))
    (one_at_a_time,) = _prefill(model, [prompt], chunk=1)
    for chunk in (4, 5, 21):
        (chunked,) = _prefill(model, [prompt], chunk)
        assert torch.equal(chunked, one_at_a_time), chunk
    batched, _ = _prefill(model, [prompt, other], chunk=7)
    assert torch.equal(batched, one_at_a_time)
