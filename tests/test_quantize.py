"""Weight quantisation in blocks (tfbook/quantize.py): parity with llama.cpp's GGUF formats
(the `gguf` package's reference quantisers: the values of Q8_0 and Q4_1, and the bytes of
Q8_0, Q4_0 and Q4_1 on random tensors, extreme ones and SmolLM2's own), the rounding bound,
the sizes, per-channel int8 and its integer matmul, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from tfbook.checkpoints.smollm2 import smollm2_gguf_path
from tfbook.quantize import (
    BLOCK_BYTES,
    GGUF_FORMATS,
    Int8Linear,
    _round_half_away,
    bits_per_weight,
    gguf_dequantise,
    gguf_matmul,
    gguf_quantise,
    int8_dequantise,
    int8_linear,
    int8_matmul,
    int8_per_channel,
    int8_rows,
    quantise,
    quantise_linears,
    read_gguf_blocks,
    relative_error,
    round_trip,
    rounding_bound,
    stored_bytes,
)


def weights(rows: int = 16, cols: int = 128, seed: int = 0) -> torch.Tensor:
    """Gaussian weights with a few outliers, as trained matrices have."""
    g = torch.Generator().manual_seed(seed)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    w[torch.rand(rows, cols, generator=g) < 0.01] *= 8
    return w


@pytest.mark.parametrize("kind, bits, scheme", [
    (GGMLQuantizationType.Q8_0, 8, "absmax"),
    (GGMLQuantizationType.Q4_1, 4, "zero_point"),
])
def test_blocks_of_32_with_float16_scales_are_ggufs(kind, bits: int, scheme: str) -> None:
    w = weights()
    ours = quantise(w, bits, block=32, scheme=scheme, scale_dtype=torch.float16).values
    theirs = dequantize(quantize(w.numpy(), kind), kind)
    assert np.array_equal(ours.numpy(), theirs)


@pytest.mark.parametrize("scheme", ["absmax", "zero_point"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [None, 64, 32, 8])
def test_every_weight_moves_by_at_most_half_a_step(scheme: str, bits: int, block) -> None:
    w = weights()
    q = quantise(w, bits, block, scheme)
    blocks = (q.values - w).abs().reshape(q.codes.shape)  # (R, B, n)
    assert bool((blocks <= q.step_bound * (1 + 1e-5) + 1e-9).all())
    levels = 2 ** bits - 1 if scheme == "zero_point" else 2 ** bits - 2
    assert int(q.codes.max() - q.codes.min()) <= levels


def test_smaller_blocks_never_have_a_larger_bound() -> None:
    """A block's largest |w| is at most its row's: the bound of every weight can only shrink
    when a row is cut into blocks."""
    w = weights()
    row = quantise(w, 4, None).step_bound  # (R, 1, 1)
    for block in (64, 32, 8):
        assert bool((quantise(w, 4, block).step_bound <= row).all())


def test_zero_point_step_is_at_most_absmaxs() -> None:
    """(max - min) / (2^b - 1) <= 2 max|w| / (2^b - 1) < max|w| / (2^(b-1) - 1)."""
    w = weights()
    for bits in (4, 8):
        a = quantise(w, bits, 32, "absmax").step_bound
        z = quantise(w, bits, 32, "zero_point").step_bound
        assert bool((z < a).all())


def test_bits_per_weight() -> None:
    w = weights()
    assert quantise(w, 8, 32, scale_dtype=torch.float16).bits_per_weight == 8.5  # Q8_0
    assert quantise(w, 4, 32, "zero_point", torch.float16).bits_per_weight == 5.0  # Q4_1
    assert quantise(w, 8, None).bits_per_weight == 8 + 32 / 128  # a float32 scale per row


def test_a_zero_block_stays_zero() -> None:
    w = torch.zeros(2, 64)
    for scheme in ("absmax", "zero_point"):
        assert torch.equal(quantise(w, 4, 32, scheme).values, w)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(4), 8), TypeError, r"2-D float tensor \(R, K\), got torch.Size\(\[4\]\)"),
    ((torch.zeros(2, 4, dtype=torch.int64), 8), TypeError, "2-D float tensor"),
    (([[1.0]], 8), TypeError, "got list"),
    ((torch.tensor([[1.0, float("nan")]]), 8), ValueError, "NaN or infinite"),
    ((torch.zeros(2, 64), 1), ValueError, "bits must be an int from 2 to 8, got 1"),
    ((torch.zeros(2, 64), 8.0), ValueError, "bits must be an int from 2 to 8, got 8.0"),
    ((torch.zeros(2, 64), 8, 48), ValueError, "divides the row length 64, got 48"),
    ((torch.zeros(2, 64), 8, 0), ValueError, "divides the row length 64, got 0"),
    ((torch.zeros(2, 64), 8, 32, "nf4"), ValueError, "scheme must be one of"),
    ((torch.zeros(2, 64), 8, 32, "absmax", torch.bfloat16), ValueError, "scale_dtype"),
    ((torch.zeros(2, 64), 8, 32, "absmax", "float16"), ValueError, "scale_dtype"),
    ((torch.zeros(2, 64), 8, 32.0), ValueError, "divides the row length 64, got 32.0"),
    ((torch.zeros(2, 64), True), ValueError, "bits must be an int from 2 to 8, got True"),
    ((torch.zeros(2, 0), 8), ValueError, "divides the row length 0"),
    # float16 scales that overflow, and steps whose float32 reciprocal overflows
    ((torch.full((1, 32), 1e7), 8, 32, "absmax", torch.float16), ValueError,
     "8-bit absmax block 0 needs a float16 scale of 7.874e\\+04, beyond float16's largest"),
    ((torch.tensor([[-7e4, 0.0]]), 4, None, "zero_point", torch.float16), ValueError,
     "float16 minimum of -7e\\+04"),
    ((torch.full((1, 32), 1e-39), 8), ValueError, "below float32's normal range"),
])
def test_bad_input_is_a_clear_error(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        quantise(*args)


# --- GGUF blocks, to the byte -------------------------------------------------------------


def extreme_tensors() -> dict[str, torch.Tensor]:
    """Tensors that probe the corners of the rounding rules; every last dim a multiple of 32."""
    g = torch.Generator().manual_seed(1)
    halves = torch.arange(-64, 64, dtype=torch.float32) / 2  # exact halves: the tie rule
    ties = torch.tensor([1.0, -1.0] * 16)  # |max| reached twice with both signs (Q4_0)
    return {
        "gaussian with outliers": weights(32, 256),
        "zeros": torch.zeros(3, 64),
        "constant rows": torch.full((3, 64), 0.3),
        "negative constant": torch.full((2, 32), -7.25),
        "negative only": -torch.rand(4, 96, generator=g),
        "positive only": torch.rand(4, 96, generator=g),
        "huge": 1e4 * torch.randn(4, 64, generator=g),  # scales up to float16's limit
        "tiny (float16 scale underflows)": 1e-30 * torch.randn(4, 64, generator=g),
        "float16-subnormal scales": 1e-6 * torch.randn(4, 64, generator=g),
        "halves": halves.reshape(4, 32),
        "tied maxima": torch.stack([ties, -ties]),
        "one outlier": torch.cat([torch.full((31,), 1e-3), torch.tensor([50.0])])[None],
        "3-D": torch.randn(2, 3, 96, generator=g),
        "1-D": torch.randn(64, generator=g),
        "float64": torch.randn(4, 64, generator=g, dtype=torch.float64),
        "float16": torch.randn(4, 64, generator=g).half(),
        "bfloat16": torch.randn(4, 64, generator=g).bfloat16(),
        "just below a half": torch.full((1, 32), 0.49999997) * torch.tensor([1.0] * 31 + [127.0]),
    }


@pytest.mark.parametrize("kind", GGUF_FORMATS)
@pytest.mark.parametrize("name", list(extreme_tensors()))
def test_gguf_blocks_are_byte_identical(kind: str, name: str) -> None:
    w = extreme_tensors()[name]
    reference_input = w.float().numpy() if w.dtype == torch.bfloat16 else w.numpy()
    theirs = quantize(reference_input, GGMLQuantizationType[kind])  # uint8 (..., bytes)
    ours = gguf_quantise(w, kind)
    assert ours.dtype == torch.uint8 and tuple(ours.shape) == theirs.shape
    assert np.array_equal(ours.numpy(), theirs)
    back = gguf_dequantise(ours, kind)
    assert np.array_equal(back.numpy(), dequantize(theirs, GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind, levels", [("Q8_0", 127), ("Q4_0", 8), ("Q4_1", 15)])
def test_the_largest_storable_scale(kind: str, levels: int) -> None:
    """A scale of 65,519 still rounds to float16's 65,504 (gguf stores it); 65,520 is inf."""
    w = torch.zeros(1, 32)
    w[0, 5] = 65519.0 * levels
    theirs = quantize(w.numpy(), GGMLQuantizationType[kind])
    assert np.array_equal(gguf_quantise(w, kind).numpy(), theirs)
    w[0, 5] = 65520.0 * levels
    with pytest.raises(ValueError, match="beyond float16's largest 65504"):
        gguf_quantise(w, kind)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf's numpy on NaN
