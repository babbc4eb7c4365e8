"""Passkey retrieval (Mohtashami & Jaggi 2023): can a model find one fact in a long text?

The prompt follows the one of "Landmark attention" (its sentences, one pronoun edited): a
short instruction, then filler sentences repeated up to the target length, with ONE sentence
that states a random 5-digit pass key hidden at a chosen depth, and the question at the end:

    There is an important info hidden inside a lot of irrelevant text. ... there.
     The grass is green. The sky is blue. ... [the pass key is 48213 ...] ... There and back
    What is the pass key? The pass key is_

The prompt ends with a space ("_" above): SmolLM2's pre-tokenizer splits every digit off
before anything else, so in its training text a number after a space is always the token " "
followed by one token per digit. The prompt ends with that " " token and the answer is the
five digit tokens: no formatting token stands between the question and the key.

The prompt is assembled from token ids, not from text, so its length is exact in tokens:
instruction + filler + needle + question = `length`. The filler is the tokenised filler
passage repeated; the needle goes in at the sentence boundary of the filler nearest to
`depth` (0 = right after the instruction, 1 = right before the question).

Scoring: one forward pass over prompt + answer ("48213" minus its last digit) gives, at the
answer's positions, the model's next-token distribution with the true answer so far in
context (teacher forcing). Each answer token is then right when it is the argmax, and its
log-probability says how sure the model was. Greedy decoding would produce exactly the
answer if and only if every answer token is the argmax, so `exact` IS greedy retrieval,
without a decoding loop. Only the answer positions go through the output layer (a (T, V)
matrix of logits at T = 16,384 would take 3.2 GB).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from tfbook.config import is_int, is_number
from tfbook.tokenizers.base import Tokenizer

INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it "
               "and memorize it. I will quiz you about the important information there.")
FILLER = (" The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
          "back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\n\nWhat is the pass key? The pass key is "  # ends with the token " "
ANSWER = "{key}"  # one token per digit
KEY_DIGITS = 5  # the pass key of the paper: a random 5-digit number


def check_key(key: object) -> str:
    """Return `key` if it is a string of KEY_DIGITS decimal digits, or raise."""
    if not isinstance(key, str):
        raise TypeError(f"the pass key must be a string of {KEY_DIGITS} digits such as "
                        f"'48213', got {key!r} of type {type(key).__name__}")
    if len(key) != KEY_DIGITS or not all(c in "0123456789" for c in key):
        raise ValueError(f"the pass key must be {KEY_DIGITS} decimal digits 0-9, got {key!r}")
    return key


def random_passkey(rng: random.Random) -> str:
    """A random 5-digit pass key (no leading zero, as randint(10000, 99999) in the paper)."""
    if not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random (seeded), got {type(rng).__name__}")
    return str(rng.randint(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS - 1))


@dataclass(frozen=True)
class PasskeyPrompt:
    """A passkey prompt as token ids, with where its parts are."""

    ids: list[int]  # the prompt, exactly `length` tokens, ending with the question
    answer_ids: list[int]  # the answer "48213": one token per digit
    key: str  # the 5 digits
    depth: float  # the depth asked for, in [0, 1]
    needle_start: int  # index of the needle's first token in `ids`
    needle_end: int  # index after its last token
    filler_before: int  # filler tokens between the instruction and the needle
    filler_after: int  # filler tokens between the needle and the question

    @property
    def length(self) -> int:
        """Prompt tokens (the answer not included)."""
        return len(self.ids)

    @property
    def needle_depth(self) -> float:
        """The depth where the needle actually sits: filler before it / all filler."""
        filler = self.filler_before + self.filler_after
        return self.filler_before / filler if filler else 0.0


def _pieces(tokenizer: Tokenizer, key: str) -> tuple[list[int], list[int], list[int],
                                                     list[int], list[int]]:
    encode = tokenizer.encode_ordinary
    return (encode(INSTRUCTION), encode(FILLER), encode(NEEDLE.format(key=key)),
            encode(QUESTION), encode(ANSWER.format(key=key)))


def min_passkey_length(tokenizer: Tokenizer, key: str = "12345") -> int:
    """The shortest prompt: instruction + needle + question, no filler."""
    instruction, _, needle, question, _ = _pieces(tokenizer, check_key(key))
    return len(instruction) + len(needle) + len(question)


def passkey_prompt(tokenizer: Tokenizer, length: int, key: str, depth: float) -> PasskeyPrompt:
    """The passkey prompt of exactly `length` tokens with `key` hidden at `depth` (0..1).

    The filler passage, tokenised once, repeats as often as needed and is cut to the number
    of filler tokens left; the needle goes in at the sentence boundary (after a filler
    token ".") nearest to depth * filler tokens, or at either end of the filler.
    """
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a tfbook Tokenizer (e.g. load_smollm2_tokenizer()),"
                        f" got {type(tokenizer).__name__}")
    check_key(key)
    if not is_int(length):
        raise TypeError(f"length must be an int (tokens), got {length!r} of type "
                        f"{type(length).__name__}")
    if not is_number(depth) or not math.isfinite(depth):
        raise TypeError(f"depth must be a number in [0, 1], got {depth!r}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth is the fraction of the filler before the needle: expected a "
                         f"number in [0, 1], got {depth}")
    instruction, filler, needle, question, answer = _pieces(tokenizer, key)
    fixed = len(instruction) + len(needle) + len(question)
    if length < fixed:
        raise ValueError(f"length {length} is too short for the passkey prompt: the "
                         f"instruction, the needle and the question alone take {fixed} tokens")
    digits = tokenizer.encode_ordinary(key)
    if len(digits) != KEY_DIGITS or answer != digits:
        raise ValueError(f"expected a tokenizer that gives each digit its own token (as "
                         f"SmolLM2's), got {len(digits)} token(s) for {key!r}")
    n_filler = length - fixed
    repeats = n_filler // len(filler) + 1
    stream = (filler * repeats)[:n_filler]
    period = tokenizer.encode_ordinary(".")
    boundaries = [0, n_filler] + [i + 1 for i, t in enumerate(stream[:-1]) if [t] == period]
    cut = min(boundaries, key=lambda b: (abs(b - depth * n_filler), b))
    ids = instruction + stream[:cut] + needle + stream[cut:] + question
    if len(ids) != length:  # cannot happen: the pieces add up by construction
        raise RuntimeError(f"built {len(ids)} tokens, expected {length}")
    start = len(instruction) + cut
    return PasskeyPrompt(ids=ids, answer_ids=answer, key=key, depth=float(depth),
                         needle_start=start, needle_end=start + len(needle),
                         filler_before=cut, filler_after=n_filler - cut)


@contextmanager
def last_positions_only(model: nn.Module, k: int) -> Iterator[None]:
    """Inside the block, the model's final norm (and so its output layer) sees only the last
    k positions: logits (B, k, V) instead of (B, T, V). Needs a `norm_f` module (GPT)."""
    norm = getattr(model, "norm_f", None)
    if not isinstance(norm, nn.Module):
        raise TypeError(f"expected a model with a final norm `norm_f` (a tfbook GPT), got "
                        f"{type(model).__name__}")
    handle = norm.register_forward_pre_hook(lambda module, args: (args[0][:, -k:],))
    try:
        yield
    finally:
        handle.remove()


@dataclass(frozen=True)
class PasskeyScore:
    """How well one prompt's answer was retrieved (teacher forcing, one forward pass)."""

    predicted: str  # the argmax answer tokens, decoded (what greedy decoding would write
    #                 if every earlier token were right)
    token_correct: list[bool]  # per digit of the answer: argmax == truth
    token_logprob: list[float]  # per answer token: log p(true token | prompt, answer so far)

    @property
    def digit_accuracy(self) -> float:
        """Fraction of the digits that are the argmax."""
        return sum(self.token_correct) / len(self.token_correct)

    @property
    def exact(self) -> bool:
        """Greedy decoding writes the key (every digit is the argmax given the ones before)."""
        return all(self.token_correct)

    @property
    def logprob(self) -> float:
        """log p(answer | prompt): the sum over the answer tokens."""
        return sum(self.token_logprob)


