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

The `gguf` package (from the llama.cpp project) parses the file; this module turns its
numpy views into a small `GGUFFile` and names what went wrong when the file is bad.
Before the package sees a file, `check_layout` walks its header, metadata and tensor
descriptions once and checks every count and length against the bytes left in the file: a
damaged or hostile length field (an array of 2**64 items in a 94-byte file) is refused
before anything is allocated for it. Nothing here knows about any particular model.
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
SUPPORTED_VERSIONS = (2, 3)  # what the gguf package reads (version 1 had 32-bit counts)
MAX_DIMS = 4  # ggml tensors have at most four dims
DEFAULT_ALIGNMENT = 32  # tensor data starts at a multiple of this, unless general.alignment

# Value types of the metadata (gguf.GGUFValueType) and the bytes of one value of each.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MIN_VALUE_BYTES = {**_SCALAR_BYTES, _STRING: 8, _ARRAY: 12}  # a length or type + count
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


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


def _float32_value(x: float) -> float:
    """The shortest decimal that rounds to the same float32: 9.99999974e-06 -> 1e-05.

    Metadata such as an epsilon is written from a Python float into a float32 field;
    printing the float32 the short way gives back the number the writer meant.
    """
    return float(str(np.float32(x)))  # numpy prints a float32 in its shortest form


def _field_value(reader_field: Any) -> Any:
    """One metadata field as a plain Python value (strings decoded, float32 tidied)."""
    value = reader_field.contents()
    if gguf.GGUFValueType.FLOAT32 in reader_field.types[-1:]:
        value = [_float32_value(v) for v in value] if isinstance(value, list) \
            else _float32_value(value)
    return value


def _dequantize(tensor: Any) -> Tensor:
    """One stored tensor -> float32 in PyTorch's (out, in) order (GGUF dims reversed)."""
    data = np.array(tensor.data)  # a writable copy: the file is mapped read-only
    values = gguf.quants.dequantize(data, tensor.tensor_type)
    shape = tuple(reversed([int(d) for d in tensor.shape]))  # [in, out] -> (out, in)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(shape))


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
        """The next n bytes; ValueError naming `what` if fewer are left."""
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

    def value(self, value_type: int, what: str, depth: int = 0) -> Any:
        """Skip (or, for small scalars and strings, return) one metadata value."""
        if value_type in _SCALAR_BYTES:
            raw = self.take(_SCALAR_BYTES[value_type], what)
            return int.from_bytes(raw, "little") if value_type == 4 else None
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY and depth < 2:  # an array of arrays is allowed, not deeper
            item_type = self.uint(4, f"the item type of {what}")
            if item_type not in _MIN_VALUE_BYTES:
                raise self.damaged(f"{what}: unknown item type {item_type}")
            for i in range(self.count(f"items of {what}", _MIN_VALUE_BYTES[item_type])):
                self.value(item_type, f"item {i} of {what}", depth + 1)
            return None
        raise self.damaged(f"{what}: unknown value type {value_type}, expected one of "
                           f"{sorted(_MIN_VALUE_BYTES)}")


def _tensor_bytes(cursor: _Cursor, name: str, dims: list[int], type_id: int) -> int:
    """Bytes of one stored tensor; ValueError for an unknown type or a partial block."""
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
    return n // block * block_bytes


def check_layout(path: Path) -> None:
    """Walk the header, metadata and tensor descriptions, checking every length against the
    bytes left; then check that every tensor's data lies inside the file.

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
        alignment = DEFAULT_ALIGNMENT
        for i in range(n_kv):
            key = cursor.string(f"the key of metadata entry {i}")
            value = cursor.value(cursor.uint(4, f"the type of {key!r}"), f"metadata {key!r}")
            if key == "general.alignment":
                if not isinstance(value, int) or value < 1 or value & (value - 1):
                    raise cursor.damaged(f"general.alignment must be a uint32 power of two, "
                                         f"got {value!r}")
                alignment = value
        if n_tensors * _MIN_TENSOR_INFO_BYTES > cursor.left():
            raise cursor.damaged(f"{n_tensors:,} tensor descriptions announced, needing at "
                                 f"least {n_tensors * _MIN_TENSOR_INFO_BYTES:,} bytes, cannot "
                                 f"fit in the {cursor.left():,} bytes left")
        spans = []
        for i in range(n_tensors):
            name = cursor.string(f"the name of tensor {i}")
            n_dims = cursor.uint(4, f"the number of dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cursor.damaged(f"tensor {name!r}: expected 1 to {MAX_DIMS} dims, got "
                                     f"{n_dims}")
            dims = [cursor.uint(8, f"dim {d} of {name!r}") for d in range(n_dims)]
            size = _tensor_bytes(cursor, name, dims, cursor.uint(4, f"the type of {name!r}"))
            spans.append((name, cursor.uint(8, f"the offset of {name!r}"), size))
        start = -(-cursor.pos // alignment) * alignment  # the data section, aligned
        for name, offset, size in spans:
            if start + offset + size > len(data):
                raise cursor.damaged(f"tensor {name!r} needs {size:,} bytes at offset "
                                     f"{start + offset:,}, the file has {len(data):,}")


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
    check_layout(path)  # every length checked before the gguf package allocates for it
    try:
        reader = gguf.GGUFReader(path)
        metadata = {
            key: _field_value(f) for key, f in reader.fields.items()
            if not key.startswith("GGUF.")  # the header's counts, not key/values
        }
        version = int(reader.fields["GGUF.version"].contents())
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as error:
        raise ValueError(
            f"cannot read {path} as GGUF: the file is truncated or damaged ({error})"
        ) from None
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(
            f"{path} has no string 'general.architecture' in its metadata: expected a model "
            f"GGUF (e.g. 'llama'), got {architecture!r}"
        )
    tensors: dict[str, Tensor] = {}
    tensor_types: dict[str, str] = {}
    if not metadata_only:
        for t in reader.tensors:
            try:
                tensors[t.name] = _dequantize(t)
            except (ValueError, NotImplementedError) as error:
                raise ValueError(
                    f"cannot dequantise tensor {t.name!r} ({t.tensor_type.name}) of {path}: "
                    f"{error}"
                ) from None
            tensor_types[t.name] = t.tensor_type.name
    return GGUFFile(path, architecture, metadata, tensors, tensor_types, version)


def check_architecture(gguf_file: GGUFFile, expected: str) -> None:
    """Raise ValueError unless the file's `general.architecture` is `expected`."""
    if gguf_file.architecture != expected:
        raise ValueError(
            f"expected a GGUF of architecture {expected!r}, got {gguf_file.architecture!r} "
            f"in {gguf_file.path}"
        )
