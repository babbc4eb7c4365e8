"""A small GPT on the default corpus: the data, model and yardsticks of the training chapter.

The chapter's live run and `scripts/train_gpt.py` (the longer, cached run) build everything here,
so both train the same model on the same tokens:

    corpus_setup()     the stdlib corpus (tfbook.corpus) -> split 90/10 at a
                       line -> BPE trained on the train part -> token streams (N,) for train
                       and validation
    gpt_config()       2 layers x 64 wide x 4 heads, context T = 64, V from the tokenizer
    train_config()     AdamW (0.9, 0.99), wd 0.1, clip 1.0, 5% warmup + cosine to 0.1x, lr 3e-3
    BATCH_SIZE, CONTEXT  B = 16 windows of T = 64 tokens a step (tfbook.train.data's
                       window_sampler and eval_windows cut them)

and the yardsticks a loss is held against, all on the validation text:

    bits per byte      nats/token / ln 2 * tokens/byte: a number a byte model and a BPE
                       model (or a compressor) share
    unigram_loss       a model that ignores context: -mean log p(token), p = smoothed counts
    compressed_bits_per_byte   gzip -9 and xz (LZMA preset 9 | extreme)
    conditional_bits_per_byte  the same compressors after reading the training text first

Shape legend: B batch, T window length, N stream length, V vocab.
"""

from __future__ import annotations

import gzip
import lzma
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tfbook.config import is_int, is_number
from tfbook.corpus import stdlib_corpus
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.train.checkpoint import load_checkpoint
from tfbook.train.loop import TrainConfig

VAL_FRACTION = 0.1  # the last tenth of the corpus (cut at a line break) is held out
VOCAB_SIZE = 2048  # BPE vocabulary: 256 bytes + 1,792 merges
CONTEXT = 64  # T, tokens per training window and the model's context length
BATCH_SIZE = 16  # B, windows per step
COMPRESSORS = ("gzip", "xz")
PROMPT = "The function returns"  # the prompt every sample of the chapter continues


