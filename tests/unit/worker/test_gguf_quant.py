"""GGUF Q4_0/Q4_1/Q5_0/Q8_0/Q4_K blocks decoded without float (layers/gguf_quant.py), checked
against a decoder written from the block layout in ggml's spec and against the gguf package's
dequantize, on random blocks and on every such tensor of the packaged Gemma 3 file; and the
4-bit weights kept as the file stores them (--quantization gguf)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from gguf import quants

from services.common.gguf_file import GGUFFile
from services.worker.layers.gguf_quant import (
    BLOCK_BYTES,
    GROUP_TYPES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q8_0,
    GroupQuant,
    decode_blocks,
)
from services.worker.layers.int4_weight import INT4PACK_MAX_ROWS, Int4Weight
from services.worker.model.packaged import packaged_path

Q6_K = 14  # a scale per 16 weights: not a group-of-32 format, left to the float loader


def _spec_dequantize(raw: bytes, tensor_type: int) -> list[float]:
    """One row of blocks, element by element, as ggml's block_* and dequantize_row_* define
    them."""
    size = BLOCK_BYTES[tensor_type]
    values: list[float] = []
    for start in range(0, len(raw), size):
        block = raw[start : start + size]
        (d,) = struct.unpack("<e", block[0:2])
        if tensor_type == Q4_K:
            values += _spec_q4_k(block)
            continue
        if tensor_type == Q8_0:
            values += [d * q for q in struct.unpack("<32b", block[2:34])]
            continue
        if tensor_type == Q5_0:
            (qh,) = struct.unpack("<I", block[2:6])
            for j in range(16):  # ggml: xh_0 = ((qh >> j) << 4) & 0x10, xh_1 from bit j + 16
                values.append(d * (((block[6 + j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16))
            for j in range(16):
                values.append(d * (((block[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16))
            continue
        m = struct.unpack("<e", block[2:4])[0] if tensor_type == Q4_1 else 0.0
        qs = block[4:20] if tensor_type == Q4_1 else block[2:18]
        low = [b & 0x0F for b in qs]  # elements 0..15
        high = [b >> 4 for b in qs]  # elements 16..31
        if tensor_type == Q4_1:
            values += [d * q + m for q in low + high]
        else:
            values += [d * (q - 8) for q in low + high]
    return values


def _spec_q4_k(block: bytes) -> list[float]:
    """ggml's dequantize_row_q4_K for one 144-byte super-block (get_scale_min_k4 inlined)."""
    d, dmin = struct.unpack("<ee", block[0:4])
    scales, qs = block[4:16], block[16:144]

    def scale_min(j: int) -> tuple[int, int]:
        if j < 4:
            return scales[j] & 63, scales[j + 4] & 63
        low = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4)
        return low, (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)

    values: list[float] = []
    for chunk in range(4):  # 64 weights: two groups from the same 32 bytes
        q = qs[32 * chunk : 32 * chunk + 32]
        (sc1, m1), (sc2, m2) = scale_min(2 * chunk), scale_min(2 * chunk + 1)
        values += [d * sc1 * (b & 0xF) - dmin * m1 for b in q]
        values += [d * sc2 * (b >> 4) - dmin * m2 for b in q]
    return values


def _random_blocks(tensor_type: int, rows: int, groups: int, seed: int) -> np.ndarray:
    """uint8 [rows, groups * block bytes] with finite float16 scales and random payloads
    (Q4_K: `groups` super-blocks of eight groups each)."""
    rng = np.random.default_rng(seed)
    size = BLOCK_BYTES[tensor_type]
    data = rng.integers(0, 256, (rows, groups, size), dtype=np.uint8)
    halves = 2 if tensor_type in (Q4_1, Q4_K) else 1  # d (and m, dmin) as real float16 numbers
    scales = rng.normal(0, 0.05, (rows, groups, halves)).astype(np.float16)
    data[..., : 2 * halves] = scales.view(np.uint8).reshape(rows, groups, 2 * halves)
    return data.reshape(rows, groups * size)


