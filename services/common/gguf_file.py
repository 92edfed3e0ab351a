"""A fast reader for GGUF files: metadata as plain Python values, tensors as memory-mapped bytes.

gguf.GGUFReader builds a numpy view for every element of every metadata array, which takes
tens of seconds for a 262k-token vocabulary (Gemma 3: tokens, scores and types). Here numeric
arrays are decoded in one np.frombuffer call and strings in a tight loop, so opening such a
file takes well under a second. Tensors are handed out in the form gguf.quants.dequantize
expects: uint8 arrays in numpy order whose last axis counts bytes.

Format (little-endian): magic "GGUF", version u32, tensor count u64, key/value count u64; the
key/values (string key, u32 value type, value); the tensor infos (string name, u32 n_dims,
u64 dims innermost first, u32 ggml type, u64 offset); then, aligned to general.alignment
(default 32), the tensor data."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {  # GGUF value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d",
}  # fmt: skip
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
          10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_SUPPORTED_VERSIONS = (2, 3)


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (outermost first), in elements
    data: np.ndarray  # uint8 [*shape[:-1], bytes of one row], a read-only view of the file


class GGUFFile:
    """fields: key -> int | float | bool | str | list; tensors in file order; data_offset."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self._map)
        self._pos = 0
        if bytes(self._buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (bad magic)")
        self._pos = 4
        version = self._scalar(4)
        if version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported")
        tensor_count, kv_count = self._scalar(10), self._scalar(10)
        self.fields: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(self.fields.get("general.alignment", 32))
        self.data_offset = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(*info) for info in infos]

    def _scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._scalar(10)
        start, self._pos = self._pos, self._pos + length
        return bytes(self._buf[start : self._pos]).decode("utf-8", errors="replace")

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(kind)
        item_kind, count = self._scalar(4), self._scalar(10)
        if item_kind == _STRING:
            return [self._string() for _ in range(count)]
        if item_kind == _ARRAY:
            return [self._value(_ARRAY) for _ in range(count)]
        dtype = np.dtype(_NUMPY[item_kind])
        values = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
        self._pos += count * dtype.itemsize
        return values.tolist()

    def _tensor_info(self) -> tuple[str, list[int], GGMLQuantizationType, int]:
        name = self._string()
        dims = [self._scalar(10) for _ in range(self._scalar(4))]
        return name, dims, GGMLQuantizationType(self._scalar(4)), self._scalar(10)

    def _tensor(
        self, name: str, dims: list[int], kind: GGMLQuantizationType, offset: int
    ) -> GGUFTensor:
        block, type_size = GGML_QUANT_SIZES[kind]
        shape = tuple(reversed(dims))
        row_bytes = shape[-1] // block * type_size
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        start = self.data_offset + offset
        data = self._map[start : start + rows * row_bytes].reshape(*shape[:-1], row_bytes)
        return GGUFTensor(name, kind, shape, data)
