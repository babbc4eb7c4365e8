"""The next-token sampling widget: temperature, top-k and top-p on a stored generation.

At each step of a generation, a language model gives logits over the whole vocabulary (V);
sampling turns them into the distribution the next token is drawn from. The widget draws
that distribution as bars over the N most likely tokens (the candidates), and the reader
turns the knobs of the usual samplers (Holtzman et al. 2020 for top-p): the temperature
divides the logits (0 = greedy), top-k keeps the k largest (ties at the boundary too), top-p
keeps the smallest most-likely set whose probability passes p. The page recomputes the kept
set and the renormalised probabilities itself, in HF's order (temperature, top-k, top-p),
from the candidates' logits stored at build time, so the knobs work in the static book; the
Python reference of that arithmetic is `tfbook.generate.sampling.kept_distribution`.

A step slider (and prev/next buttons) walks through the generation: the text so far, the
token that was chosen, and the alternatives the sampler had. In Jupyter, a prompt box asks
Python for a new generation through a model-agnostic `generate_fn(prompt, max_new_tokens)`;
if it also takes any of the keywords `temperature`, `top_k`, `top_p` and `seed` (or
**settings), the widget passes its own knobs and seed box, so that what the reader set is
what generates (`sampler_settings` lists the ones it takes).

`SamplingWidget.from_page_model` also puts a small tfbook GPT in the page (static/gpt.js,
`tfbook.widgets.page_model`): then the prompt box works without a kernel. The page encodes
the reader's text, generates with the knobs' temperature, top-k and top-p and a seed
(mulberry32, so the same settings give the same text), and draws each step as above. In
Jupyter Python computes the same generation with the same sampler (`page_generation`,
`page_next_token`) on the model the page holds (`quantised_reference`), so both agree.
A prompt longer than the context keeps its last tokens, and the page says how many it
dropped (`fit_prompt`).

Token text is hostile data: the page sets it with textContent only, and "<" never reaches
the saved page raw (see `page_text`), so no token can end or open a script element there.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
import traitlets

from tfbook.generate.sampling import filter_logits
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.widgets.base import (
    STATIC,
    Widget,
    _text_to_page,
    bundle,
    check_typed,
    page_text,
    rounded,
)
from tfbook.widgets.page_model import (
    check_dtype,
    gpt_js_script_safe,
    page_payload,
    payload_json,
    quantised_reference,
    token_label,
)

MAX_TOP_N = 200  # candidates per step: the page draws one bar for each
MAX_STEPS = 256  # generated tokens stored in the page
MAX_PROMPT_TOKENS = 2048
MAX_TEMPERATURE = 2.0
MAX_NEW_TOKENS = 64  # per live request: generation stays a few seconds on a CPU
MAX_PROMPT_CHARS = 2000  # the live prompt box
MAX_SEED = 2**32 - 1  # mulberry32 keeps 32 bits of state

SETTINGS = ("temperature", "top_k", "top_p", "seed")  # the knobs a generate_fn may take
TokenText = Callable[[int], str] | Sequence[str]  # token id -> its text
# What a generate_fn returns: (prompt tokens, (steps, V) logits, chosen ids, token text).
Generation = tuple[Sequence[str], Any, Sequence[int], TokenText]


def _strings_to_page(values: list[str], _widget: Any) -> list[str]:
    return [page_text(v) for v in values]


def _steps_to_page(steps: list[dict[str, Any]], _widget: Any) -> list[dict[str, Any]]:
    return [{**step, "tokens": _strings_to_page(step["tokens"], _widget),
             "chosen_text": page_text(step["chosen_text"])} for step in steps]


def next_token_candidates(logits: torch.Tensor, top_n: int) -> tuple[list[int], list[float], float]:
    """The `top_n` most likely token ids of one step's (V,) logits, their logits, and the
    probability mass they hold at temperature 1 over the whole vocabulary.

    Tokens with logit -inf (masked, never sampled) are never candidates; ties are ordered
    by id, so the candidates do not depend on the sort's whims.

    >>> next_token_candidates(torch.tensor([0.0, 2.0, float("-inf"), 2.0]), 2)[:2]
    ([1, 3], [2.0, 2.0])
    """
    logits = logits.double()  # (V,)
    finite = int(torch.isfinite(logits).sum())
    order = torch.sort(logits, descending=True, stable=True).indices[:min(top_n, finite)]  # (N,)
    mass = torch.softmax(logits, dim=-1)[order].sum()  # softmax over all V, then the N
    return order.tolist(), logits[order].tolist(), float(mass)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r:.60}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return int(value)


def _check_number(name: str, value: object) -> float:
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r:.60}")
    return float(value)


def check_settings(temperature: float, top_k: int | None, top_p: float | None
                   ) -> tuple[float, int | None, float | None]:
    """The sampler's knobs, checked: temperature in [0, 2] (0 = greedy), top-k an int >= 1 or
    None (off), top-p in (0, 1] or None (off)."""
    temperature = _check_number("temperature", temperature)
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be between 0 (greedy) and {MAX_TEMPERATURE}, "
                         f"got {temperature}")
    if top_k is not None:
        top_k = _check_int("top_k", top_k, 1, MAX_TOP_N)
    if top_p is not None:
        top_p = _check_number("top_p", top_p)
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (or None for off), got {top_p}")
    return temperature, top_k, top_p


def _check_strings(name: str, values: object) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(values).__name__}: "
                        f"{values!r:.60}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}: "
                            f"{value!r:.60}")
    return list(values)


def as_step_logits(step_logits: object) -> torch.Tensor:
    """The (steps, V) logits as float64, checked: no NaN, no +inf, something finite per step.

    -inf is allowed: it is how a model bans a token (such tokens are never candidates).
    """
    if isinstance(step_logits, torch.Tensor):
        logits = step_logits.detach().cpu()
    elif isinstance(step_logits, np.ndarray):
        if step_logits.dtype.kind not in "iuf":
            raise TypeError(f"step_logits must hold real numbers, got dtype {step_logits.dtype}")
        logits = torch.from_numpy(step_logits.astype(np.float64))
    elif isinstance(step_logits, Sequence) and not isinstance(step_logits, str):
        rows = [_as_row(s, row) for s, row in enumerate(step_logits)]
        lengths = {len(row) for row in rows}
        if len(lengths) > 1:
            raise ValueError(f"step_logits is ragged: every step needs the same V logits, got "
                             f"lengths {[len(row) for row in rows][:20]}")
        logits = torch.tensor(rows, dtype=torch.float64) if rows else torch.zeros(0, 0)
    else:
        raise TypeError(f"step_logits must be a (steps, V) tensor or array, or a list of lists "
                        f"of numbers, got {type(step_logits).__name__}")
    if logits.dtype == torch.bool or logits.is_complex():
        raise TypeError(f"step_logits must hold real numbers, got dtype {logits.dtype}")
    if logits.dim() != 2 or 0 in logits.shape:
        raise ValueError(f"step_logits must be (steps, V) with at least one step and one "
                         f"token, got shape {tuple(logits.shape)}")
    if logits.shape[0] > MAX_STEPS:
        raise ValueError(f"the widget stores at most {MAX_STEPS} steps, got {logits.shape[0]}")
    logits = logits.double()  # (S, V)
    for bad, what in ((torch.isnan(logits), "NaN"), (logits == math.inf, "+inf")):
        if bad.any():
            step, token = bad.nonzero()[0].tolist()
            raise ValueError(f"step_logits must not contain {what}: step {step}, token "
                             f"{token} is {what}")
    dead = ~torch.isfinite(logits).any(dim=-1)  # (S,) rows that are all -inf
    if dead.any():
        raise ValueError(f"step {int(dead.nonzero()[0])} has every logit -inf: no token "
                         f"could be sampled there")
    return logits


def _as_row(step: int, row: object) -> list[float]:
    if isinstance(row, torch.Tensor):
        if row.dim() != 1:
            raise ValueError(f"step {step} of step_logits must be 1-D (V,), got shape "
                             f"{tuple(row.shape)}")
        return row.double().tolist()
    if isinstance(row, str) or not isinstance(row, Sequence):
        raise TypeError(f"step {step} of step_logits must be a list of numbers, got "
                        f"{type(row).__name__}")
    for value in row:
        if not isinstance(value, Real) or isinstance(value, bool):
            raise TypeError(f"step {step} of step_logits holds {value!r:.40} "
                            f"({type(value).__name__}); logits must be numbers")
    return [float(v) for v in row]


def _text_lookup(token_text: object, vocab_size: int) -> Callable[[int], str]:
    """token_text (a callable or a list of V strings) as a checked id -> str function."""
    if callable(token_text):
        def text(i: int) -> str:
            value = token_text(i)
            if not isinstance(value, str):
                raise TypeError(f"token_text({i}) must return a str, got "
                                f"{type(value).__name__}: {value!r:.60}")
            return value
        return text
    table = _check_strings("token_text", token_text)
    if len(table) != vocab_size:
        raise ValueError(f"token_text has {len(table)} strings but the logits cover "
                         f"V = {vocab_size} tokens")
    return table.__getitem__


def build_steps(step_logits: object, chosen: object, token_text: TokenText, top_n: int
                ) -> tuple[list[dict[str, Any]], int]:
    """Check a generation and cut each step to its candidates; returns the steps for the
    page and V. Each step: candidate ids, texts and logits (most likely first), the chosen
    id, its text and its rank in the vocabulary (0 = most likely), the candidates' mass."""
    _check_int("top_n", top_n, 1, MAX_TOP_N)
    logits = as_step_logits(step_logits)  # (S, V)
    S, V = logits.shape
    if isinstance(chosen, torch.Tensor | np.ndarray):
        chosen = chosen.tolist()
    if isinstance(chosen, str) or not isinstance(chosen, Sequence):
        raise TypeError(f"chosen must be a list of token ids, got {type(chosen).__name__}")
    if len(chosen) != S:
        raise ValueError(f"chosen has {len(chosen)} token ids but step_logits has {S} steps")
    chosen = [_check_int(f"chosen[{s}]", c, 0, V - 1) for s, c in enumerate(chosen)]
    for s, c in enumerate(chosen):
        if logits[s, c] == -math.inf:
            raise ValueError(f"chosen[{s}] = {c} has logit -inf at step {s}: it could not "
                             f"have been sampled")
    text = _text_lookup(token_text, V)
    steps = []
    for s, c in enumerate(chosen):
        ids, values, mass = next_token_candidates(logits[s], top_n)
        order = torch.sort(logits[s], descending=True, stable=True).indices  # (V,)
        steps.append({
            "ids": ids,
            "tokens": [text(i) for i in ids],
            "logits": rounded(values, 6),  # about float32's precision: no ties invented
            "chosen": c,
            "chosen_text": text(c),
            "chosen_rank": int((order == c).nonzero()[0]),
            "mass": round(mass, 6),
        })
    return steps, V


