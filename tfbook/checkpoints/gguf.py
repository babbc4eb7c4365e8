"""Reading a GGUF file (llama.cpp's checkpoint format) into plain Python values and tensors.

A GGUF file is one binary blob in three parts:

1. a header: the magic bytes b"GGUF", a version, the number of tensors and of key/values;
2. metadata: typed key/values such as `general.architecture = "llama"`,
   `llama.block_count = 30`, or the whole vocabulary as an array of strings;
3. tensor descriptions (name, dims, storage type, offset), then the tensor data.

Weights are usually *quantised*: stored in blocks of 32 numbers that share a scale. In Q8_0
each block keeps one float16 scale d and 32 int8 values q, and w = d * q; in Q4_1 each block
keeps a float16 scale d and minimum m, and 32 four-bit values q in 0..15, and w = d * q + m
(20 bytes per 32 weights: 5 bits per weight instead of 32; Q8_0 takes 8.5). Reading
dequantises everything back to float32, so the result is exactly the numbers llama.cpp
computes with, but no longer compressed.

GGUF lists a tensor's dims fastest-varying first (ggml's ne0, ne1, ...): a linear layer
with `in_features` inputs is stored as [in, out]. PyTorch lists dims slowest-varying first,
(out, in), which is the same memory read in the other order: nothing is transposed, only
the list of dims is reversed.

`read_layout` walks the header, the metadata and the tensor descriptions once, checking every
count and length against the bytes left in the file before it reads what they announce: a
damaged or hostile length field (an array of 2**64 items in a 94-byte file) is refused before
anything is allocated for it. It returns the metadata as plain Python values and, per tensor,
where its bytes lie; `read_gguf` then dequantises each tensor with `gguf.quants.dequantize`
from the `gguf` package of the llama.cpp project. (The package's own `GGUFReader` parses the
same bytes one element at a time through numpy views: about 2 s of CPU for SmolLM2's
49,152-token vocabulary and 48,900 merges, where this walk takes a few hundredths of a
second; tests/test_gguf_parity.py checks that both read the same.) Nothing here knows about
any particular model.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import Tensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # little-endian (version 1 had 32-bit counts)
MAX_DIMS = 4  # ggml tensors have at most four dims
DEFAULT_ALIGNMENT = 32  # tensor data starts at a multiple of this, unless general.alignment

# Value types of the metadata (gguf.GGUFValueType) and how one value of each is stored.
_SCALAR_DTYPES = {0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"),
                  3: np.dtype("<i2"), 4: np.dtype("<u4"), 5: np.dtype("<i4"),
                  6: np.dtype("<f4"), 7: np.dtype("?"), 10: np.dtype("<u8"),
                  11: np.dtype("<i8"), 12: np.dtype("<f8")}
_UINT32, _FLOAT32, _STRING, _ARRAY = 4, 6, 8, 9
_MIN_VALUE_BYTES = {**{t: d.itemsize for t, d in _SCALAR_DTYPES.items()},
                    _STRING: 8, _ARRAY: 12}  # a length, or an item type and a count
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_MAX_DIM = 2**63 - 1  # the largest dim numpy and torch accept


@dataclass(frozen=True)
class GGUFFile:
    """The contents of one GGUF file: metadata as Python values, tensors as float32."""

    path: Path  # where it was read from (used in error messages)
    architecture: str  # metadata["general.architecture"], e.g. "llama"
    metadata: dict[str, Any]  # key -> int/float/str/bool or a list of them
    tensors: dict[str, Tensor] = field(repr=False)  # name -> float32, PyTorch (out, in) order
    tensor_types: dict[str, str] = field(repr=False)  # name -> storage type, e.g. "Q4_1"
    version: int = 3  # the GGUF format version

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, architecture={self.architecture!r}, "
                f"{len(self.metadata)} metadata keys, {len(self.tensors)} tensors)")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one stored tensor lies in the file and how it is stored."""

    name: str
    dims: tuple[int, ...]  # GGUF order, fastest-varying first: [in, out] for a linear layer
    kind: gguf.GGMLQuantizationType  # the storage type, e.g. Q4_1
    offset: int  # the byte offset of its data from the start of the file
    n_bytes: int  # the bytes of its data