@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_dequantise_reads_any_bytes_as_gguf_does(kind: str) -> None:
    """Arbitrary bytes, including float16 scales that are inf or NaN: the same floats."""
    g = torch.Generator().manual_seed(2)
    raw = torch.randint(0, 256, (7, 3 * BLOCK_BYTES[kind]), generator=g, dtype=torch.uint8)
    raw[0, :2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)  # float16 +inf
    raw[1, :2] = torch.tensor([0x01, 0x7E], dtype=torch.uint8)  # float16 NaN
    theirs = dequantize(raw.numpy(), GGMLQuantizationType[kind])
    ours = gguf_dequantise(raw, kind).numpy()
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)  # NaN where gguf has NaN


# SmolLM2's tensors, one of each kind the model has, from one layer (small, to stay fast).
SMOLLM2_NAMES = ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.17.ffn_down.weight",
                 "blk.29.ffn_gate.weight")


@pytest.fixture(scope="module")
def smollm2_blocks() -> dict:
    return read_gguf_blocks(smollm2_gguf_path(), SMOLLM2_NAMES + ("token_embd.weight",))


def test_reading_the_shipped_blocks_matches_ggufs_reader(smollm2_blocks: dict) -> None:
    for name, (kind, blocks) in smollm2_blocks.items():
        theirs = dequantize(blocks.numpy(), GGMLQuantizationType[kind])
        assert np.array_equal(gguf_dequantise(blocks, kind).numpy(), theirs), name
    assert smollm2_blocks["token_embd.weight"][0] == "Q8_0"
    assert {smollm2_blocks[n][0] for n in SMOLLM2_NAMES} == {"Q4_1"}
    import gguf  # the bytes themselves, as the llama.cpp project's reader finds them

    stored = {t.name: t for t in gguf.GGUFReader(smollm2_gguf_path()).tensors}
    for name, (kind, blocks) in smollm2_blocks.items():
        assert stored[name].tensor_type.name == kind
        assert np.array_equal(blocks.numpy(), np.asarray(stored[name].data)), name