def mulberry32(seed: int) -> Callable[[], float]:
    """A seeded generator of numbers in [0, 1), bit for bit the page's (gpt.js `mulberry32`):
    32 bits of state advanced by a constant, then mixed by multiplications and xor-shifts
    (the tests draw from both and compare)."""
    seed = _check_int("seed", seed, 0, MAX_SEED)
    state = seed

    def imul(a: int, b: int) -> int:  # JavaScript's Math.imul: the low 32 bits of a * b
        return (a * b) & 0xFFFFFFFF

    def random() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & 0xFFFFFFFF
        z = state
        z = imul(z ^ (z >> 15), z | 1)
        z ^= (z + imul(z ^ (z >> 7), z | 61)) & 0xFFFFFFFF
        return ((z ^ (z >> 14)) & 0xFFFFFFFF) / 4294967296

    return random


def page_next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
                    top_p: float | None, random: Callable[[], float]) -> int:
    """The page's draw (gpt.js `nextToken`) from one step's (V,) logits: the argmax at
    temperature 0 (no number drawn), else filter_logits, the softmax in float64 and the first
    token whose running sum passes u = random() (inverse transform sampling)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1 or not (
            logits.is_floating_point()):
        got = (f"a {logits.dtype} tensor of shape {tuple(logits.shape)}"
               if isinstance(logits, torch.Tensor) else type(logits).__name__)
        raise TypeError(f"logits must be one step's floating tensor (V,), got {got}")
    temperature, top_k, top_p = check_settings(temperature, top_k, top_p)
    if not callable(random):
        raise TypeError(f"random must be a function () -> a number in [0, 1) (mulberry32), got "
                        f"{type(random).__name__}")
    if temperature == 0:
        return int(logits.argmax())  # the first of tied maxima, as the page's argmax
    scores = filter_logits(logits.float(), temperature, top_k, top_p).double().numpy()  # (V,)
    exps = np.exp(scores - scores.max())  # (V,); removed tokens (-inf) give 0
    probs = exps / np.cumsum(exps)[-1]  # summed left to right, as the page sums
    cumulative = np.cumsum(probs)  # (V,)
    u = random()
    token = int(np.searchsorted(cumulative, u, side="right"))  # first with u < cumulative
    return token if token < len(probs) else int(probs.argmax())  # u in the rounding gap


def fit_prompt(ids: Sequence[int], max_len: int, max_new_tokens: int) -> tuple[list[int], int]:
    """The prompt's last tokens that leave room for max_new_tokens in a context of max_len
    (at least one token), and how many were dropped from its start.

    >>> fit_prompt([1, 2, 3, 4, 5], max_len=6, max_new_tokens=3)
    ([3, 4, 5], 2)
    """
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a list of token ids, got {type(ids).__name__}")
    max_len = _check_int("max_len", max_len, 1, 2**31)
    max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 0, 2**31)
    room = max(1, max_len - max_new_tokens)
    dropped = max(0, len(ids) - room)
    return list(ids[dropped:]), dropped


def page_generation(model: GPT, tokenizer: BPETokenizer, prompt: str, max_new_tokens: int,
                    temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, seed: int = 0
                    ) -> tuple[Generation, int]:
    """What the page generates for `prompt` (static/sampling.js), computed in Python: the
    prompt's tokens cut to fit (`fit_prompt`), then `generate`'s cached loop with the page's
    sampler (`page_next_token` drawing from mulberry32(seed)), until max_new_tokens or the
    context is full. Returns the widget's generation (prompt tokens, (N, V) logits, chosen
    ids, token text) and the number of prompt tokens dropped."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tfbook GPT (tfbook.models.gpt.GPT), got "
                        f"{type(model).__name__}")
    if not isinstance(tokenizer, BPETokenizer):
        raise TypeError(f"tokenizer must be a tfbook BPETokenizer (the page's tokenizer; "
                        f"BPETokenizer({{}}) for plain bytes), got {type(tokenizer).__name__}")
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}: {prompt!r:.60}")
    max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 1, MAX_NEW_TOKENS)
    temperature, top_k, top_p = check_settings(temperature, top_k, top_p)
    random = mulberry32(seed)
    ids = tokenizer.encode_ordinary(prompt)
    if not ids:
        raise ValueError("the prompt is empty: type a few words to continue")
    max_len = model.config.max_len
    ids, dropped = fit_prompt(ids, max_len, max_new_tokens)
    n_new = min(max_new_tokens, max_len - len(ids))

    def page_sampler(logits: torch.Tensor) -> torch.Tensor:  # (1, V) -> (1,): one row
        return torch.tensor([page_next_token(logits[0], temperature, top_k, top_p, random)])

    was_training = model.training
    model.eval()
    try:
        run = generate(model, [ids], n_new, keep_logits=True, sampler=page_sampler)
    finally:
        model.train(was_training)
    step_logits, chosen = torch.cat(run.logits), run.new_tokens[0].tolist()  # (N, V), N ids

    def text(i: int) -> str:  # as the page shows a token: pieces of a character in hex
        return token_label(tokenizer, i)

    return ([text(i) for i in ids], step_logits, chosen, text), dropped


