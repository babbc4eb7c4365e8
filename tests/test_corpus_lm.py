"""The training chapter's corpus model: the split, the token streams, the recipe and the
yardsticks (bits per byte, the unigram model, gzip and xz) against independent references."""

import math
import shutil
import subprocess
from collections import Counter

import pytest
import torch

from tfbook.corpus import stdlib_corpus
from tfbook.models.gpt import GPT
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.train.corpus_lm import (
    bits_per_byte,
    compressed_bits_per_byte,
    conditional_bits_per_byte,
    corpus_setup,
    gpt_config,
    sample,
    split_at_line,
    train_config,
    unigram_loss,
    unigram_probs,
)
from tfbook.train.data import eval_windows, window_sampler
from tfbook.train.loop import train

SMALL = 40_000  # bytes of corpus for the quick tests


@pytest.fixture(scope="module")
def data():
    return corpus_setup(vocab_size=300, max_bytes=SMALL)


def test_split_at_line_keeps_every_byte_and_cuts_after_a_newline():
    text = stdlib_corpus(SMALL)
    train_text, val_text = split_at_line(text, 0.1)
    assert train_text + val_text == text
    assert train_text.endswith("\n")
    n = len(text.encode("utf-8"))
    assert len(val_text.encode("utf-8")) >= 0.1 * n
    # the cut is the LAST line break that leaves 10%: the next one would leave too little
    nxt = val_text.find("\n")
    assert len(train_text.encode()) + len(val_text[: nxt + 1].encode()) > 0.9 * n
    assert split_at_line("ab\ncd\nef\n", 0.5) == ("ab\n", "cd\nef\n")


def test_corpus_setup_trains_the_tokenizer_on_the_train_split_only(data):
    assert data.train_text + data.val_text == stdlib_corpus(SMALL)
    reference = BPETokenizer.train(data.train_text, 300, keep_trace=False)
    assert data.tokenizer.merges == reference.merges
    assert data.tokenizer.decode(data.train_ids.tolist()) == data.train_text
    assert data.tokenizer.decode(data.val_ids.tolist()) == data.val_text
    assert data.vocab_size == 300
    # a saved tokenizer given back gives the same streams
    again = corpus_setup(vocab_size=300, max_bytes=SMALL, tokenizer=reference)
    assert torch.equal(again.val_ids, data.val_ids)


def test_vocab_256_is_plain_bytes():
    data = corpus_setup(vocab_size=256, max_bytes=5_000)
    assert data.val_ids.tolist() == list(data.val_text.encode("utf-8"))
    assert data.val_tokens_per_byte == 1.0


def test_bits_per_byte_equals_the_code_length_of_a_byte_unigram_model():
    """Reference: -sum log2 p(byte) / bytes, counted with collections.Counter."""
    data = corpus_setup(vocab_size=256, max_bytes=20_000)
    counts = Counter(data.train_text.encode("utf-8"))
    total = sum(counts.values())
    probs = {b: (counts[b] + 1) / (total + 256) for b in range(256)}
    val = data.val_text.encode("utf-8")
    bits = -sum(math.log2(probs[b]) for b in val)
    nats = unigram_loss(data.train_ids, data.val_ids, 256)
    assert nats == pytest.approx(-sum(math.log(probs[b]) for b in val) / len(val), rel=1e-12)
    assert data.bits_per_byte(nats) == pytest.approx(bits / len(val), rel=1e-12)
    assert bits_per_byte(math.log(2), 1, 1) == pytest.approx(1.0)


def test_bpe_unigram_loss_and_bits_per_byte(data):
    """With BPE the same unigram code, in bits, is divided by bytes instead of tokens."""
    counts = Counter(data.train_ids.tolist())
    total = sum(counts.values())
    p = unigram_probs(data.train_ids, 300, alpha=0.5)
    assert torch.allclose(p, torch.tensor([(counts[v] + 0.5) / (total + 150)
                                           for v in range(300)], dtype=torch.float64))
    bits = -sum(math.log2((counts[v] + 1) / (total + 300)) for v in data.val_ids.tolist())
    nats = unigram_loss(data.train_ids, data.val_ids, 300)
    assert data.bits_per_byte(nats) == pytest.approx(bits / data.val_bytes, rel=1e-12)


@pytest.mark.parametrize("method, command", [("gzip", ["gzip", "-9", "-n", "-c"]),
                                             ("xz", ["xz", "-9e", "-c"])])
def test_compressors_match_the_command_line_tools(method, command):
    if shutil.which(command[0]) is None:
        pytest.skip(f"the {command[0]} program is not installed")
    text = stdlib_corpus(30_000)
    data = text.encode("utf-8")
    packed = subprocess.run(command, input=data, capture_output=True, check=True).stdout
    assert compressed_bits_per_byte(text, method) == pytest.approx(8 * len(packed) / len(data))
    assert compressed_bits_per_byte("abc" * 2000, method) < 0.5  # repetition costs nothing


