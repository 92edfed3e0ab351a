"""GGUF's block-quantized tensors decoded into group-wise values, without going through float.

Each of these GGUF types cuts a row into blocks of 32 weights, one block one group (ggml's
ggml-common.h block_q4_0 / block_q4_1 / block_q8_0, all little-endian):
- Q4_0, 18 bytes: d (float16), qs[16]; w[j] = d * (q[j] - 8), where q[j] = qs[j] & 0xF and
  q[j + 16] = qs[j] >> 4 (the low nibbles hold the first half of the block);
- Q4_1, 20 bytes: d (float16), m (float16), qs[16] as Q4_0; w[j] = d * q[j] + m;
- Q8_0, 34 bytes: d (float16), qs[32] (int8); w[j] = d * qs[j].

All three become GroupQuant: w = q * scale + offset per group of 32, which is what the kernels
read (int4_weight.py for the 4-bit types, int8_group_weight.py for Q8_0)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP_SIZE = 32  # weights per GGUF block of these types
# ggml type ids (gguf.GGMLQuantizationType) and the bytes of one block.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
GROUP_TYPES = frozenset(BLOCK_BYTES)  # the types decode_blocks reads
FOUR_BIT_TYPES = frozenset({Q4_0, Q4_1})


@dataclass(frozen=True, slots=True)
class GroupQuant:
    """A weight [rows, cols] as w = q * scale + offset, one scale and offset per 32 columns.

    q: uint8 0..15 (4-bit types) or int8 (Q8_0) [rows, cols]; scale, offset: float32
    [rows, cols / 32] (exact: GGUF's float16 d and m, and -8d for Q4_0, fit float32)."""

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
    """data: uint8 [rows, row bytes] (GGUFTensor.data, a 2-D tensor) of a Q4_0, Q4_1 or Q8_0
    tensor -> its GroupQuant. ValueError for any other type or a ragged row."""
    if tensor_type not in BLOCK_BYTES:
        raise ValueError(f"GGUF type {tensor_type} is not one of Q4_0, Q4_1, Q8_0")
    block_bytes = BLOCK_BYTES[tensor_type]
    rows, row_bytes = data.shape
    if row_bytes % block_bytes:
        raise ValueError(f"a row of {row_bytes} bytes is not whole {block_bytes}-byte blocks")
    blocks = np.ascontiguousarray(data).reshape(rows, row_bytes // block_bytes, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, groups]
    if tensor_type == Q8_0:
        q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return _group_quant(q, d, np.zeros_like(d), bits=8)
    payload = blocks[..., 4:] if tensor_type == Q4_1 else blocks[..., 2:]  # [rows, groups, 16]
    q = np.concatenate([payload & 0x0F, payload >> 4], axis=-1).reshape(rows, -1)
    if tensor_type == Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        return _group_quant(q, d, m, bits=4)
    return _group_quant(q, d, -8.0 * d, bits=4)


def _group_quant(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int) -> GroupQuant:
    return GroupQuant(
        torch.from_numpy(np.ascontiguousarray(q)),
        torch.from_numpy(np.ascontiguousarray(scale)),
        torch.from_numpy(np.ascontiguousarray(offset)),
        bits,
    )
