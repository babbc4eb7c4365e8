"""The attention-map widget: every head of every layer, and what each token attends to.

A grid of small maps (layers x heads) and a large view of one head; hovering over the large
map or clicking a token shows, as a heat strip over the key tokens, where that query token
puts its attention. It works for self-attention (keys = the same tokens) and cross-attention
(keys = the source sentence).

What the page holds. Each probability is one byte, round(255 w), so the colour scale (white
at 0, dark blue at 1) loses nothing it could show. The maps of all the examples, back to back
in (L, H, T, S) order, are compressed with deflate (zlib's run-length strategy: most weights of
a long sentence round to 0, and runs of zeros cost almost nothing) and written in base64;
the page inflates them once with the browser's DecompressionStream. All 72 heads of MiniLM
(6 layers x 12) at 512 tokens are 18.9 million bytes, about 3.3 MB in the page (25 MB as a
plain base64 of the bytes). A row sums to 1, so at most about 255 of its bytes are non-zero:
even maps of random scores stay near 5 MB.

The page draws what changed only: each small map once (a pixel holds the largest weight of
the cells it covers, so a thin diagonal survives the shrinking), the large map once per head,
the selected query as a rectangle on a canvas laid over it.

A model in the page. `AttentionMap.from_page_model(gpt, tokenizer, texts)` also stores a
small tfbook GPT and its tokenizer (tfbook.widgets.page_model, at most 3 MB): then, without
a kernel, the text box runs the model in the reader's browser (static/gpt.js) and draws its
heads. A text longer than the context keeps its last tokens, and the page says so. In
Jupyter, Python computes the same maps (`gpt_attention_example`) on the model the page holds
(`quantised_reference`), so both show the same numbers.

The head explorer (tfbook/widgets/heads.py) shows maps stored the same way: what the two
pages share (unpacking, painting, the note on a cut text, the page model's run) is
static/maps.js, and `maps_module` puts a widget's script together.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import traitlets

from tfbook.models.gpt import GPT
from tfbook.tokenizers.base import Tokenizer
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.widgets.base import STATIC, Widget, bundle
from tfbook.widgets.explorer import _check_decoder
from tfbook.widgets.page_model import (
    check_dtype,
    gpt_js_script_safe,
    page_payload,
    payload_json,
    quantised_reference,
    token_label,
)


def maps_module(script: str, *, page_model: bool = False, helpers: Sequence[str] = ()) -> str:
    """The ES module of a widget that draws attention maps: common.js, the `helpers` (other
    files of static/), maps.js, gpt.js (the forward pass) when the page carries a model, then
    static/<script>. A widget without a model does without gpt.js's 25 kB."""
    first, *rest = (*helpers, "maps.js")
    parts = [bundle(first)] + [(STATIC / name).read_text(encoding="utf-8") for name in rest]
    if page_model:
        parts.append(gpt_js_script_safe())
    parts.append((STATIC / script).read_text(encoding="utf-8"))
    return "\n".join(parts)


# The script of an attention map that carries a model.
PAGE_MODEL_ESM = maps_module("attention.js", page_model=True)


@dataclass(frozen=True)
class AttentionExample:
    """One input and its attention probabilities."""

    name: str  # shown in the example picker
    tokens: list[str]  # the T query tokens
    weights: torch.Tensor  # (L, H, T, S) probabilities; also accepts (H, T, S) or (T, S)
    source_tokens: list[str] | None = None  # the S key tokens; None for self-attention
    note: str = ""  # shown under the large map (e.g. that a long text was cut)

    def as_4d(self) -> torch.Tensor:
        """The weights as (L, H, T, S), checked against the tokens."""
        for what, tokens in (("tokens", self.tokens), ("source_tokens", self.source_tokens)):
            if tokens is not None and (isinstance(tokens, str) or not all(
                    isinstance(t, str) for t in tokens)):
                raise TypeError(f"{what} must be a list of strings, got {tokens!r:.80}")
        if not isinstance(self.note, str):
            raise TypeError(f"note must be a str, got {type(self.note).__name__}")
        for what, tokens in (("tokens", self.tokens), ("source tokens", self.source_tokens)):
            if tokens is not None and len(tokens) == 0:
                raise ValueError(f"example {self.name!r:.40} has no {what}: a map needs at "
                                 f"least one query and one key")
        try:
            w = torch.as_tensor(self.weights).detach().float().cpu()
        except (TypeError, ValueError, RuntimeError) as error:  # ragged lists, strings, ...
            raise ValueError(f"weights must be a rectangular array of numbers: {error}") from None
        while w.dim() < 4:
            w = w.unsqueeze(0)  # (T, S) -> (1, T, S) -> (1, 1, T, S)
        if w.dim() != 4:
            raise ValueError(f"weights must be (L, H, T, S), (H, T, S) or (T, S), "
                             f"got shape {tuple(self.weights.shape)}")
        keys = self.tokens if self.source_tokens is None else self.source_tokens
        if w.shape[-2:] != (len(self.tokens), len(keys)):
            raise ValueError(f"weights end in (T, S) = {tuple(w.shape[-2:])}, but there are "
                             f"{len(self.tokens)} query tokens and {len(keys)} key tokens")
        if w.numel() == 0:
            raise ValueError(f"weights must have at least one layer and one head, got shape "
                             f"{tuple(w.shape)}")
        if not torch.isfinite(w).all():
            raise ValueError("weights must be finite probabilities, got NaN or infinite values")
        if w.min() < 0 or w.max() > 1 + 1e-4:
            raise ValueError("weights must be probabilities in [0, 1] (apply the softmax first)")
        return w


