"""Reading a GGUF file: its metadata, its tensor directory, and one tensor's stored bytes.

GGUF (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) is a
little-endian header -- magic `GGUF`, version, tensor count, metadata key/value pairs, one
info record per tensor (name, dims, ggml type, offset) -- followed by the tensor data,
aligned to `general.alignment` bytes. This module parses the header itself with `struct`
(the `gguf` package's `GGUFReader` builds several numpy views per array element and took
8-16 s on SmolLM2's 100k-entry vocabulary on a 2-core machine; this takes a fraction of a
second) and leaves decoding the data blocks to gguf_dequantize.py.

Nothing is dequantized here: `GGUFFile.tensor_bytes` returns a read-only memory-mapped view
of one tensor's stored bytes, so reading only the metadata (the router's tokenizer) touches
none of the weights.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # version 1 counted with 32-bit integers; no current tool writes it
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"

# Metadata value types (gguf.md, `gguf_metadata_value_type`): the fixed-size ones as struct formats.
_STRING, _ARRAY = 8, 9
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPES = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


class GGUFTensorInfo(NamedTuple):
    """Where one tensor is stored and how."""

    name: str
    shape: tuple[int, ...]  # numpy/torch order (rows first): the reverse of GGUF's `ne` dims
    ggml_type: int  # a `gguf.GGMLQuantizationType` value (may be one this gguf version does not know)
    offset: int  # from the start of the data section
    num_bytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"ggml type {self.ggml_type}"


class _Cursor:
    """Sequential little-endian reads from a buffer; a read past the end is a clear ValueError."""

    def __init__(self, buffer: mmap.mmap, path: Path):
        self.buffer, self.path, self.pos = buffer, path, 0

    def take(self, size: int) -> int:
        start = self.pos
        if start + size > len(self.buffer):
            raise ValueError(
                f"gguf: {self.path} is truncated (a read of {size} bytes at offset {start} "
                f"passes its end, {len(self.buffer)} bytes)"
            )
        self.pos += size
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buffer, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        size = self.scalar("<Q")
        start = self.take(size)
        return self.buffer[start : start + size].decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array()
        fmt = _SCALAR_FORMATS.get(value_type)
        if fmt is None:
            raise ValueError(
                f"gguf: {self.path} has a metadata value of unknown type {value_type} at offset {self.pos}"
            )
        return self.scalar(fmt)

    def array(self) -> list[Any]:
        item_type, count = self.scalar("<I"), self.scalar("<Q")
        if item_type in _NUMPY_DTYPES:  # numbers in one go: token types are 100k int32s
            dtype = np.dtype(_NUMPY_DTYPES[item_type])
            start = self.take(count * dtype.itemsize)
            return np.frombuffer(self.buffer, dtype, count, start).tolist()
        return [self.value(item_type) for _ in range(count)]


class GGUFFile:
    """A parsed GGUF header: `metadata` (key -> value; arrays as lists) and `tensors` (name ->
    `GGUFTensorInfo`, in file order). Tensor data is mapped lazily by `tensor_bytes`."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, GGUFTensorInfo], data_start: int):
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self.data_start = data_start
        self._data: np.memmap | None = None

    def tensor_bytes(self, info: GGUFTensorInfo) -> np.ndarray:
        """The stored bytes of `info` (read-only, memory-mapped), shaped as `gguf_dequantize.dequantize`
        (and `gguf.quants.dequantize`) takes them: [rows..., bytes per row]."""
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        start = self.data_start + info.offset
        if start + info.num_bytes > self._data.shape[0]:
            raise ValueError(f"gguf: tensor {info.name!r} in {self.path} ends past the end of the file")
        # A plain ndarray view: the decoders split their input into many pieces, and every piece of an
        # np.memmap subclass pays for a Python-level __array_finalize__.
        raw = self._data[start : start + info.num_bytes].view(np.ndarray)
        return raw.reshape(quant_shape_to_byte_shape(info.shape, GGMLQuantizationType(info.ggml_type)))


def _tensor_bytes(path: Path, name: str, shape: tuple[int, ...], ggml_type: int) -> int:
    """Stored size of a tensor; 0 when its type is unknown to gguf (the loader refuses it by name)."""
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return 0
    if shape and shape[-1] % block_size:
        raise ValueError(
            f"gguf: tensor {name!r} in {path} has rows of {shape[-1]} values, not a multiple of "
            f"its type's block of {block_size}"
        )
    return int(np.prod(shape, dtype=np.int64)) // block_size * type_size


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse the header of the GGUF file at `path`.

    Raises FileNotFoundError when it does not exist, and ValueError when it is not a GGUF file,
    is of an unsupported version or byte order, or is truncated.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"gguf: {path} does not exist")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        cursor = _Cursor(buffer, path)
        magic = buffer[:4]
        cursor.take(4)
        if magic != GGUF_MAGIC:
            raise ValueError(f"gguf: {path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
        version = cursor.scalar("<I")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            what = "a big-endian file" if swapped in SUPPORTED_VERSIONS else f"version {version}"
            raise ValueError(f"gguf: {path} is {what}; supported: little-endian versions {list(SUPPORTED_VERSIONS)}")
        num_tensors, num_keys = cursor.scalar("<Q"), cursor.scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(num_keys):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.scalar("<I"))
        tensors: dict[str, GGUFTensorInfo] = {}
        for _ in range(num_tensors):
            name = cursor.string()
            num_dims = cursor.scalar("<I")
            dims = [cursor.scalar("<Q") for _ in range(num_dims)]
            ggml_type, offset = cursor.scalar("<I"), cursor.scalar("<Q")
            shape = tuple(reversed(dims))
            tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, _tensor_bytes(path, name, shape, ggml_type))
        alignment = int(metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT))
        data_start = -(-cursor.pos // alignment) * alignment
    return GGUFFile(path, metadata, tensors, data_start)
