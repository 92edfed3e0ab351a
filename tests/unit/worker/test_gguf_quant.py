"""GGUF Q4_0/Q4_1/Q8_0 blocks decoded without float (layers/gguf_quant.py), checked against a
decoder written from the block layout in ggml's spec, and the packaged SmolLM2's 4-bit weights
kept as the file stores them (--quantization gguf)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from gguf import quants

from services.worker.layers.gguf_quant import Q4_0, Q4_1, Q8_0, GroupQuant, decode_blocks
from services.worker.layers.int4_weight import INT4PACK_MAX_ROWS, Int4Weight


def _spec_dequantize(raw: bytes, tensor_type: int) -> list[float]:
    """One row of blocks, element by element, as ggml's block_q4_0/q4_1/q8_0 define them."""
    size = {Q4_0: 18, Q4_1: 20, Q8_0: 34}[tensor_type]
    values: list[float] = []
    for start in range(0, len(raw), size):
        block = raw[start : start + size]
        (d,) = struct.unpack("<e", block[0:2])
        if tensor_type == Q8_0:
            values += [d * q for q in struct.unpack("<32b", block[2:34])]
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


def _random_blocks(tensor_type: int, rows: int, groups: int, seed: int) -> np.ndarray:
    """uint8 [rows, groups * block bytes] with finite float16 scales and random payloads."""
    rng = np.random.default_rng(seed)
    size = {Q4_0: 18, Q4_1: 20, Q8_0: 34}[tensor_type]
    data = rng.integers(0, 256, (rows, groups, size), dtype=np.uint8)
    halves = 2 if tensor_type == Q4_1 else 1  # d (and m) as real float16 numbers
    scales = rng.normal(0, 0.05, (rows, groups, halves)).astype(np.float16)
    data[..., : 2 * halves] = scales.view(np.uint8).reshape(rows, groups, 2 * halves)
    return data.reshape(rows, groups * size)


@pytest.mark.parametrize("tensor_type", [Q4_0, Q4_1, Q8_0])
def test_decoded_blocks_equal_the_spec_and_gguf_exactly(tensor_type: int) -> None:
    data = _random_blocks(tensor_type, rows=3, groups=4, seed=tensor_type)
    decoded = decode_blocks(data, tensor_type)
    assert decoded.q.shape == (3, 128) and decoded.scale.shape == (3, 4)
    spec = torch.tensor([_spec_dequantize(row.tobytes(), tensor_type) for row in data])
    assert torch.equal(decoded.dequantized(), spec.float())
    assert torch.equal(
        decoded.dequantized(), torch.from_numpy(quants.dequantize(data, tensor_type))
    )


def test_other_types_and_ragged_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="not one of Q4_0, Q4_1, Q8_0"):
        decode_blocks(np.zeros((2, 36), np.uint8), 12)  # Q4_K
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
        # int4pack computes float32 activations in bfloat16 (8 bits of mantissa)
        bfloat16_path = kernel == "int4pack" or (kernel == "auto" and rows <= INT4PACK_MAX_ROWS)
        tolerance = (2e-2 if bfloat16_path else 1e-5) * expected.abs().max().item()
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
    assert resolve_quantization("int8", packaged, "cpu").reason == "--quantization"
    with pytest.raises(ValueError, match="--quantization must be one of auto, none"):
        resolve_quantization("fp4", packaged, "cpu")