def check_decoder(model: object, tokenizer: object) -> None:
    """A tfbook decoder (any GPTConfig: the small GPT, SmolLM2, ...) and a tfbook tokenizer."""
    _check_decoder(model)  # the model explorer's check
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a tfbook tokenizer (tfbook.tokenizers), got "
                        f"{type(tokenizer).__name__}")


def check_max_tokens(max_tokens: object) -> int:
    """How many tokens a text keeps (its last ones): a positive int."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r:.40}")
    return max_tokens


def quantise_maps(w: torch.Tensor) -> np.ndarray:
    """Probabilities (L, H, T, S) -> bytes round(255 w), as the page draws them."""
    return np.round(w.numpy() * 255).clip(0, 255).astype(np.uint8)


def pack_maps(chunks: Sequence[bytes]) -> str:
    """The page's `data`: base64 of the deflate stream (zlib format, run-length strategy) of
    the chunks back to back; the page inflates it with DecompressionStream("deflate")."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    packed = b"".join(packer.compress(chunk) for chunk in chunks) + packer.flush()
    return base64.b64encode(packed).decode("ascii")


def pack_examples(examples: Sequence[AttentionExample],
                  describe: Callable[[AttentionExample, torch.Tensor], dict]
                  ) -> tuple[list[dict], list[int], str]:
    """A widget's examples for the page: per example `describe(example, its weights (L, H, T,
    S))` (what the page needs to know of it) and the byte offset of its maps, then every
    example's bytes (quantise_maps, row-major (L, H, T, S)) back to back, packed (pack_maps)."""
    chunks, metas, offsets, offset = [], [], [], 0
    for e in examples:
        w = e.as_4d()
        metas.append(describe(e, w))
        quantised = quantise_maps(w)
        chunks.append(quantised.tobytes())
        offsets.append(offset)
        offset += quantised.size
    return metas, offsets, pack_maps(chunks)


def truncation_note(n_tokens: int, limit: int, context: int | None = None) -> str:
    """What the page says when a text has more than `limit` tokens and keeps its last ones
    (static/maps.js writes the same words); `context`, the model's, when it is larger than
    the limit (the head explorer keeps fewer tokens than its model reads)."""
    if context is None or context == limit:
        return (f"the text is {n_tokens} tokens long and the model reads at most {limit}: "
                f"its first {n_tokens - limit} tokens were cut, the maps show the last {limit}")
    return (f"the text is {n_tokens} tokens long and this explorer shows at most {limit} "
            f"(the model reads up to {context}): its first {n_tokens - limit} tokens were cut, "
            f"the maps show the last {limit}")


@torch.no_grad()
def gpt_attention_example(model: GPT, tokenizer: Tokenizer, text: str, name: str | None = None,
                          max_tokens: int | None = None) -> AttentionExample:
    """A GPT's attention weights (L, H, T, T) on `text`, as the page computes them: the ids
    of encode_ordinary (special-token strings are plain text), the last min(max_tokens,
    context) of them (max_tokens=None: the model's context, max_len)."""
    check_decoder(model, tokenizer)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected some text to run the model on, got {text!r:.80}")
    context = model.config.max_len
    limit = context if max_tokens is None else min(check_max_tokens(max_tokens), context)
    ids = tokenizer.encode_ordinary(text)
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r:.60}")
    note = truncation_note(len(ids), limit, context) if len(ids) > limit else ""
    ids = ids[-limit:]
    was_training = model.training
    model.eval()
    try:
        attentions = model(torch.tensor([ids]), need_weights=True).attentions
    finally:
        model.train(was_training)
    if not attentions:
        raise ValueError(f"{type(model).__name__} returned no attention weights "
                         f"(need_weights=True gave an empty list)")
    weights = torch.stack(attentions)[:, 0].float()  # L x (1, H, T, T) -> (L, H, T, T)
    tokens = [token_label(tokenizer, i) for i in ids]  # pieces of a character in hex
    return AttentionExample(text if name is None else name, tokens, weights, note=note)


