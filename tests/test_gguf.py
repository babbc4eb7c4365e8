"""The GGUF reader: a small file written with llama.cpp's own `gguf` writer reads back as the
values and tensors that went in, in PyTorch's (out, in) order; bad files are refused with
errors that name the file."""

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
