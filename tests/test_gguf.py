"""The GGUF reader: a small file written with llama.cpp's own `gguf` writer reads back as the
values and tensors that went in, in PyTorch's (out, in) order; bad files are refused with
errors that name the file."""

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from tfbook.checkpoints.gguf import GGUFFile, check_architecture, read_gguf

Q = gguf.GGMLQuantizationType


def toy_weights() -> dict[str, np.ndarray]:
    """(out, in) matrices and a vector; 64 inputs = two quantisation blocks of 32 per row."""
    rng = np.random.default_rng(0)
    return {
        "lin.weight": rng.standard_normal((3, 64)).astype(np.float32),
        "norm.weight": rng.standard_normal(64).astype(np.float32),
        "q8.weight": rng.standard_normal((4, 64)).astype(np.float32),
        "q4.weight": rng.standard_normal((5, 64)).astype(np.float32),
    }


STORED_AS = {"lin.weight": Q.F32, "norm.weight": Q.F16, "q8.weight": Q.Q8_0, "q4.weight": Q.Q4_1}


def write_toy_gguf(path: Path, architecture: str = "toyarch") -> Path:
    """A GGUF file with metadata of every common type and four tensors in four storage types."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_uint32("toyarch.block_count", 2)
    writer.add_int32("toyarch.offset", -7)
    writer.add_float32("toyarch.eps", 1e-5)
    writer.add_bool("toyarch.flag", True)
    writer.add_string("toyarch.title", "Grüße, 世界")
    writer.add_array("toyarch.words", ["a", "Ġthe", "<|im_end|>"])
    writer.add_array("toyarch.numbers", [3, 1, 4])
    for name, array in toy_weights().items():
        qtype = STORED_AS[name]
        if qtype == Q.F16:
            writer.add_tensor(name, array.astype(np.float16))
        elif qtype == Q.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def toy_path(tmp_path) -> Path:
    return write_toy_gguf(tmp_path / "toy.gguf")


def test_metadata_reads_back_as_plain_python_values(toy_path):
    g = read_gguf(toy_path)
    assert isinstance(g, GGUFFile) and g.architecture == "toyarch" and g.path == toy_path
    md = g.metadata
    assert md["general.architecture"] == "toyarch"
    assert md["toyarch.block_count"] == 2 and type(md["toyarch.block_count"]) is int
    assert md["toyarch.offset"] == -7
    assert md["toyarch.eps"] == 1e-5  # the float32 0.0000099999997 read as the 1e-5 written
    assert md["toyarch.flag"] is True
    assert md["toyarch.title"] == "Grüße, 世界"
    assert md["toyarch.words"] == ["a", "Ġthe", "<|im_end|>"]
    assert md["toyarch.numbers"] == [3, 1, 4]
    assert g.version == 3
    assert "GGUF.version" not in md  # header counts are not metadata
    assert "toy.gguf" in repr(g) and "4 tensors" in repr(g)


def test_tensors_read_back_in_pytorch_order_as_float32(toy_path):
    g = read_gguf(toy_path)
    written = toy_weights()
    assert set(g.tensors) == set(written)
    assert g.tensor_types == {name: qtype.name for name, qtype in STORED_AS.items()}
    reader = gguf.GGUFReader(toy_path)
    for t in reader.tensors:
        ours = g.tensors[t.name]
        assert ours.dtype == torch.float32
        assert tuple(ours.shape) == written[t.name].shape  # (out, in) as written
        assert tuple(ours.shape) == tuple(reversed(t.shape.tolist()))  # GGUF lists [in, out]
    torch.testing.assert_close(g.tensors["lin.weight"], torch.from_numpy(written["lin.weight"]),
                               rtol=0, atol=0)
    norm = written["norm.weight"].astype(np.float16).astype(np.float32)
    torch.testing.assert_close(g.tensors["norm.weight"], torch.from_numpy(norm), rtol=0, atol=0)
    for name in ("q8.weight", "q4.weight"):  # equal to llama.cpp's own dequantisation
        reference = gguf.quants.dequantize(gguf.quants.quantize(written[name], STORED_AS[name]),
                                           STORED_AS[name])
        torch.testing.assert_close(g.tensors[name], torch.from_numpy(reference), rtol=0, atol=0)
    # and close to the original numbers: Q8_0 keeps ~1/127 of a block's range, Q4_1 ~1/15
    close = {"q8.weight": 0.02, "q4.weight": 0.3}
    for name, atol in close.items():
        assert (g.tensors[name] - torch.from_numpy(written[name])).abs().max() < atol


def test_tensors_are_writable_copies(toy_path):
    g = read_gguf(toy_path)
    g.tensors["lin.weight"].mul_(2)  # would fail on the read-only file mapping
    assert read_gguf(toy_path).tensors["lin.weight"].abs().sum() > 0


def test_metadata_only_leaves_the_tensors_out(toy_path):
    g = read_gguf(toy_path, metadata_only=True)
    assert g.tensors == {} and g.tensor_types == {}
    assert g.metadata == read_gguf(toy_path).metadata


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no GGUF file at .*nothing\.gguf"):
        read_gguf(tmp_path / "nothing.gguf")
    with pytest.raises(ValueError, match="is not a file"):
        read_gguf(tmp_path)
    with pytest.raises(TypeError, match="path must be a str or a Path, got NoneType"):
        read_gguf(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata_only must be True or False, got 'yes'"):
        read_gguf(tmp_path / "x.gguf", metadata_only="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("content", [b"", b"GG", b"PK\x03\x04 a zip file", b"{\"json\": 1}"],
                         ids=["empty", "short", "zip", "json"])
def test_not_a_gguf_file(tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"model\.gguf is not a GGUF file: expected .*b'GGUF'"):
        read_gguf(path)


def test_truncated_file_is_refused_wherever_it_is_cut(toy_path):
    data = toy_path.read_bytes()
    data_end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(toy_path).tensors)
    cut = toy_path.with_name("cut.gguf")
    for size in (4, 8, 30, 100, len(data) // 2, data_end - 1):  # header ... last tensor
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match=r"cannot read .*cut\.gguf as GGUF: the file is "
                                             "truncated or damaged"):
            read_gguf(cut)


def test_unsupported_version_is_refused(toy_path):
    data = bytearray(toy_path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    toy_path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="toy.gguf as GGUF.*version 99"):
        read_gguf(toy_path)


def test_check_architecture(toy_path):
    g = read_gguf(toy_path, metadata_only=True)
    check_architecture(g, "toyarch")
    with pytest.raises(ValueError, match=r"expected a GGUF of architecture 'llama', got "
                                         r"'toyarch' in .*toy\.gguf"):
        check_architecture(g, "llama")


# --- hand-made byte strings: every count and length is checked against the bytes left ------

def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def text(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, value_type: int, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", value_type) + payload


def tensor_info(name: str, dims: list[int], type_id: int = 0, offset: int = 0) -> bytes:
    return (text(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", type_id, offset))


ARCH = kv("general.architecture", 8, text("toyarch"))
HOSTILE = {
    # an array of 2**60 bytes announced in a 94-byte file (the gguf package loops on it)
    "array count": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 0, 2**60)) + bytes(45),
                    r"items of metadata 'a': 1,152,921,504,606,846,976 announced, needing at least "
                    r"1,152,921,504,606,846,976 bytes, cannot fit in the 45 bytes left"),
    "string length": (header(0, 1) + struct.pack("<Q", 2**40) + b"key" + bytes(16),
                      r"bytes of the key of metadata entry 0: 1,099,511,627,776 .* cannot fit"),
    "key/value count": (header(0, 2**50) + ARCH, r"metadata key/values: .* cannot fit"),
    "tensor count": (header(2**40, 1) + ARCH + bytes(64),
                     r"1,099,511,627,776 tensor descriptions .* cannot fit"),
    "value type": (header(0, 1) + kv("a", 13, b"\0" * 8), r"'a': unknown value type 13"),
    "array item type": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 42, 1)),
                        r"'a': unknown item type 42"),
    "nested arrays": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 9, 1)
                                        + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 0)),
                      r"item 0 of item 0 of metadata 'a': unknown value type 9"),
    "key not UTF-8": (header(0, 1) + text(b"\xff\xfe") + struct.pack("<I", 4) + bytes(4),
                      r"the key of metadata entry 0 is not UTF-8 text"),
    "no dims": (header(1, 1) + ARCH + tensor_info("w", []), r"'w': expected 1 to 4 dims, got 0"),
    "five dims": (header(1, 1) + ARCH + tensor_info("w", [1] * 5), r"expected 1 to 4 dims, got 5"),
    "storage type": (header(1, 1) + ARCH + tensor_info("w", [4], type_id=99),
                     r"tensor 'w' has unknown storage type 99"),
    "partial block": (header(1, 1) + ARCH + tensor_info("w", [33, 2], type_id=8),
                      r"'w' \(Q8_0\): its first dim 33 is not a multiple of the block of 32"),
    "huge dim": (header(1, 1) + ARCH + tensor_info("w", [0, 2**64 - 1]) + bytes(64),
                 r"tensor 'w': dims \[0, 18446744073709551615\], expected each at most "
                 r"9,223,372,036,854,775,807"),
    "data past the end": (header(1, 1) + ARCH + tensor_info("w", [2**20]) + bytes(64),
                          r"tensor 'w' needs 4,194,304 bytes at offset \d+, the file has \d+"),
    "alignment": (header(0, 2) + ARCH + kv("general.alignment", 4, struct.pack("<I", 3)),
                  r"general.alignment must be a uint32 power of two, got 3"),
    "cut in a value": (header(0, 1) + kv("a", 10, b"\1\2"), r"metadata 'a' needs 8 bytes"),
    # the items of an array of strings are read in one loop; each defect still named
    "string item not UTF-8": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 8, 2) + text("ok")
                                                 + text(b"\xff")),
                              r"item 1 of metadata 'a' is not UTF-8 text"),
    "string item length": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 8, 2) + text("ok")
                                              + struct.pack("<Q", 2**40) + bytes(8)),
                           r"bytes of item 1 of metadata 'a': 1,099,511,627,776 announced"),
    "string item cut": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 8, 2) + text("abcdefgh")
                                           + bytes(4)),
                        r"the count of bytes of item 1 of metadata 'a' needs 8 bytes at "
                        r"offset \d+, 4 left"),
    "string item past the end": (header(0, 1) + kv("a", 9, struct.pack("<IQ", 8, 2)
                                                    + text("ok") + text("abcdefgh")[:-1]),
                                 r"bytes of item 1 of metadata 'a': 8 announced, .* cannot "
                                 r"fit in the 7 bytes left"),
    "key twice": (header(0, 2) + ARCH + ARCH, r"metadata 'general.architecture' appears twice"),
    "tensor twice": (header(2, 1) + ARCH + tensor_info("w", [4]) + tensor_info("w", [4])
                     + bytes(64), r"tensor 'w' appears twice"),
    "alignment type": (header(0, 2) + ARCH + kv("general.alignment", 5, struct.pack("<i", 64)),
                       r"general.alignment must be a uint32 power of two, got 64 stored as "
                       r"value type 5"),
    "version 1": (header(0, 0, version=1), r"expected format version 2 or 3 .*got version 1"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hand_made_hostile_files_are_refused_before_reading(tmp_path, name):
    data, message = HOSTILE[name]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"cannot read .*hostile\.gguf as GGUF: " + ".*" + message):
        read_gguf(path)


def test_the_smallest_valid_file_reads(tmp_path):
    """The byte builder above is right: the same bytes without the defect read back."""
    weights = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    body = header(1, 1) + ARCH + tensor_info("w", [4])
    path = tmp_path / "small.gguf"
    path.write_bytes(body + bytes(-len(body) % 32) + weights)
    g = read_gguf(path)
    assert g.architecture == "toyarch" and g.tensors["w"].tolist() == [1.0, 2.0, 3.0, 4.0]