class SamplingWidget(Widget):
    """Bars of the next-token distribution under temperature, top-k and top-p, step by step.

    `prompt_tokens` is the prompt cut into token strings, `step_logits` the model's (S, V)
    logits before each of the S generated tokens, `chosen` the S ids it then picked, and
    `token_text` gives a token id's text (a function, or a list of V strings). The page keeps
    the `top_n` most likely tokens of each step. `generate_fn(prompt, max_new_tokens)`, if
    given, returns those four for a new prompt: the live prompt box calls it.
    """

    _esm = "\n".join([bundle("tokenspans.js"), gpt_js_script_safe(),
                      (STATIC / "sampling.js").read_text(encoding="utf-8")])

    # Strings go to the page through page_text (to_json): Python keeps the real text.
    prompt_tokens = traitlets.List(traitlets.Unicode()).tag(sync=True, to_json=_strings_to_page)
    steps = traitlets.List().tag(sync=True, to_json=_steps_to_page)  # see build_steps
    vocab_size = traitlets.Int(0).tag(sync=True)  # V of the model
    top_n = traitlets.Int(50).tag(sync=True)  # candidates asked for per step
    step = traitlets.Int(0).tag(sync=True)  # the step shown
    temperature = traitlets.Float(1.0).tag(sync=True)  # 0 = greedy
    top_k = traitlets.Int(None, allow_none=True).tag(sync=True)  # None = off
    top_p = traitlets.Float(None, allow_none=True).tag(sync=True)  # None = off
    can_run = traitlets.Bool(False).tag(sync=True)  # a generate_fn is attached
    # The knobs a live generation uses (those generate_fn takes; all of them with a page model)
    sampler_settings = traitlets.List(traitlets.Unicode()).tag(sync=True)
    prompt = traitlets.Unicode("").tag(sync=True, to_json=_text_to_page)  # the live prompt box
    max_new_tokens = traitlets.Int(10).tag(sync=True)  # prefills the live length box
    seed = traitlets.Int(0).tag(sync=True)  # of the page model's sampler (mulberry32)
    dropped = traitlets.Int(0).tag(sync=True)  # prompt tokens cut to fit the context
    page_model = traitlets.Unicode("").tag(sync=True)  # payload_json of a GPT, or "" (none)

    def __init__(self, prompt_tokens: Sequence[str], step_logits: torch.Tensor | Sequence,
                 chosen: Sequence[int], token_text: TokenText, top_n: int = 50, *,
                 generate_fn: Callable[[str, int], Generation] | None = None,
                 temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, step: int = 0, prompt: str | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        if generate_fn is not None and not callable(generate_fn):
            raise TypeError(f"generate_fn must be callable (prompt, max_new_tokens) -> "
                            f"generation, got {type(generate_fn).__name__}")
        settings = check_settings(temperature, top_k, top_p)
        seed = _check_int("seed", seed, 0, MAX_SEED)
        step = _check_int("step", step, -2**31, 2**31)  # then clamped to the steps there are
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
        self._generate_fn = generate_fn
        self._page: tuple[GPT, BPETokenizer] | None = None  # set by from_page_model
        self._set_generation(prompt_tokens, step_logits, chosen, token_text, top_n)
        with self.hold_sync():
            self.temperature, top_k, self.top_p = settings
            self.top_k = None if top_k is None else min(top_k, self.top_n)
            self.step = min(max(step, 0), len(self.steps) - 1)
            self.can_run = generate_fn is not None
            self.sampler_settings = [] if generate_fn is None else taken_settings(generate_fn)
            self.seed = seed
            self.prompt = "".join(self.prompt_tokens) if prompt is None else prompt
            self.max_new_tokens = min(len(self.steps), MAX_NEW_TOKENS)

    @classmethod
    def from_generate(cls, generate_fn: Callable[..., Generation], prompt: str,
                      max_new_tokens: int = 10, top_n: int = 50, *, temperature: float = 1.0,
                      top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                      **options: Any) -> SamplingWidget:
        """Run `generate_fn` on `prompt` now (build time), with the knobs it takes among
        temperature, top_k, top_p and seed, and keep it for live requests."""
        if not callable(generate_fn):
            raise TypeError(f"generate_fn must be callable (prompt, max_new_tokens) -> "
                            f"generation, got {type(generate_fn).__name__}")
        temperature, top_k, top_p = check_settings(temperature, top_k, top_p)
        _check_int("top_n", top_n, 1, MAX_TOP_N)
        top_k = None if top_k is None else min(top_k, top_n)  # as the widget clamps it
        seed = _check_int("seed", seed, 0, MAX_SEED)
        knobs = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        generation = _run(generate_fn, prompt, max_new_tokens, knobs)
        return cls(*generation, top_n=top_n, generate_fn=generate_fn, prompt=prompt,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, **options)

    @classmethod
    def from_page_model(cls, model: GPT, tokenizer: BPETokenizer, prompt: str,
                        max_new_tokens: int = 10, top_n: int = 50, *, dtype: str = "float16",
                        seed: int = 0, **settings: Any) -> SamplingWidget:
        """A widget that carries `model` and `tokenizer` in the page (export_page_model, at
        most 3 MB), so that the static page generates from the reader's prompt; Python
        computes the first generation now, and the live ones in Jupyter, on the page's
        weights (quantised_reference) with the page's sampler (page_generation)."""
        check_dtype(dtype)
        seed = _check_int("seed", seed, 0, MAX_SEED)
        payload = page_payload(model, tokenizer, dtype)
        reference = quantised_reference(model, dtype)
        temperature, top_k, top_p = check_settings(settings.pop("temperature", 1.0),
                                                   settings.pop("top_k", None),
                                                   settings.pop("top_p", None))
        _check_int("top_n", top_n, 1, MAX_TOP_N)
        top_k = None if top_k is None else min(top_k, top_n)  # as the widget clamps it
        _check_prompt(prompt)
        generation, dropped = page_generation(reference, tokenizer, prompt, max_new_tokens,
                                              temperature, top_k, top_p, seed)
        widget = cls(*generation, top_n=top_n, prompt=prompt, temperature=temperature,
                     top_k=top_k, top_p=top_p, **settings)
        widget._page = (reference, tokenizer)
        with widget.hold_sync():
            widget.sampler_settings = list(SETTINGS)
            widget.page_model = payload_json(payload)
            widget.seed, widget.dropped, widget.can_run = seed, dropped, True
            widget.max_new_tokens = max_new_tokens
        return widget

    def _set_generation(self, prompt_tokens: Sequence[str], step_logits: object,
                        chosen: object, token_text: TokenText, top_n: int) -> None:
        """Check everything first, then update the page in one message."""
        prompt_tokens = _check_strings("prompt_tokens", prompt_tokens)
        if len(prompt_tokens) > MAX_PROMPT_TOKENS:
            raise ValueError(f"the widget shows at most {MAX_PROMPT_TOKENS} prompt tokens, "
                             f"got {len(prompt_tokens)}")
        steps, vocab_size = build_steps(step_logits, chosen, token_text, top_n)
        with self.hold_sync():
            self.prompt_tokens, self.steps = prompt_tokens, steps
            self.vocab_size, self.top_n = vocab_size, top_n
            self.step = min(self.step, len(steps) - 1)
            if self.top_k is not None:
                self.top_k = min(self.top_k, top_n)

    def compute(self, prompt: str = "", max_new_tokens: int = 10, seed: int | None = None
                ) -> None:
        """Generate from a new prompt and show it from step 0: with the page's model and
        sampler (the knobs and `seed`, default the widget's) if it has one, else with the
        attached generate_fn, given the knobs and seed it takes."""
        if self._generate_fn is None and self._page is None:
            raise TypeError("this sampling widget has no model attached (pass generate_fn=...)")
        seed = self.seed if seed is None else _check_int("seed", seed, 0, MAX_SEED)
        if self._page is not None:
            _check_prompt(prompt)
            generation, dropped = page_generation(*self._page, prompt, max_new_tokens,
                                                  self.temperature, self.top_k, self.top_p, seed)
        else:
            knobs = {"temperature": self.temperature, "top_k": self.top_k,
                     "top_p": self.top_p, "seed": seed}
            generation, dropped = _run(self._generate_fn, prompt, max_new_tokens, knobs), 0
        self._set_generation(*generation, top_n=self.top_n)
        with self.hold_sync():
            self.prompt, self.max_new_tokens, self.step = prompt, max_new_tokens, 0
            self.seed, self.dropped = seed, dropped


def _check_prompt(prompt: object) -> str:
    """The typed prompt: a str with something besides spaces, at most MAX_PROMPT_CHARS."""
    return check_typed(prompt, "prompt", MAX_PROMPT_CHARS,
                       "the prompt is empty: type a few words to continue", "the widget")


def taken_settings(generate_fn: Callable[..., Generation]) -> list[str]:
    """The knobs among SETTINGS that generate_fn takes as keywords (all of them if it takes
    **settings; none if its signature cannot be read)."""
    try:
        parameters = inspect.signature(generate_fn).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return list(SETTINGS)
    names = {p.name for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return [name for name in SETTINGS if name in names]


def _run(generate_fn: Callable[..., Generation], prompt: object, max_new_tokens: object,
         knobs: dict[str, Any] | None = None) -> Generation:
    """Call generate_fn after checking its arguments, with the knobs it takes, and check the
    shape of its answer."""
    _check_prompt(prompt)
    _check_int("max_new_tokens", max_new_tokens, 1, MAX_NEW_TOKENS)
    taken = taken_settings(generate_fn)
    generation = generate_fn(prompt, max_new_tokens,
                             **{name: value for name, value in (knobs or {}).items()
                                if name in taken})
    if not isinstance(generation, tuple) or len(generation) != 4:
        raise TypeError("generate_fn must return (prompt_tokens, step_logits, chosen, "
                        f"token_text), got {type(generation).__name__}: {generation!r:.80}")
    return generation
