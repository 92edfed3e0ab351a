"""GGUF's block-quantized tensors decoded into group-wise values, without going through float.

Each of these GGUF types cuts a row into groups of 32 weights with one scale (and offset) each
(ggml's ggml-common.h block_* structs, dequantize_row_* in ggml-quants.c; all little-endian):
- Q4_0, 18 bytes: d (float16), qs[16]; w[j] = d * (q[j] - 8), where q[j] = qs[j] & 0xF and
  q[j + 16] = qs[j] >> 4 (the low nibbles hold the first half of the block);
- Q4_1, 20 bytes: d (float16), m (float16), qs[16] as Q4_0; w[j] = d * q[j] + m;
- Q5_0, 22 bytes: d (float16), qh (uint32), qs[16] as Q4_0; bit j of qh is q[j]'s fifth bit
  (0..31); w[j] = d * (q[j] - 16);
- Q8_0, 34 bytes: d (float16), qs[32] (int8); w[j] = d * qs[j];
- Q4_K, 144 bytes a super-block of 256 = 8 groups of 32: d, dmin (float16), scales[12] (eight
  6-bit scales sc and mins m, packed), qs[128]; each 32 bytes of qs hold two groups (low
  nibbles, then high); w = d * sc * q - dmin * m.

All become GroupQuant: w = q * scale + offset per group of 32, which is what the kernels read
(int4_weight.py for the 4-bit types; q8_0_weight.py for the 8-bit ones, Q5_0 as q - 16 in int8).
Q6_K (a scale per 16 weights) fits neither and is left to the float loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP_SIZE = 32  # weights per group (a block of the 32-weight types, a sub-block of Q4_K)
# ggml type ids (gguf.GGMLQuantizationType) and the bytes of one block.
Q4_0, Q4_1, Q5_0, Q8_0, Q4_K = 2, 3, 6, 8, 12
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q8_0: 34, Q4_K: 144}
GROUP_TYPES = frozenset(BLOCK_BYTES)  # the types decode_blocks reads
FOUR_BIT_TYPES = frozenset({Q4_0, Q4_1, Q4_K})
TYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K"}


@dataclass(frozen=True, slots=True)
class GroupQuant:
    """A weight [rows, cols] as w = q * scale + offset, one scale and offset per 32 columns.

    q: uint8 0..15 (4-bit types) or int8 (Q5_0, Q8_0) [rows, cols]; scale, offset: float32
    [rows, cols / 32] (exact: float16 d and m, -8d, and Q4_K's d * sc and -dmin * m (11 + 6
    bits) fit float32's 24)."""

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int  # 4 or 8

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [rows, cols] these values stand for."""
        groups = self.scale.shape[1]
        q = self.q.float().reshape(self.q.shape[0], groups, -1)
        w = q * self.scale[..., None] + self.offset[..., None]
        return w.reshape(self.q.shape)

    def take_rows(self, order: np.ndarray) -> GroupQuant:
        """The same weight with its rows reordered (row i of the result is row order[i])."""
        index = torch.from_numpy(np.ascontiguousarray(order))
        return GroupQuant(self.q[index], self.scale[index], self.offset[index], self.bits)

    @staticmethod
    def cat(parts: list[GroupQuant]) -> GroupQuant:
        """The parts' rows stacked (a fused projection's weights), all of one bit width."""
        if len({p.bits for p in parts}) != 1:
            raise ValueError("cannot stack 4-bit and 8-bit groups into one weight")
        return GroupQuant(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.offset for p in parts]),
            parts[0].bits,
        )


def decode_blocks(data: np.ndarray, tensor_type: int) -> GroupQuant:
    """data: uint8 [rows, row bytes] (GGUFTensor.data, a 2-D tensor) of a tensor of one of
    GROUP_TYPES -> its GroupQuant. ValueError for any other type or a ragged row."""
    if tensor_type not in BLOCK_BYTES:
        raise ValueError(f"GGUF type {tensor_type} is not one of {', '.join(TYPE_NAMES.values())}")
    block_bytes = BLOCK_BYTES[tensor_type]
    rows, row_bytes = data.shape
    if row_bytes % block_bytes:
        raise ValueError(f"a row of {row_bytes} bytes is not whole {block_bytes}-byte blocks")
    blocks = np.ascontiguousarray(data).reshape(rows, row_bytes // block_bytes, block_bytes)
    if tensor_type == Q4_K:
        return _decode_q4_k(blocks)
    d = _halves(blocks, 0)  # [rows, groups]
    if tensor_type == Q8_0:
        q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return _group_quant(q, d, np.zeros_like(d), bits=8)
    if tensor_type == Q5_0:
        high_bits = blocks[..., 2:6].copy().view("<u4")  # [rows, groups, 1]
        fifth = (high_bits >> np.arange(32, dtype=np.uint32)) & 1  # [rows, groups, 32]
        q = (_nibbles(blocks[..., 6:]) | (fifth << 4).astype(np.uint8)).astype(np.int8) - 16
        return _group_quant(q.reshape(rows, -1), d, np.zeros_like(d), bits=8)
    q = _nibbles(blocks[..., 4:] if tensor_type == Q4_1 else blocks[..., 2:]).reshape(rows, -1)
    if tensor_type == Q4_1:
        return _group_quant(q, d, _halves(blocks, 2), bits=4)
    return _group_quant(q, d, -8.0 * d, bits=4)


def _decode_q4_k(blocks: np.ndarray) -> GroupQuant:
    """blocks: uint8 [rows, super-blocks, 144] -> eight groups of 32 per super-block."""
    rows = blocks.shape[0]
    d, dmin = _halves(blocks, 0)[..., None], _halves(blocks, 2)[..., None]  # [rows, blocks, 1]
    sc, m = _q4_k_scales_and_mins(blocks[..., 4:16])  # [rows, blocks, 8] each
    # qs: four runs of 32 bytes, each the low nibbles of one group, then the high of the next.
    runs = blocks[..., 16:].reshape(rows, -1, 4, 32)
    q = np.stack([runs & 0x0F, runs >> 4], axis=3).reshape(rows, -1)
    scale = (d * sc.astype(np.float32)).reshape(rows, -1)
    offset = -(dmin * m.astype(np.float32)).reshape(rows, -1)
    return _group_quant(q, scale, offset, bits=4)


def _q4_k_scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """packed: uint8 [..., 12] -> the eight 6-bit scales and mins [..., 8] (ggml's
    get_scale_min_k4): groups 0-3 are the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
    groups 4-7 take their low 4 bits from bytes 8-11 (scales low nibble, mins high) and their
    top 2 from the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, high, extra = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 0x3F, (extra & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([high & 0x3F, (extra >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, mins


def _halves(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 [rows, blocks]."""
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(payload: np.ndarray) -> np.ndarray:
    """uint8 [..., 16] -> [..., 32]: the low nibbles (the first 16 values), then the high."""
    return np.concatenate([payload & 0x0F, payload >> 4], axis=-1)


def _group_quant(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int) -> GroupQuant:
    return GroupQuant(
        torch.from_numpy(np.ascontiguousarray(q)),
        torch.from_numpy(np.ascontiguousarray(scale)),
        torch.from_numpy(np.ascontiguousarray(offset)),
        bits,
    )