@pytest.mark.parametrize("method", ["gzip", "xz"])
def test_conditional_compression_is_the_extra_size(method):
    import gzip
    import lzma

    context, text = stdlib_corpus(30_000), "Return the value of x.\n" * 20
    pack = {"gzip": lambda b: gzip.compress(b, 9, mtime=0),
            "xz": lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME)}[method]
    extra = len(pack((context + text).encode())) - len(pack(context.encode()))
    assert conditional_bits_per_byte(context, text, method) == 8 * extra / len(text)
    # a text already read costs almost nothing once the compressor has seen it
    seen = context[-2000:]
    assert conditional_bits_per_byte(context, seen, method) < 0.2 * compressed_bits_per_byte(
        seen, method)


def test_windows_are_shifted_by_one(data):
    x, y = window_sampler(data.train_ids, 4, 16)(torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    full = eval_windows(data.val_ids, batch_size=8, T=16)
    n = (len(data.val_ids) - 1) // 16
    assert sum(len(b[0]) for b in full) == n
    assert torch.equal(torch.cat([b[0] for b in full]).flatten(), data.val_ids[: n * 16])
    some = eval_windows(data.val_ids, batch_size=8, T=16, max_windows=20)
    assert [len(b[0]) for b in some] == [8, 8, 4]
    first, last = some[0][0][0], some[-1][0][-1]  # spread from the first to the last window
    assert torch.equal(first, full[0][0][0]) and torch.equal(last, full[-1][0][-1])
    xs, ys = torch.cat([b[0] for b in some]), torch.cat([b[1] for b in some])
    assert torch.equal(xs[:, 1:], ys[:, :-1])


def test_recipe():
    config = train_config(2000)
    assert (config.warmup, config.lr, config.betas, config.clip) == (100, 3e-3, (0.9, 0.99), 1.0)
    assert (config.weight_decay, config.min_lr_ratio, config.schedule) == (0.1, 0.1, "cosine")
    assert train_config(300, label_smoothing=0.1).label_smoothing == 0.1
    model_config = gpt_config(2048)
    assert (model_config.n_layers, model_config.d_model, model_config.n_heads,
            model_config.max_len, model_config.vocab_size) == (2, 64, 4, 64, 2048)


def test_sample_is_reproducible_and_leaves_the_global_generator(data):
    torch.manual_seed(0)
    model = GPT(gpt_config(data.vocab_size))
    train(model, window_sampler(data.train_ids, 4, 16), train_config(3), progress=False)
    state = torch.get_rng_state()
    first = sample(model, data.tokenizer, "The ", max_new_tokens=10, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training  # put back in the mode it was in
    assert first == sample(model, data.tokenizer, "The ", max_new_tokens=10, seed=3)
    assert first.startswith("The ")


def test_bad_input(data):
    with pytest.raises(ValueError, match=r"val_fraction must lie in \(0, 1\), got 1.5"):
        split_at_line("a\nb\n", 1.5)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        split_at_line(b"a\nb\n")
    with pytest.raises(ValueError, match="needs a line break before byte"):
        split_at_line("no line break at all", 0.1)
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int or None"):
        corpus_setup(max_bytes=-1)
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256"):
        corpus_setup(vocab_size=100)
    with pytest.raises(ValueError, match="the saved tokenizer has 300 tokens, vocab_size "
                                         "asks for 512"):
        corpus_setup(vocab_size=512, max_bytes=SMALL, tokenizer=data.tokenizer)
    with pytest.raises(TypeError, match="tokenizer must be a BPETokenizer, got dict"):
        corpus_setup(vocab_size=300, max_bytes=SMALL, tokenizer={})
    with pytest.raises(ValueError, match="nats_per_token must be a finite number >= 0"):
        bits_per_byte(float("nan"), 10, 10)
    with pytest.raises(ValueError, match="n_bytes must be a positive int, got 0"):
        bits_per_byte(1.0, 10, 0)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 10\), got values in"):
        unigram_probs(torch.tensor([3, 12]), 10)
    with pytest.raises(ValueError, match="alpha must be a number > 0"):
        unigram_probs(torch.tensor([3]), 10, alpha=0)
    with pytest.raises(ValueError, match="val_ids is empty"):
        unigram_loss(torch.tensor([1]), torch.tensor([], dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"method must be one of \('gzip', 'xz'\), got 'zip'"):
        compressed_bits_per_byte("text", "zip")
    with pytest.raises(ValueError, match="too short for windows of T \\+ 1 = 65"):
        window_sampler(torch.arange(10), 16, 64)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        window_sampler(data.train_ids, batch_size=0, T=64)
    with pytest.raises(ValueError, match="T must be a positive int, got 0"):
        window_sampler(data.train_ids, 16, T=0)
    with pytest.raises(TypeError, match="1-D integer tensor"):
        window_sampler(data.train_ids.float(), 16, 64)
    with pytest.raises(ValueError, match="T must be a positive int, got -2"):
        eval_windows(data.val_ids, 64, T=-2)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        eval_windows(data.val_ids, batch_size=0, T=64)
    with pytest.raises(ValueError, match="context must be a non-empty str, got bytes"):
        conditional_bits_per_byte(b"abc", "text", "xz")
    with pytest.raises(ValueError, match="text must be a non-empty str, got str ''"):
        conditional_bits_per_byte("abc", "", "xz")
    with pytest.raises(ValueError, match="max_windows must be a positive int or None"):
        eval_windows(data.val_ids, 64, 64, max_windows=0)
    with pytest.raises(ValueError, match="warmup_fraction must lie in"):
        train_config(100, warmup_fraction=2)
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        train_config(0)