class AttentionMap(Widget):
    """Explore attention maps: layers x heads grid, one head in large, hover a token."""

    _esm = maps_module("attention.js")

    examples = traitlets.List().tag(sync=True)  # [{name, tokens, keys, cross, shape, note}]
    data = traitlets.Unicode("").tag(sync=True)  # base64 of deflated uint8 maps (pack_maps)
    offsets = traitlets.List(traitlets.Int()).tag(sync=True)  # byte offset of each example
    example = traitlets.Int(0).tag(sync=True)  # selected example
    layer = traitlets.Int(0).tag(sync=True)  # selected layer
    head = traitlets.Int(0).tag(sync=True)  # selected head
    query = traitlets.Int(0).tag(sync=True)  # selected query token
    can_run = traitlets.Bool(False).tag(sync=True)  # a model is attached for your own text
    placeholder = traitlets.Unicode("type a sentence").tag(sync=True)  # hint in the text box
    page_model = traitlets.Unicode("").tag(sync=True)  # payload_json of a GPT, or "" (none)

    def __init__(self, examples: AttentionExample | Sequence[AttentionExample],
                 run: Callable[[str], AttentionExample] | None = None, layer: int = 0,
                 head: int = 0, placeholder: str = "type a sentence") -> None:
        super().__init__()
        self.placeholder = placeholder
        if isinstance(examples, AttentionExample):
            examples = [examples]
        if not examples or not all(isinstance(e, AttentionExample) for e in examples):
            raise TypeError(f"expected one or more AttentionExample, got {examples!r:.200}")
        self._run = run
        self.can_run = run is not None
        self._set_examples(list(examples))
        L, H = self.examples[0]["shape"][:2]
        self.layer, self.head = min(layer, L - 1), min(head, H - 1)

    @classmethod
    def from_page_model(cls, model: GPT, tokenizer: BPETokenizer, texts: str | Sequence[str],
                        *, dtype: str = "float16", layer: int = 0, head: int = 0,
                        placeholder: str = "type a sentence") -> AttentionMap:
        """The maps of a small GPT on `texts`, with the model in the page (export_page_model,
        at most 3 MB) so that the static page draws the reader's own text; Python computes
        these maps now, and the live ones in Jupyter, on the page's weights."""
        check_dtype(dtype)
        if isinstance(texts, str):
            texts = [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"texts must be a str or a list of str, got {texts!r:.80}")
        payload = page_payload(model, tokenizer, dtype)
        reference = quantised_reference(model, dtype)
        examples = [gpt_attention_example(reference, tokenizer, t) for t in texts]
        widget = cls(examples, run=lambda text: gpt_attention_example(
            reference, tokenizer, text, "your text"), layer=layer, head=head,
            placeholder=placeholder)
        widget._esm = PAGE_MODEL_ESM  # this widget's page also needs gpt.js
        widget.page_model = payload_json(payload)
        return widget

    def _set_examples(self, examples: list[AttentionExample]) -> None:
        def describe(e: AttentionExample, w: torch.Tensor) -> dict:
            keys = e.tokens if e.source_tokens is None else e.source_tokens
            return {"name": e.name, "tokens": [str(t) for t in e.tokens],
                    "keys": [str(t) for t in keys], "cross": e.source_tokens is not None,
                    "shape": list(w.shape), "note": e.note}

        meta, offsets, data = pack_examples(examples, describe)
        self._examples = examples
        with self.hold_sync():  # one message: the page never sees new names with old maps
            self.examples, self.offsets, self.data = meta, offsets, data

    def compute(self, text: str = "") -> None:
        """Run the attached model on new text and show its attention as a new example."""
        if self._run is None:
            raise TypeError("this attention map has no model attached (pass run=...)")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"expected some text to run the model on, got {text!r}")
        new = self._run(text)
        kept = [e for e in self._examples if e.name != new.name]
        self._set_examples(kept + [new])
        self.example, self.query = len(self.examples) - 1, 0