@pytest.mark.parametrize("tensor_type", [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K])
def test_decoded_blocks_equal_the_spec_and_gguf_exactly(tensor_type: int) -> None:
    blocks = 1 if tensor_type == Q4_K else 8  # 256 weights a row either way
    data = _random_blocks(tensor_type, rows=3, groups=blocks, seed=tensor_type)
    decoded = decode_blocks(data, tensor_type)
    assert decoded.q.shape == (3, 256) and decoded.scale.shape == (3, 8)
    assert decoded.bits == (8 if tensor_type in (Q5_0, Q8_0) else 4)
    spec = torch.tensor([_spec_dequantize(row.tobytes(), tensor_type) for row in data])
    assert torch.equal(decoded.dequantized(), spec.float())
    assert torch.equal(
        decoded.dequantized(), torch.from_numpy(quants.dequantize(data, tensor_type))
    )


def test_the_packaged_gemma_files_tensors_decode_as_gguf_dequantizes_them() -> None:
    """The Gemma 3 270M Q4_K_M file: the first tensor of each role in each group type (Q5_0
    attn_q/k/v and ffn_gate/up, Q8_0 attn_v, Q4_K attn_output and ffn_down), bit for bit; the
    rest of the file is F32 norms, Q6_K (left to the float loader) and the Q8_0 table."""
    tensors = GGUFFile(packaged_path()).tensors
    firsts = {}
    for tensor in tensors:
        role = tensor.name.split(".")[-2]  # blk.N.attn_q.weight -> attn_q
        firsts.setdefault((int(tensor.tensor_type), role), tensor)
    checked = {
        key: t for key, t in firsts.items() if key[0] in GROUP_TYPES and key[1] != "token_embd"
    }
    for (tensor_type, _), tensor in checked.items():
        expected = np.ascontiguousarray(quants.dequantize(tensor.data, tensor_type))
        got = decode_blocks(tensor.data, tensor_type).dequantized()
        assert torch.equal(got, torch.from_numpy(expected)), tensor.name
    assert len(checked) == 8 and {t for t, _ in checked} == {Q5_0, Q8_0, Q4_K}
    assert {int(t.tensor_type) for t in tensors} - GROUP_TYPES == {0, Q6_K}  # F32 norms, Q6_K


def test_other_types_and_ragged_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="not one of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K"):
        decode_blocks(np.zeros((2, 210), np.uint8), Q6_K)
    with pytest.raises(ValueError, match="whole 20-byte blocks"):
        decode_blocks(np.zeros((2, 30), np.uint8), Q4_1)


@pytest.mark.parametrize("tensor_type", [Q4_0, Q4_1])
@pytest.mark.parametrize("kernel", ["int4pack", "dequant", "auto"])
def test_int4_weight_from_gguf_blocks_computes_the_files_weight(
    tensor_type: int, kernel: str
) -> None:
    groups = decode_blocks(_random_blocks(tensor_type, rows=64, groups=4, seed=7), tensor_type)
    weight = Int4Weight(groups, torch.float32, kernel)
    reference = groups.dequantized()
    assert torch.equal(weight.dequantized(), reference)  # the scale/zero mapping is exact
    for rows in (1, 5, 300):  # both sides of auto's switch
        x = torch.randn(rows, 128)
        expected = x @ reference.T
        # int4pack computes float32 activations in bfloat16 (8 bits of mantissa); auto sums in
        # float32 (the C++ op) or rounds them to int16 per 32 columns (int16act, with VNNI or AVX2)
        # when the extension is built, else int4pack up to its rows and dequantize-then-GEMM
        op = weight.kernel.name in ("q4_linear", "int16act")
        bfloat16_path = kernel == "int4pack" or (
            kernel == "auto" and not op and rows <= INT4PACK_MAX_ROWS
        )
        relative = 1e-4 if weight.kernel.name == "int16act" else 1e-5
        tolerance = (2e-2 if bfloat16_path else relative) * expected.abs().max().item()
        assert (weight.linear(x, None) - expected).abs().max() <= tolerance
    ids = torch.tensor([[3, 0], [63, 3]])
    assert torch.equal(torch.nn.functional.embedding(ids, weight), reference[ids])