def split_at_line(text: str, val_fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """Cut `text` after the last line break that leaves at least `val_fraction` of its UTF-8
    bytes for validation: split_at_line("ab\\ncd\\nef\\n", 0.5) -> ("ab\\n", "cd\\nef\\n")."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not is_number(val_fraction) or not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction!r}")
    data = text.encode("utf-8")
    limit = int(len(data) * (1.0 - val_fraction))
    cut = data.rfind(b"\n", 0, limit) + 1  # just after a line break, or 0 if none
    if cut == 0 or cut == len(data):
        raise ValueError(f"cannot split a text of {len(data)} bytes at a line break leaving "
                         f"{val_fraction:.0%} for validation: it needs a line break before "
                         f"byte {limit}")
    return data[:cut].decode("utf-8"), data[cut:].decode("utf-8")


@dataclass(frozen=True)
class CorpusSplit:
    """The corpus as the model sees it: a tokenizer and the train / validation streams."""

    tokenizer: BPETokenizer
    train_text: str
    val_text: str
    train_ids: Tensor  # (N_train,) token ids
    val_ids: Tensor  # (N_val,) token ids

    @property
    def vocab_size(self) -> int:
        """V: the 256 bytes plus the merges."""
        return self.tokenizer.vocab_size

    @property
    def val_bytes(self) -> int:
        """UTF-8 bytes of the validation text."""
        return len(self.val_text.encode("utf-8"))

    @property
    def val_tokens_per_byte(self) -> float:
        """Tokens per byte of the validation text: 1 for bytes, about 1/3 for the BPE."""
        return len(self.val_ids) / self.val_bytes

    def bits_per_byte(self, nats_per_token: float) -> float:
        """A validation loss in nats per token, as bits per byte of the validation text."""
        return bits_per_byte(nats_per_token, len(self.val_ids), self.val_bytes)


def corpus_setup(
    vocab_size: int = VOCAB_SIZE, val_fraction: float = VAL_FRACTION,
    max_bytes: int | None = None, tokenizer: BPETokenizer | None = None,
) -> CorpusSplit:
    """The default corpus split at a line, a byte-level BPE trained on the train part only
    (vocab_size = 256 means plain bytes), and both parts encoded.

    A `tokenizer` given (e.g. loaded from the cached run) is used instead of training one.
    """
    if not is_int(vocab_size) or vocab_size < 256:
        raise ValueError(f"vocab_size must be an int >= 256 (the bytes), got {vocab_size!r}")
    train_text, val_text = split_at_line(stdlib_corpus(max_bytes), val_fraction)
    if tokenizer is not None:
        if not isinstance(tokenizer, BPETokenizer):
            raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(f"the saved tokenizer has {tokenizer.vocab_size} tokens, "
                             f"vocab_size asks for {vocab_size}")
    elif vocab_size == 256:
        tokenizer = BPETokenizer({})  # no merges: one token per byte
    else:
        tokenizer = BPETokenizer.train(train_text, vocab_size, keep_trace=False)
    ids = [torch.tensor(tokenizer.encode_ordinary(t), dtype=torch.long)
           for t in (train_text, val_text)]
    return CorpusSplit(tokenizer, train_text, val_text, ids[0], ids[1])


def load_trained_gpt(directory: str | Path) -> tuple[GPT, BPETokenizer]:
    """The model (in eval mode) and tokenizer that scripts/train_gpt.py saved in `directory`;
    the checkpoint refuses to load into a model of another config."""
    directory = Path(directory)
    tokenizer = BPETokenizer.load(directory / "tokenizer.json")
    model = GPT(gpt_config(tokenizer.vocab_size))
    load_checkpoint(directory, model)
    return model.eval(), tokenizer


def gpt_config(vocab_size: int, n_layers: int = 2, d_model: int = 64, n_heads: int = 4,
               context: int = CONTEXT, dropout: float = 0.0) -> GPTConfig:
    """The chapter's GPT: GPT-2's architecture, 2 layers x 64 wide x 4 heads, context 64."""
    return replace(GPTConfig.tiny(), vocab_size=vocab_size, n_layers=n_layers,
                   d_model=d_model, n_heads=n_heads, max_len=context, dropout=dropout)


def train_config(steps: int, warmup_fraction: float = 0.05, **changes: Any) -> TrainConfig:
    """The chapter's recipe for `steps` steps: lr 3e-3, warmup over the first 5% of the steps,
    cosine down to 0.1x, AdamW (0.9, 0.99) with weight decay 0.1, clipping at 1.0."""
    if not is_number(warmup_fraction) or not 0.0 <= warmup_fraction <= 1.0:
        raise ValueError(f"warmup_fraction must lie in [0, 1], got {warmup_fraction!r}")
    if not is_int(steps) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    recipe = dict(steps=steps, lr=3e-3, schedule="cosine", warmup=round(warmup_fraction * steps),
                  min_lr_ratio=0.1, weight_decay=0.1, betas=(0.9, 0.99), clip=1.0)
    return TrainConfig(**(recipe | changes))


def sample(
    model: GPT, tokenizer: BPETokenizer, prompt: str = PROMPT, max_new_tokens: int = 40,
    temperature: float = 0.8, seed: int = 0,
) -> str:
    """The prompt continued by `generate` at `temperature`, drawn from a generator seeded with
    `seed` (so a sample does not move torch's global random state); in eval mode."""
    was_training = model.training
    model.eval()
    ids = tokenizer.encode_ordinary(prompt)
    out = generate(model, [ids], max_new_tokens, temperature=temperature,
                   generator=torch.Generator().manual_seed(seed))
    model.train(was_training)
    return prompt + tokenizer.decode(out.new_tokens[0].tolist())


def bits_per_byte(nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """Total code length in bits / bytes of text: nats_per_token * n_tokens / (ln 2 * n_bytes).
    bits_per_byte(math.log(2), 1, 1) = 1.0: one bit per one-byte token."""
    if not is_number(nats_per_token) or not math.isfinite(nats_per_token) or nats_per_token < 0:
        raise ValueError(f"nats_per_token must be a finite number >= 0, got {nats_per_token!r}")
    for name, value in (("n_tokens", n_tokens), ("n_bytes", n_bytes)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return nats_per_token * n_tokens / (math.log(2) * n_bytes)


def unigram_probs(ids: Tensor, vocab_size: int, alpha: float = 1.0) -> Tensor:
    """p(v) = (count(v) + alpha) / (N + alpha V): token frequencies with add-alpha smoothing,
    so that a token never seen in `ids` keeps a small probability. -> (V,)"""
    if not is_int(vocab_size) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if not is_number(alpha) or not alpha > 0:
        raise ValueError(f"alpha must be a number > 0 (no token may get probability 0), "
                         f"got {alpha!r}")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    counts = torch.bincount(ids, minlength=vocab_size).double()  # (V,)
    return (counts + alpha) / (counts.sum() + alpha * vocab_size)


def unigram_loss(train_ids: Tensor, val_ids: Tensor, vocab_size: int,
                 alpha: float = 1.0) -> float:
    """Cross-entropy in nats/token of a model that ignores context: the frequencies of the
    train stream (add-alpha smoothed), scored on the validation stream."""
    if len(val_ids) == 0:
        raise ValueError("val_ids is empty: there is nothing to score")
    p = unigram_probs(train_ids, vocab_size, alpha)  # (V,)
    if int(val_ids.min()) < 0 or int(val_ids.max()) >= vocab_size:
        raise ValueError(f"val_ids must lie in [0, {vocab_size})")
    return float(-p.log()[val_ids].mean())


def _compressed_size(data: bytes, method: str) -> int:
    """Bytes of `data` after "gzip" (level 9) or "xz" (preset 9 | extreme)."""
    if method not in COMPRESSORS:
        raise ValueError(f"method must be one of {COMPRESSORS}, got {method!r}")
    if method == "gzip":
        return len(gzip.compress(data, compresslevel=9, mtime=0))
    return len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def _text_bytes(text: object, name: str = "text") -> bytes:
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name} must be a non-empty str, got {type(text).__name__} "
                         f"{text!r:.40}")
    return text.encode("utf-8")


def compressed_bits_per_byte(text: str, method: str) -> float:
    """Bits per byte of `text` after compression: "gzip" (level 9) or "xz" (preset 9 | extreme)."""
    data = _text_bytes(text)
    return 8 * _compressed_size(data, method) / len(data)


def conditional_bits_per_byte(context: str, text: str, method: str) -> float:
    """Bits per byte of `text` for a compressor that has already read `context`:
    8 (|C(context + text)| - |C(context)|) / |text|, the extra bytes that `text` costs. A
    compressor given the training text is the fair match for a model trained on it."""
    data, before = _text_bytes(text), _text_bytes(context, "context")
    extra = _compressed_size(before + data, method) - _compressed_size(before, method)
    return 8 * extra / len(data)