@torch.inference_mode()
def score_passkey(model: nn.Module, prompt: PasskeyPrompt,
                  tokenizer: Tokenizer | None = None) -> PasskeyScore:
    """Score `prompt` with ONE forward pass over prompt + answer[:-1] (teacher forcing).

    The logits at the last len(answer) positions predict the answer tokens; only those
    positions go through the output layer. `tokenizer` decodes the prediction (else the ids).
    """
    if not isinstance(prompt, PasskeyPrompt):
        raise TypeError(f"prompt must be a PasskeyPrompt (passkey_prompt(...)), got "
                        f"{type(prompt).__name__}")
    answer = prompt.answer_ids
    k = len(answer)
    device = next(model.parameters()).device
    idx = torch.tensor([prompt.ids + answer[:-1]], device=device)  # (1, T + k - 1)
    with last_positions_only(model, k):
        logits = model(idx).logits[0].float()  # (k, V): the predictions of the answer tokens
    if logits.shape[0] != k:
        raise RuntimeError(f"expected logits at {k} positions, got {tuple(logits.shape)}")
    logprobs = logits.log_softmax(-1)  # (k, V)
    truth = torch.tensor(answer, device=device)  # (k,)
    best = logits.argmax(-1)  # (k,)
    predicted = (tokenizer.decode(best.tolist()) if tokenizer is not None
                 else " ".join(map(str, best.tolist())))
    return PasskeyScore(
        predicted=predicted, token_correct=(best == truth).tolist(),
        token_logprob=logprobs.gather(1, truth[:, None])[:, 0].tolist(),
    )