def test_int4_quantized_float_weight_is_within_half_a_step_per_group() -> None:
    w = torch.randn(48, 96)
    weight = Int4Weight.quantize(w)
    step = weight.scale.repeat_interleave(32, dim=1)
    assert ((weight.dequantized() - w).abs() <= step / 2 + 1e-6).all()
    assert weight.nibbles.dtype == torch.uint8 and weight.nibbles.shape == (48, 48)


def test_bfloat16_int4pack_agrees_with_its_dequantized_reference() -> None:
    groups = decode_blocks(_random_blocks(Q4_1, rows=32, groups=2, seed=3), Q4_1)
    weight = Int4Weight(groups, torch.bfloat16, "int4pack")
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    expected = x.float() @ weight.dequantized().float().T
    tolerance = 2e-2 * expected.abs().max().item()  # bfloat16: 8 bits of mantissa
    assert (weight.linear(x, None).float() - expected).abs().max() <= tolerance


def test_rows_stack_and_reorder() -> None:
    a = decode_blocks(_random_blocks(Q4_0, 2, 1, seed=1), Q4_0)
    b = decode_blocks(_random_blocks(Q4_1, 3, 1, seed=2), Q4_1)
    both = GroupQuant.cat([a, b])
    assert torch.equal(both.dequantized(), torch.cat([a.dequantized(), b.dequantized()]))
    swapped = both.take_rows(np.array([4, 0, 1, 2, 3]))
    assert torch.equal(swapped.dequantized()[0], b.dequantized()[2])
    with pytest.raises(ValueError, match="4-bit and 8-bit"):
        GroupQuant.cat([a, decode_blocks(_random_blocks(Q8_0, 1, 1, seed=3), Q8_0)])


def test_auto_keeps_a_4_bit_gguf_on_the_cpu_only(tmp_path) -> None:
    from services.worker.model.loader import default_path
    from services.worker.model.quant_choice import keeps_four_bit, resolve_quantization

    packaged = default_path()  # SmolLM2 Q4_1
    assert resolve_quantization("auto", packaged, "cpu").method == "gguf"
    assert resolve_quantization("auto", packaged, "cuda").method == "none"
    assert resolve_quantization("auto", packaged, "cpu", "float32").method == "gguf"
    assert resolve_quantization("auto", tmp_path, "cpu").method == "none"  # a float checkpoint
    # What --dtype auto asks before the load (the worker then computes the rest in float32).
    assert keeps_four_bit("auto", packaged, "cpu") and keeps_four_bit("gguf", packaged, "cuda")
    assert not keeps_four_bit("auto", packaged, "cuda") and not keeps_four_bit(
        "none", packaged, "cpu"
    )
    assert not keeps_four_bit("auto", tmp_path, "cpu") and not keeps_four_bit("auto", None, "cpu")
    gemma = packaged_path()  # Gemma 3 Q4_K_M: Q4_K kept 4-bit, Q5_0/Q8_0 as int8 beside them
    assert resolve_quantization("auto", gemma, "cpu").method == "gguf"
    assert "Q4_K weights kept 4-bit" in resolve_quantization("auto", gemma, "cpu").reason
    assert keeps_four_bit("auto", gemma, "cpu") and not keeps_four_bit("auto", gemma, "cuda")
    assert resolve_quantization("int8", packaged, "cpu").reason == "--quantization"
    with pytest.raises(ValueError, match="--quantization must be one of auto, none"):
        resolve_quantization("fp4", packaged, "cpu")