@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_smollm2_tensors_quantise_byte_identically(smollm2_blocks: dict, kind: str) -> None:
    for name in SMOLLM2_NAMES:
        stored_kind, stored = smollm2_blocks[name]
        w = gguf_dequantise(stored, stored_kind)  # (out, in) float32, the model's weights
        theirs = quantize(w.numpy(), GGMLQuantizationType[kind])
        ours = gguf_quantise(w, kind)
        assert np.array_equal(ours.numpy(), theirs), name
        assert np.array_equal(gguf_dequantise(ours, kind).numpy(),
                              dequantize(theirs, GGMLQuantizationType[kind])), name


def test_embedding_rows_quantise_byte_identically(smollm2_blocks: dict) -> None:
    kind, stored = smollm2_blocks["token_embd.weight"]
    w = gguf_dequantise(stored[::97], kind)  # every 97th of the 49,152 rows
    for target in GGUF_FORMATS:
        theirs = quantize(w.numpy(), GGMLQuantizationType[target])
        assert np.array_equal(gguf_quantise(w, target).numpy(), theirs), target


@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_gguf_rounding_bound(kind: str) -> None:
    """Every weight moves by at most half a step of its block (d / 2 for the float16 d,
    plus the rounding of d and m themselves), except Q4_0's clipped top level (one step)."""
    w = weights(32, 256)
    blocks = gguf_quantise(w, kind)
    back = gguf_dequantise(blocks, kind)
    x, xb = w.reshape(-1, 32), back.reshape(-1, 32)
    d = blocks.reshape(-1, BLOCK_BYTES[kind])[:, :2].contiguous().view(torch.float16).float()
    levels = {"Q8_0": 127, "Q4_0": 8, "Q4_1": 15}[kind]
    # d is rounded to float16 (relative error 2^-11): a code q far from 0 moves by q * that.
    slack = levels * d.abs() * 2.0 ** -11 + 1e-6 * x.abs().amax(dim=-1, keepdim=True)
    if kind == "Q4_1":
        slack = slack + x.amin(dim=-1, keepdim=True).abs() * 2.0 ** -11  # m in float16
    step = d.abs() / 2
    if kind == "Q4_0":  # codes -8..7: a weight beyond 7.5 d (opposite the largest) is clipped
        step = torch.where(x / d > 7.5, d.abs(), step)  # to 7 d: it moves by up to d
    assert bool(((xb - x).abs() <= step + slack).all())
    assert bits_per_weight(kind) == {"Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0}[kind]


def test_q4_0_is_asymmetric_by_one_level() -> None:
    """Q4_0 maps the weight of largest |w| to -8: its sign picks which end gets 16 levels."""
    w = torch.linspace(-1, 0.5, 32)[None]  # the largest |w| is negative: it gets code 0
    q = gguf_quantise(w, "Q4_0")[0, 2:]  # the 16 bytes of codes
    assert int(q[0] & 0x0F) == 0  # w[0] = -1 -> code 0 -> (0 - 8) d = -1
    assert float(gguf_dequantise(gguf_quantise(w, "Q4_0"), "Q4_0")[0, 0]) == -1.0


def test_nibble_layout() -> None:
    """Byte i of a Q4_1 block holds weight i in its low 4 bits and weight i + 16 in its high."""
    w = torch.arange(32, dtype=torch.float32)[None] % 16  # codes 0..15, 0..15
    blocks = gguf_quantise(w, "Q4_1")[0]
    d, m = blocks[:2].view(torch.float16), blocks[2:4].view(torch.float16)
    assert float(d) == 1.0 and float(m) == 0.0
    assert blocks[4:].tolist() == [i | (i << 4) for i in range(16)]


def test_roundf_is_exact_next_to_a_half() -> None:
    """floor(|x| + 0.5) rounds 0.49999997 to 1; C's roundf (and gguf) give 0."""
    x = torch.tensor([0.49999997, -0.49999997, 0.5, -0.5, 1.5, -2.5, 2.4999998])
    assert _round_half_away(x).tolist() == [0.0, -0.0, 1.0, -1.0, 2.0, -3.0, 2.0]
    assert torch.floor(x[:1].abs() + 0.5).item() == 1.0  # the naive rule's mistake


@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_gguf_matmul_is_the_dequantised_product(kind: str) -> None:
    w, x = weights(48, 128), weights(5, 128, seed=3)
    blocks = gguf_quantise(w, kind)
    assert torch.equal(gguf_matmul(x, blocks, kind), x @ gguf_dequantise(blocks, kind).T)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(2, 48), "Q4_1"), ValueError, r"multiple of 32, got shape \(2, 48\)"),
    ((torch.zeros(2, 0), "Q8_0"), ValueError, r"w is empty \(shape \(2, 0\)\)"),
    ((torch.zeros(0, 32), "Q8_0"), ValueError, "nothing to quantise"),
    ((torch.zeros(()), "Q8_0"), ValueError, r"got shape \(\)"),
    ((torch.zeros(2, 32, dtype=torch.int32), "Q8_0"), TypeError, "float tensor.*got torch.int32"),
    ((torch.zeros(2, 32, dtype=torch.bool), "Q4_0"), TypeError, "got torch.bool"),
    ((np.zeros((2, 32), np.float32), "Q8_0"), TypeError, "torch float tensor.*got ndarray"),
    ((torch.tensor([[float("nan")] * 32]), "Q4_0"), ValueError, "NaN or infinite"),
    ((torch.tensor([[float("inf")] + [0.0] * 31]), "Q4_1"), ValueError, "NaN or infinite"),
    ((torch.zeros(2, 32), "Q5_0"), ValueError, r"kind must be one of \('Q8_0', 'Q4_0', 'Q4_1'\)"),
    ((torch.zeros(2, 32), GGMLQuantizationType.Q4_1), ValueError, "kind must be one of"),
    ((torch.full((1, 32), 1e7), "Q8_0"), ValueError, "float16 scale of 7.874e\\+04, beyond"),
    ((torch.full((1, 32), 1e6), "Q4_0"), ValueError, "scale of -1.25e\\+05, beyond"),
    ((torch.tensor([[-7e4] + [0.0] * 31]), "Q4_1"), ValueError, "float16 minimum of -7e\\+04"),
    ((torch.tensor([[-3e38] + [3e38] * 31]), "Q4_1"), ValueError, "float16 scale of inf"),
    ((torch.full((1, 32), 1e-38), "Q8_0"), ValueError, "below float32's normal range"),
    ((torch.zeros(2, 32, dtype=torch.complex64), "Q8_0"), TypeError, "got torch.complex64"),
    ((torch.zeros(2, 32), None), ValueError, "kind must be one of"),
])
def test_gguf_bad_input_is_a_clear_error(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        gguf_quantise(*args)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(2, 20, dtype=torch.uint8), "Q8_0"), ValueError, "multiple of 34"),
    ((torch.zeros(2, 0, dtype=torch.uint8), "Q4_1"), ValueError, "positive multiple of 20"),
    ((torch.zeros(2, 18), "Q4_0"), TypeError, "uint8 tensor of Q4_0 bytes, got torch.float32"),
    ((b"\x00" * 18, "Q4_0"), TypeError, "got bytes"),
    ((torch.zeros(2, 18, dtype=torch.uint8), "q4_0"), ValueError, "kind must be one of"),
])
def test_gguf_dequantise_bad_input(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        gguf_dequantise(*args)


def test_read_gguf_blocks_refuses_what_it_cannot_give() -> None:
    with pytest.raises(ValueError, match="has no tensors \\['nope'\\]"):
        read_gguf_blocks(smollm2_gguf_path(), ["nope"])
    with pytest.raises(ValueError, match="output_norm.weight.* is F32, expected one of"):
        read_gguf_blocks(smollm2_gguf_path(), ["output_norm.weight"])


# --- per-channel int8 (the page model's) and the integer matmul ---------------------------


def test_int8_per_channel_is_absmax_per_row() -> None:
    w = weights(16, 128)
    w[3] = 0.0  # a row of zeros: scale 1, codes 0
    q, scale = int8_per_channel(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (16,)
    assert float(scale[3]) == 1.0 and not bool(q[3].any())
    expected = w.abs().amax(dim=1) / 127
    assert torch.equal(scale[[i for i in range(16) if i != 3]],
                       expected[[i for i in range(16) if i != 3]])
    assert int(q.abs().max()) == 127
    back = int8_dequantise(q, scale)
    assert bool(((back - w).abs() <= scale[:, None] / 2 * (1 + 1e-5)).all())


def test_int8_matmul_equals_the_exact_integer_product() -> None:
    """_int_mm sums int8 products in int32, exactly; the only rounding beyond the weights' is
    the input's own int8 rounding and the final float32 products."""
    w, x = weights(48, 256), weights(6, 256, seed=4)
    q, scale = int8_per_channel(w)
    qx, sx = int8_per_channel(x)
    exact = (qx.double() @ q.double().T) * sx.double()[:, None] * scale.double()[None]
    y = int8_matmul(x, q, scale)
    assert y.shape == (6, 48)
    assert torch.allclose(y.double(), exact, rtol=1e-6, atol=0)
    # against the float product: off by at most the input's rounding, |x - x~| <= s_t / 2
    reference = x @ int8_dequantise(q, scale).T
    bound = (sx[:, None] / 2) * int8_dequantise(q, scale).abs().sum(dim=1)[None] * (1 + 1e-4)
    assert bool(((y - reference).abs() <= bound).all())


@pytest.mark.parametrize("fn, args, error, message", [
    (int8_dequantise, (torch.zeros(2, 4), torch.ones(2)), TypeError, "2-D int8 tensor"),
    (int8_dequantise, (torch.zeros(2, 4, dtype=torch.int8), torch.ones(3)), ValueError,
     r"shape \(2,\), one per row of q, got torch.float32 \(3,\)"),
    (int8_matmul, (torch.zeros(2, 4, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8),
                   torch.ones(2)), TypeError, "x must be a 2-D float tensor"),
    (int8_matmul, (torch.zeros(2, 8), torch.zeros(2, 4, dtype=torch.int8), torch.ones(2)),
     ValueError, "x has 8 columns, the weight 4"),
    (int8_per_channel, (torch.zeros(4),), TypeError, "2-D float tensor"),
    (int8_per_channel, ([[1.0]],), TypeError, "got list"),
    (int8_per_channel, (torch.tensor([[float("nan"), 1.0]]),), ValueError, "NaN or infinite"),
    (int8_dequantise, (torch.zeros(2, 4, dtype=torch.int8), torch.tensor([1.0, float("nan")])),
     ValueError, "scale holds NaN or infinite"),
    (int8_dequantise, (torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, dtype=torch.int64)),
     ValueError, "float tensor of shape \\(2,\\).*got torch.int64"),
    (int8_dequantise, (torch.zeros(2, 4, dtype=torch.int8), [1.0, 1.0]), ValueError, "got list"),
    (int8_matmul, (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int8),
                   torch.ones(2)), TypeError, r"2-D float tensor \(T, K\), got torch.int64"),
    (int8_matmul, (torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.int8), torch.ones(2)),
     TypeError, r"got torch.float32 \(2, 3, 4\)"),
    (int8_matmul, (torch.zeros(1, 4), torch.zeros(2, 4, dtype=torch.int8),
                   torch.tensor([1.0, float("inf")])), ValueError, "scale holds NaN or infinite"),
    (int8_rows, ([[1.0]],), TypeError, "2-D float tensor"),
    (int8_rows, (torch.zeros(2, 3, dtype=torch.int32),), TypeError, "got torch.int32"),
    (int8_rows, (torch.tensor([[1.0, 2.0], [float("-inf"), 0.0]]),), ValueError,
     r"NaN or infinite values \(row 1 of 2\)"),
    (int8_linear, ([[1.0] * 4], torch.zeros(2, 4, dtype=torch.int8), torch.ones(2)), TypeError,
     r"float tensor \(..., C\), got list"),
    (int8_linear, (torch.tensor(1.0), torch.zeros(2, 4, dtype=torch.int8), torch.ones(2)),
     TypeError, r"got torch.float32 \(\)"),
    (int8_linear, (torch.zeros(3, 4), torch.zeros(2, 4, dtype=torch.int8), torch.ones(2),
                   torch.zeros(5)), ValueError, r"one number per row of the codes, shape \(2,\), "
                                                r"got \(5,\)"),
    (int8_linear, (torch.zeros(3, 4), torch.zeros(2, 4, dtype=torch.int8), torch.ones(2),
                   [0.0, 0.0]), TypeError, "bias must be None or a float tensor"),
])
def test_int8_bad_input(fn, args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        fn(*args)


# --- re-quantising ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_quantised_weights_are_a_fixed_point(kind: str) -> None:
    """Q8_0 and Q4_0 find their float16 step again exactly from their own output; so does
    Q4_1 unless a block's minimum dwarfs its range (15 d + m then rounds in float32)."""
    once = gguf_quantise(weights(32, 256), kind)
    assert torch.equal(gguf_quantise(gguf_dequantise(once, kind), kind), once)
    flat = 1 + 1e-6 * torch.randn(200, 32, generator=torch.Generator().manual_seed(5))
    once = gguf_quantise(flat, kind)
    again = gguf_quantise(gguf_dequantise(once, kind), kind)
    assert torch.equal(again, once) == (kind != "Q4_1")


@pytest.mark.parametrize("kind", GGUF_FORMATS)
@pytest.mark.parametrize("name", ["gaussian with outliers", "negative only", "huge", "halves",
                                  "one outlier", "3-D", "float16-subnormal scales"])
def test_rounding_bound_holds(kind: str, name: str) -> None:
    from tfbook.quantize import rounding_bound

    w = extreme_tensors()[name]
    x = w.float().reshape(-1, 32)
    error = (gguf_dequantise(gguf_quantise(w, kind), kind).reshape(-1, 32) - x).abs()
    assert bool((error <= rounding_bound(w, kind)).all())


# --- signed zeros, equal weights, tiny and huge ones: which reference, byte for byte -------


def q4_1_c_reference(blocks: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q4_1_ref (ggml-quants.c) transcribed, in float32 scalars: the
    minimum and maximum by strict comparisons in order, so the first of tied weights wins
    (+0 and -0 compare equal)."""
    out = []
    for block in blocks.astype(np.float32):
        low, high = np.float32(np.finfo(np.float32).max), np.float32(-np.finfo(np.float32).max)
        for v in block:
            if v < low:
                low = v
            if v > high:
                high = v
        d = (high - low) / np.float32(15)
        inverse = np.float32(1) / d if d != 0 else np.float32(0)
        codes = [min(15, int(np.float32((v - low) * inverse) + np.float32(0.5))) for v in block]
        qs = [codes[j] | (codes[j + 16] << 4) for j in range(16)]
        head = np.array([d, low], dtype=np.float16).view(np.uint8)
        out.append(np.concatenate([head, np.array(qs, dtype=np.uint8)]))
    return np.stack(out)


def signed_zero_blocks() -> dict[str, np.ndarray]:
    """(N, 32) float32 blocks where +0 and -0 meet: alone, as a block's minimum, as its
    maximum; blocks of one repeated value; tiny and huge values beside zeros."""
    g = np.random.default_rng(7)
    zero, minus = np.float32(0.0), np.float32(-0.0)

    def sprinkle(base: np.ndarray, share: float) -> np.ndarray:
        where = g.random(base.shape) < share
        signs = np.where(g.random(base.shape) < 0.5, minus, zero)
        return np.where(where, signs, base).astype(np.float32)

    mixes = np.where(g.random((64, 32)) < 0.5, minus, zero).astype(np.float32)
    mixes[0], mixes[1] = zero, minus  # all +0, all -0
    mixes[2, 0], mixes[3, 31] = minus, minus  # one -0 first, one -0 last
    return {
        "+0/-0 mixes": mixes,
        "positive with zeros (zero is the minimum)": sprinkle(g.random((64, 32)), 0.2),
        "negative with zeros (zero is the maximum)": sprinkle(-g.random((64, 32)), 0.2),
        "all equal": np.repeat(np.array([[0.3], [-7.25], [1e-30], [-1e4], [0.0], [-0.0],
                                         [6e4]], np.float32), 32, axis=1),
        "tiny with zeros": sprinkle(1e-30 * g.standard_normal((32, 32)), 0.3),
        "huge with zeros": sprinkle(1e4 * g.standard_normal((32, 32)), 0.3),
        "float16-subnormal scales with zeros": sprinkle(1e-6 * g.standard_normal((32, 32)), 0.3),
    }


def has_zero_tie(blocks: np.ndarray) -> np.ndarray:
    """Blocks whose minimum or maximum is zero held both as +0 and as -0."""
    zero = blocks == 0
    both = (zero & np.signbit(blocks)).any(1) & (zero & ~np.signbit(blocks)).any(1)
    return both & ((blocks.min(1) == 0) | (blocks.max(1) == 0))


@pytest.mark.parametrize("name", list(signed_zero_blocks()))
@pytest.mark.parametrize("kind", GGUF_FORMATS)
def test_signed_zeros_and_equal_weights(kind: str, name: str) -> None:
    """Q8_0 and Q4_0 write gguf.quants' bytes. Q4_1 writes the C reference's bytes on every
    block, gguf.quants' bytes wherever its numpy min/max cannot tie +0 with -0, and where they
    can, bytes that differ at most in the sign bit of a zero m or d (numpy's pick there
    depends on its SIMD kernels). The weights read back are gguf's everywhere."""
    blocks = signed_zero_blocks()[name]
    ours = gguf_quantise(torch.from_numpy(blocks), kind).numpy()
    theirs = quantize(blocks, GGMLQuantizationType[kind])
    np.testing.assert_array_equal(gguf_dequantise(torch.from_numpy(ours), kind).numpy(),
                                  dequantize(theirs, GGMLQuantizationType[kind]))
    if kind != "Q4_1":
        np.testing.assert_array_equal(ours, theirs)
        return
    np.testing.assert_array_equal(ours, q4_1_c_reference(blocks))
    tie = has_zero_tie(blocks)
    np.testing.assert_array_equal(ours[~tie], theirs[~tie])
    differ = ours != theirs  # (N, 20): only the top bit of bytes 1 (d) and 3 (m)
    assert not differ[:, [0, 2]].any() and not differ[:, 4:].any()
    assert ((ours ^ theirs)[:, [1, 3]] & 0x7F == 0).all()
    assert (np.abs(ours[:, 0:4].view(np.float16)[differ[:, [1, 3]]]) == 0).all()
    if name == "+0/-0 mixes":
        first = np.signbit(blocks[:, 0])  # all zero: m is the first weight, d = x0 - x0 = +0
        np.testing.assert_array_equal(np.signbit(ours[:, 2:4].view(np.float16)[:, 0]), first)
        assert not np.signbit(ours[:, 0:2].view(np.float16)).any()


def test_int8_matmul_refuses_non_finite_input() -> None:
    """A NaN or inf in one row used to round to codes 0 without a trace; now it is refused,
    whichever row holds it, and the other rows are unaffected when it is absent."""
    q, scale = int8_per_channel(weights(8, 64))
    x = weights(5, 64, seed=9)
    good = int8_matmul(x, q, scale)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for row in (0, 4):
            y = x.clone()
            y[row, 3] = bad
            with pytest.raises(ValueError, match=f"NaN or infinite values \\(row {row} of 5\\)"):
                int8_matmul(y, q, scale)
            with pytest.raises(ValueError, match="NaN or infinite"):
                Int8Linear(torch.nn.Linear(64, 8))(y[None])
    assert torch.equal(int8_matmul(x, q, scale), good)
    zeros = torch.zeros(2, 64)  # a row of zeros is fine: scale 1, codes 0, outputs 0
    assert torch.equal(int8_matmul(zeros, q, scale), torch.zeros(2, 8))
    assert int8_matmul(torch.zeros(0, 64), q, scale).shape == (0, 8)


def test_int8_rows_is_int8_per_channel() -> None:
    """int8_rows (the fast path of every product) rounds exactly as int8_per_channel."""
    x = weights(9, 96, seed=11)
    x[4] = 0.0
    codes, scale = int8_rows(x)
    want_codes, want_scale = int8_per_channel(x)
    assert torch.equal(codes, want_codes) and torch.equal(scale, want_scale)


def test_gguf_matmul_input() -> None:
    """x of any float dtype (the weight is used in x's dtype); NaN or inf in x reach exactly
    the outputs of their rows, as in x @ W^T (a defined result, not a silent one)."""
    w = weights(24, 64)
    blocks = gguf_quantise(w, "Q4_1")
    W = gguf_dequantise(blocks, "Q4_1")
    x = weights(4, 64, seed=5).double()
    assert torch.equal(gguf_matmul(x, blocks, "Q4_1"), x @ W.double().T)
    x = x.float()
    x[2, 7] = float("nan")
    y = gguf_matmul(x, blocks, "Q4_1")
    assert bool(y[2].isnan().all()) and not bool(y[[0, 1, 3]].isnan().any())
    assert gguf_matmul(x[0], blocks, "Q4_1").shape == (24,)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(2, 64, dtype=torch.int64), torch.zeros(3, 40, dtype=torch.uint8), "Q4_1"),
     TypeError, r"x must be a float tensor \(..., K\), got torch.int64"),
    (([[0.0] * 64], torch.zeros(3, 36, dtype=torch.uint8), "Q4_0"), TypeError, "got list"),
    ((torch.zeros(2, 32), torch.zeros(3, 36, dtype=torch.uint8), "Q4_0"), ValueError,
     "x has 32 features in its last dimension, the Q4_0 weight 64 columns"),
    ((torch.zeros(2, 32), torch.zeros(34, dtype=torch.uint8), "Q8_0"), TypeError,
     r"blocks must be a 2-D uint8 tensor \(N, K // 32 \* 34\)"),
    ((torch.zeros(2, 32), torch.zeros(2, 3, 34, dtype=torch.uint8), "Q8_0"), TypeError, "2-D"),
    ((torch.zeros(2, 32), torch.zeros(3, 34), "Q8_0"), TypeError, "uint8 tensor of Q8_0 bytes"),
    ((torch.zeros(2, 32), torch.zeros(3, 30, dtype=torch.uint8), "Q8_0"), ValueError,
     "multiple of 34"),
    ((torch.zeros(2, 32), torch.zeros(3, 34, dtype=torch.uint8), "Q2_K"), ValueError,
     "kind must be one of"),
])
def test_gguf_matmul_bad_input(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        gguf_matmul(*args)


@pytest.mark.parametrize("fn, args, error, message", [
    (round_trip, (torch.zeros(32), "Q8_0"), TypeError, r"2-D float tensor \(R, K\)"),
    (round_trip, (torch.zeros(2, 48), "Q4_1"), ValueError, "multiple of 32"),
    (round_trip, (torch.zeros(2, 32), "Q5"), ValueError, "fmt must be one of"),
    (round_trip, (torch.zeros(2, 32, dtype=torch.int8), "int8 per channel"), TypeError,
     "2-D float tensor"),
    (round_trip, (torch.tensor([[float("nan")] * 32]), "Q4_0"), ValueError, "NaN or infinite"),
    (stored_bytes, ([2, 32], "Q8_0"), TypeError, r"tuple of ints, got \[2, 32\]"),
    (stored_bytes, ((2.0, 32), "Q8_0"), TypeError, "tuple of ints"),
    (stored_bytes, ((2, -32), "Q8_0"), ValueError, "sizes cannot be negative"),
    (stored_bytes, ((2, 33), "Q4_0"), ValueError, "multiple of 32, got shape \\(2, 33\\)"),
    (stored_bytes, ((2, 32), "fp8"), ValueError, "fmt must be one of"),
    (relative_error, ([1.0], [1.0]), TypeError, "w must be a float tensor, got list"),
    (relative_error, (torch.ones(3), torch.ones(3, dtype=torch.int64)), TypeError,
     "w_hat must be a float tensor, got torch.int64"),
    (relative_error, (torch.ones(2, 3), torch.ones(3)), ValueError, "one shape"),
    (relative_error, (torch.zeros(4), torch.ones(4)), ValueError, "all zeros"),
    (relative_error, (torch.ones(2), torch.tensor([1.0, float("inf")])), ValueError,
     "NaN or infinite"),
    (rounding_bound, (torch.zeros(2, 40), "Q8_0"), ValueError, "multiple of 32"),
    (rounding_bound, (torch.zeros(2, 32), "q8_0"), ValueError, "kind must be one of"),
    (rounding_bound, (torch.tensor([[float("inf")] * 32]), "Q4_1"), ValueError, "NaN or inf"),
    (bits_per_weight, ("Q6_K",), ValueError, "kind must be one of"),
    (quantise_linears, ("model",), TypeError, "needs an nn.Module, got str"),
    (Int8Linear, (torch.nn.Conv1d(2, 2, 1),), TypeError, "built from an nn.Linear, got Conv1d"),
])
def test_bad_input_to_the_other_functions(fn, args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        fn(*args)


def test_int8_linear_layer_bad_input() -> None:
    layer = Int8Linear(torch.nn.Linear(4, 3))
    with pytest.raises(TypeError, match=r"float tensor \(..., 4\), got list"):
        layer([1.0] * 4)
    with pytest.raises(ValueError, match=r"expected x \(..., 4\), got \(2, 5\)"):
        layer(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="got torch.int64"):
        layer(torch.zeros(2, 4, dtype=torch.int64))
    nan_weights = torch.nn.Linear(4, 3)
    with torch.no_grad():
        nan_weights.weight[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        Int8Linear(nan_weights)


def test_read_gguf_blocks_bad_arguments() -> None:
    path = smollm2_gguf_path()
    with pytest.raises(TypeError, match=r"list of tensor names \(for one name: \[name\]\), "
                                        "got str 'token_embd.weight'"):
        read_gguf_blocks(path, "token_embd.weight")
    with pytest.raises(TypeError, match=r"tensor names \(str\), got \[3\]"):
        read_gguf_blocks(path, [3])
    with pytest.raises(TypeError, match="path must be a str or Path"):
        read_gguf_blocks(3, ["token_embd.weight"])
    with pytest.raises(FileNotFoundError, match="no GGUF file at /nonexistent.gguf"):
        read_gguf_blocks("/nonexistent.gguf", ["token_embd.weight"])
