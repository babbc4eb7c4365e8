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
Nothing here knows about any particular model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import Tensor

GGUF_MAGIC = b"GGUF"


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


def read_gguf(path: str | Path, metadata_only: bool = False) -> GGUFFile:
    """Read a GGUF file: its metadata and its tensors dequantised to float32.

    With `metadata_only=True` the tensors are left out (`tensors` and `tensor_types` are
    empty), e.g. to build a tokenizer from the stored vocabulary without 0.5 GB of weights.
    A missing file raises FileNotFoundError; a file that is not GGUF or is truncated raises
    ValueError naming the file.
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path must be a str or a Path, got {type(path).__name__}")
    path = Path(path)
    _check_magic(path)
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