@dataclass(frozen=True)
class GGUFLayout:
    """What `read_layout` found: the header's version, the metadata, the tensor descriptions."""

    version: int
    metadata: dict[str, Any]  # key -> int/float/str/bool or a list of them, in file order
    tensors: list[GGUFTensorInfo]  # in file order


def _float32_value(x: float) -> float:
    """The shortest decimal that rounds to the same float32: 9.99999974e-06 -> 1e-05.

    Metadata such as an epsilon is written from a Python float into a float32 field;
    printing the float32 the short way gives back the number the writer meant.
    """
    return float(str(np.float32(x)))  # numpy prints a float32 in its shortest form


def _check_magic(path: Path) -> None:
    """Raise FileNotFoundError/ValueError unless `path` is a file that starts with b"GGUF"."""
    if not path.exists():
        raise FileNotFoundError(f"no GGUF file at {path}: expected an existing .gguf file")
    if not path.is_file():
        raise ValueError(f"{path} is not a file: expected a .gguf file")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"{path} is not a GGUF file: expected it to start with the magic bytes "
            f"{GGUF_MAGIC!r}, got {magic!r}"
        )


class _Cursor:
    """Reads little-endian fields of a mapped file, refusing any read past its end."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def damaged(self, detail: str) -> ValueError:
        return ValueError(f"cannot read {self.path} as GGUF: the file is truncated or damaged "
                          f"({detail})")

    def take(self, n: int, what: str) -> bytes:
        """The next n bytes (a copy); ValueError naming `what` if fewer are left."""
        if n > self.left():
            raise self.damaged(f"{what} needs {n} bytes at offset {self.pos}, "
                               f"{self.left()} left")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "little")

    def count(self, what: str, min_item_bytes: int) -> int:
        """A 64-bit count, checked: `count` items of at least `min_item_bytes` must fit."""
        n = self.uint(8, f"the count of {what}")
        if n * min_item_bytes > self.left():
            raise self.damaged(f"{what}: {n:,} announced, needing at least "
                               f"{n * min_item_bytes:,} bytes, cannot fit in the "
                               f"{self.left():,} bytes left")
        return n

    def string(self, what: str) -> str:
        raw = self.take(self.count(f"bytes of {what}", 1), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.damaged(f"{what} is not UTF-8 text") from None

    def scalars(self, value_type: int, n: int, what: str) -> list[Any]:
        """n numbers (or booleans) of one type, read at once: [3, 1, 4]; float32 tidied."""
        dtype = _SCALAR_DTYPES[value_type]
        values = np.frombuffer(self.take(n * dtype.itemsize, what), dtype).tolist()
        return [_float32_value(v) for v in values] if value_type == _FLOAT32 else values

    def strings(self, n: int, what: str) -> list[str]:
        """n strings, each a 64-bit length and its UTF-8 bytes (a vocabulary, its merges).

        The same reads as n calls of `string`, without building a description per item:
        that is left to `string`, called on the one item that does not fit or decode.
        """
        data, pos, end, out = self.data, self.pos, len(self.data), []
        for i in range(n):
            start = pos + 8
            stop = start + int.from_bytes(data[pos:start], "little")
            if stop <= end:  # (a cut length field reads short: start > end, so stop > end)
                try:
                    out.append(data[start:stop].decode("utf-8"))
                    pos = stop
                    continue
                except UnicodeDecodeError:
                    pass
            self.pos = pos
            out.append(self.string(f"item {i} of {what}"))  # raises, naming what is wrong
            pos = self.pos
        self.pos = pos
        return out

    def value(self, value_type: int, what: str, depth: int = 0) -> Any:
        """One metadata value as a Python value: int, float (float32 tidied), bool, str, list.

        An array of arrays reads as a list of lists; deeper nesting is refused.
        """
        if value_type in _SCALAR_DTYPES:
            return self.scalars(value_type, 1, what)[0]
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY and depth < 2:  # an array of arrays is allowed, not deeper
            item_type = self.uint(4, f"the item type of {what}")
            if item_type not in _MIN_VALUE_BYTES:
                raise self.damaged(f"{what}: unknown item type {item_type}")
            n = self.count(f"items of {what}", _MIN_VALUE_BYTES[item_type])
            if item_type in _SCALAR_DTYPES:
                return self.scalars(item_type, n, what)
            if item_type == _STRING:
                return self.strings(n, what)
            return [self.value(item_type, f"item {i} of {what}", depth + 1) for i in range(n)]
        raise self.damaged(f"{what}: unknown value type {value_type}, expected one of "
                           f"{sorted(_MIN_VALUE_BYTES)}")


def _tensor_kind(cursor: _Cursor, name: str, dims: list[int], type_id: int
                 ) -> tuple[gguf.GGMLQuantizationType, int]:
    """The storage type of one tensor and its bytes; ValueError for an unknown type or a
    partial block."""
    try:
        kind = gguf.GGMLQuantizationType(type_id)
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise cursor.damaged(f"tensor {name!r} has unknown storage type {type_id}") from None
    if dims[0] % block != 0:
        raise cursor.damaged(f"tensor {name!r} ({kind.name}): its first dim {dims[0]} is not a "
                             f"multiple of the block of {block}")
    n = 1
    for d in dims:
        n *= d
    return kind, n // block * block_bytes


def read_layout(path: Path) -> GGUFLayout:
    """Walk the header, metadata and tensor descriptions, checking every length against the
    bytes left before reading what it announces; then check that every tensor's data lies
    inside the file. Returns the metadata and where each tensor's bytes are.

    Raises ValueError naming the field, the bytes it needs and the bytes left.
    """
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data, path)
        cursor.take(len(GGUF_MAGIC), "the magic bytes")
        version = cursor.uint(4, "the version")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"cannot read {path} as GGUF: expected format version "
                             f"{' or '.join(map(str, SUPPORTED_VERSIONS))} (little-endian), "
                             f"got version {version}")
        n_tensors = cursor.uint(8, "the tensor count")
        n_kv = cursor.count("metadata key/values", _MIN_KV_BYTES)
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cursor.string(f"the key of metadata entry {i}")
            value_type = cursor.uint(4, f"the type of {key!r}")
            value = cursor.value(value_type, f"metadata {key!r}")
            if key in metadata:
                raise cursor.damaged(f"metadata {key!r} appears twice")
            if key == "general.alignment" and (value_type != _UINT32 or value < 1
                                               or value & (value - 1)):
                stored = "" if value_type == _UINT32 else f" stored as value type {value_type}"
                raise cursor.damaged(f"general.alignment must be a uint32 power of two, "
                                     f"got {value!r}{stored}")
            metadata[key] = value
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if n_tensors * _MIN_TENSOR_INFO_BYTES > cursor.left():
            raise cursor.damaged(f"{n_tensors:,} tensor descriptions announced, needing at "
                                 f"least {n_tensors * _MIN_TENSOR_INFO_BYTES:,} bytes, cannot "
                                 f"fit in the {cursor.left():,} bytes left")
        described = []
        for i in range(n_tensors):
            name = cursor.string(f"the name of tensor {i}")
            n_dims = cursor.uint(4, f"the number of dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cursor.damaged(f"tensor {name!r}: expected 1 to {MAX_DIMS} dims, got "
                                     f"{n_dims}")
            dims = [cursor.uint(8, f"dim {d} of {name!r}") for d in range(n_dims)]
            if max(dims) > _MAX_DIM:  # a product of 0 would let it pass the size check
                raise cursor.damaged(f"tensor {name!r}: dims {dims}, expected each at most "
                                     f"{_MAX_DIM:,} (2**63 - 1)")
            kind, size = _tensor_kind(cursor, name, dims, cursor.uint(4, f"the type of {name!r}"))
            described.append((name, dims, kind, cursor.uint(8, f"the offset of {name!r}"), size))
        start = -(-cursor.pos // alignment) * alignment  # the data section, aligned
        tensors: dict[str, GGUFTensorInfo] = {}
        for name, dims, kind, offset, size in described:
            if start + offset + size > len(data):
                raise cursor.damaged(f"tensor {name!r} needs {size:,} bytes at offset "
                                     f"{start + offset:,}, the file has {len(data):,}")
            if name in tensors:
                raise cursor.damaged(f"tensor {name!r} appears twice")
            tensors[name] = GGUFTensorInfo(name, tuple(dims), kind, start + offset, size)
    return GGUFLayout(version, metadata, list(tensors.values()))


def _dequantize(raw: bytearray, info: GGUFTensorInfo) -> Tensor:
    """One stored tensor's bytes -> float32 in PyTorch's (out, in) order (GGUF dims reversed).

    `gguf.quants.dequantize` takes the bytes as rows of blocks, (out, in // block * bytes per
    block), and returns (out, in); for F32 and F16 it reinterprets them.
    """
    shape = tuple(reversed(info.dims))  # [in, out] -> (out, in)
    rows = np.frombuffer(raw, np.uint8).reshape(gguf.quants.quant_shape_to_byte_shape(
        shape, info.kind))
    values = gguf.quants.dequantize(rows, info.kind)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(shape))


def read_gguf(path: str | Path, metadata_only: bool = False) -> GGUFFile:
    """Read a GGUF file: its metadata and its tensors dequantised to float32.

    With `metadata_only=True` the tensors are left out (`tensors` and `tensor_types` are
    empty), e.g. to build a tokenizer from the stored vocabulary without 0.5 GB of weights.
    A missing file raises FileNotFoundError; a file that is not GGUF or is truncated raises
    ValueError naming the file.
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path must be a str or a Path, got {type(path).__name__}")
    if not isinstance(metadata_only, bool):
        raise TypeError(f"metadata_only must be True or False, got {metadata_only!r:.40}")
    path = Path(path)
    _check_magic(path)
    layout = read_layout(path)  # every length checked before anything is read for it
    architecture = layout.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(
            f"{path} has no string 'general.architecture' in its metadata: expected a model "
            f"GGUF (e.g. 'llama'), got {architecture!r}"
        )
    tensors: dict[str, Tensor] = {}
    tensor_types: dict[str, str] = {}
    if not metadata_only:
        with path.open("rb") as f:
            for info in layout.tensors:
                raw = bytearray(info.n_bytes)  # writable, so the tensor may be changed
                f.seek(info.offset)
                if f.readinto(raw) != info.n_bytes:  # read_layout found them: file changed?
                    raise ValueError(f"cannot read {path} as GGUF: the file is truncated or "
                                     f"damaged (tensor {info.name!r} needs {info.n_bytes:,} "
                                     f"bytes at offset {info.offset:,}, fewer were read)")
                try:
                    tensors[info.name] = _dequantize(raw, info)
                except (ValueError, NotImplementedError) as error:
                    raise ValueError(
                        f"cannot dequantise tensor {info.name!r} ({info.kind.name}) of {path}: "
                        f"{error}"
                    ) from None
                tensor_types[info.name] = info.kind.name
    return GGUFFile(path, architecture, layout.metadata, tensors, tensor_types, layout.version)


def check_architecture(gguf_file: GGUFFile, expected: str) -> None:
    """Raise ValueError unless the file's `general.architecture` is `expected`."""
    if gguf_file.architecture != expected:
        raise ValueError(
            f"expected a GGUF of architecture {expected!r}, got {gguf_file.architecture!r} "
            f"in {gguf_file.path}"
        )
