"""The head explorer: every attention head of a model as one grid, coloured by a score.

    HeadExplorer(scores, examples, run=None, score=None, title="")
    HeadExplorer.from_model(model, tokenizer, texts, scores, page_model=False)

The grid has a cell per head, layers as rows and heads as columns (SmolLM2-135M: 30 x 9 =
270 cells), coloured by one of the caller's scores: {name: an (L, H) array}, in any range
(a menu picks the score, a legend gives its range; 0 is white). Pointing at a cell reads its
layer, head and score; clicking it (or moving to it with the arrow keys: the grid is one tab
stop) shows that head's attention pattern on a text: queries as rows, keys as columns,
causal, the tokens on both axes and the weight under the pointer.

The texts. A menu holds the texts whose patterns Python computed when the page was made,
stored as the attention-map widget stores its maps (tfbook/widgets/attention.py): one byte a
weight, round(255 w), every example's (L, H, T, T) bytes back to back, deflated and in base64
(`quantise_maps`, `pack_maps`); the page inflates them once, with the helpers the two
widgets share (static/maps.js, put together by `maps_module`). A text box runs the reader's
own text: in Jupyter Python runs the model (`compute`, through the request/done messages of
tfbook/widgets/base.py); in the static page a small GPT carried by the page
(`page_model=True`: tfbook/widgets/page_model.py, static/gpt.js) runs it in the browser; a
model too big for the page (SmolLM2's 135 M parameters against a budget of 3 MB) needs a
kernel, and the box says so while the menu's texts still work.

A text keeps its last `max_tokens` tokens (at most the model's context; 64 by default, so
that 270 heads of one text stay about 1 MB of bytes before deflate), and the page says when
it was cut. Text from data (tokens, names, notes, the title) reaches the saved page through
`page_text` and is drawn with textContent: a token such as "</script>" stays text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import traitlets

from tfbook.models.gpt import GPT
from tfbook.tokenizers.base import Tokenizer
from tfbook.widgets.attention import (
    AttentionExample,
    check_decoder,
    check_max_tokens,
    gpt_attention_example,
    maps_module,
    pack_examples,
    quantise_maps,
)
from tfbook.widgets.base import Widget, _text_to_page, check_typed, page_text
from tfbook.widgets.page_model import check_dtype, page_payload, payload_json, quantised_reference

MAX_TEXT_CHARS = 2000  # what the text box takes
MAX_TOKENS = 64  # the tokens a text keeps by default (its last ones)
# the packed maps of every text (base64 characters): SmolLM2's 270 heads at 64 tokens are
# about 1.1 MB of bytes a text before deflate
MAX_DATA_CHARS = 4_000_000
TYPED_NAME = "your text"  # the example of the reader's text (static/maps.js's name)
EMPTY_TEXT = "the text box is empty: type a sentence to see its attention"  # maps.js's too


def check_text(text: object) -> str:
    """The reader's text: a str with something besides spaces, at most MAX_TEXT_CHARS."""
    return check_typed(text, "text", MAX_TEXT_CHARS, EMPTY_TEXT, "the head explorer")


def head_example(model: GPT, tokenizer: Tokenizer, text: str, name: str | None = None,
                 max_tokens: int = MAX_TOKENS) -> AttentionExample:
    """The attention weights (L, H, T, T) of every head of `model` on the last
    min(max_tokens, context) tokens of `text` (gpt_attention_example), named after the text
    (its first 59 characters and "…" when longer than 60)."""
    check_text(text)
    if name is None:
        name = text if len(text) <= 60 else text[:59] + "…"
    return gpt_attention_example(model, tokenizer, text, name, max_tokens)


def check_scores(scores: object) -> dict[str, np.ndarray]:
    """The caller's scores: {name: an (L, H) array of finite numbers}, all of one shape."""
    if not isinstance(scores, Mapping):
        raise TypeError(f"scores must be a dict {{name: (L, H) array}}, got "
                        f"{type(scores).__name__}")
    if not scores:
        raise ValueError("scores is empty: give at least one {name: (L, H) array} to colour "
                         "the heads by")
    checked: dict[str, np.ndarray] = {}
    for name, values in scores.items():
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"a score's name must be a non-empty str, got {name!r:.40}")
        try:
            array = torch.as_tensor(values).detach().cpu().double().numpy()
        except (TypeError, ValueError, RuntimeError) as error:  # ragged lists, strings, ...
            raise ValueError(f"score {name!r:.40} must be an (L, H) array of numbers: "
                             f"{error}") from None
        if array.ndim != 2 or 0 in array.shape:
            raise ValueError(f"score {name!r:.40} must be an (L, H) array (a row per layer, "
                             f"a column per head), got shape {tuple(array.shape)}")
        if not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0]
            raise ValueError(f"score {name!r:.40} must be finite, got {array[tuple(bad)]} at "
                             f"layer {bad[0]}, head {bad[1]}")
        checked[name] = array
    shapes = {name: a.shape for name, a in checked.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"every score must have the same (L, H) shape, got {shapes}")
    return checked


def _score_value(x: float) -> float:
    """A score for the page: 6 significant digits (the page shows 4)."""
    return float(f"{x:.6g}")


def _strings_to_page(strings: Any, _widget: Any) -> Any:
    return [page_text(s) for s in strings]


def _examples_to_page(examples: Any, _widget: Any) -> Any:
    return [{**e, "name": page_text(e["name"]), "note": page_text(e["note"]),
             "tokens": [page_text(t) for t in e["tokens"]]} for e in examples]


class HeadExplorer(Widget):
    """All heads of a model as a grid coloured by a score; click one to see its pattern."""

    _esm = maps_module("heads.js", helpers=["tokenspans.js"])

    title = traitlets.Unicode("").tag(sync=True, to_json=_text_to_page)  # above the grid
    score_names = traitlets.List(traitlets.Unicode()).tag(sync=True, to_json=_strings_to_page)
    scores = traitlets.List().tag(sync=True)  # per score its (L, H) values, nested lists
    score = traitlets.Int(0).tag(sync=True)  # the score that colours the grid (an index)
    heads = traitlets.List(traitlets.Int()).tag(sync=True)  # [L, H]
    examples = traitlets.List().tag(sync=True, to_json=_examples_to_page)  # {name, tokens, note, T}
    data = traitlets.Unicode("").tag(sync=True)  # every example's (L, H, T, T) bytes, pack_maps
    offsets = traitlets.List(traitlets.Int()).tag(sync=True)  # byte offset of each example
    example = traitlets.Int(0).tag(sync=True)  # the text shown
    layer = traitlets.Int(0).tag(sync=True)  # the selected head: its layer
    head = traitlets.Int(0).tag(sync=True)  # and its index in the layer
    can_run = traitlets.Bool(False).tag(sync=True)  # Python can run the reader's text
    page_model = traitlets.Unicode("").tag(sync=True)  # payload_json of a small GPT, or ""
    max_tokens = traitlets.Int(MAX_TOKENS).tag(sync=True)  # a text keeps its last max_tokens
    context = traitlets.Int(0).tag(sync=True)  # the model's context (for the page's cut note)

    def __init__(self, scores: Mapping[str, Any], examples: Sequence[AttentionExample],
                 run: Callable[[str], AttentionExample] | None = None, score: str | None = None,
                 title: str = "", *, layer: int | None = None, head: int | None = None,
                 max_tokens: int = MAX_TOKENS, context: int | None = None) -> None:
        super().__init__()
        checked = check_scores(scores)
        names = list(checked)
        if score is None:
            score = names[0]
        if score not in checked:
            raise ValueError(f"score must be one of the scores' names {names}, got {score!r:.60}")
        if not isinstance(title, str):
            raise TypeError(f"title must be a str, got {type(title).__name__}")
        if run is not None and not callable(run):
            raise TypeError(f"run must be a function text -> AttentionExample, got "
                            f"{type(run).__name__}")
        if isinstance(examples, AttentionExample):
            examples = [examples]
        if (isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence)
                or not examples or not all(isinstance(e, AttentionExample) for e in examples)):
            raise TypeError(f"examples must be a list of one or more AttentionExample, got "
                            f"{examples!r:.120}")
        L, H = next(iter(checked.values())).shape
        values = checked[score]
        if layer is None and head is None:  # the strongest head of the first score shown
            layer, head = (int(i) for i in np.unravel_index(np.argmax(values), values.shape))
        for what, value, n in (("layer", layer, L), ("head", head, H)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise ValueError(f"{what} must be an int in [0, {n}), got {value!r:.40}")
        self._shape = (L, H)
        self._run = run
        self._fixed = len(examples)  # the texts given; a reader's text comes after them
        limit = check_max_tokens(max_tokens)
        with self.hold_sync():
            self.title = title
            self.score_names = names
            self.scores = [[[_score_value(x) for x in row] for row in a.tolist()]
                           for a in checked.values()]
            self.score = names.index(score)
            self.heads = [int(L), int(H)]
            self.layer, self.head = layer, head
            self.can_run = run is not None
            self.max_tokens = limit
            self.context = limit if context is None else int(context)
            self._set_examples(list(examples))

    @classmethod
    def from_model(cls, model: GPT, tokenizer: Tokenizer, texts: str | Sequence[str],
                   scores: Mapping[str, Any], *, page_model: bool = False,
                   dtype: str = "float16", score: str | None = None, title: str = "",
                   max_tokens: int = MAX_TOKENS, layer: int | None = None,
                   head: int | None = None) -> HeadExplorer:
        """The patterns of `model` (any tfbook decoder) on `texts`, computed now; in Jupyter
        Python runs the reader's text. page_model=True also puts a small GPT in the page
        (export_page_model, at most 3 MB), so the static page runs the reader's text; the
        patterns are then those of the page's weights (quantised_reference)."""
        check_decoder(model, tokenizer)
        if isinstance(texts, str):
            texts = [texts]
        if (not isinstance(texts, Sequence) or not texts
                or not all(isinstance(t, str) for t in texts)):
            raise TypeError(f"texts must be a str or a list of str, got {texts!r:.80}")
        if not isinstance(page_model, bool):
            raise TypeError(f"page_model must be True or False, got {page_model!r:.40}")
        payload = None
        if page_model:
            check_dtype(dtype)
            try:
                payload = page_payload(model, tokenizer, dtype)
            except (TypeError, ValueError) as error:
                raise type(error)(f"page_model=True puts the model in the page, which runs "
                                  f"small GPTs only ({error}); with page_model=False the "
                                  f"reader's text needs a kernel") from None
            model = quantised_reference(model, dtype)  # the weights the page computes with
        limit = min(check_max_tokens(max_tokens), model.config.max_len)
        examples = [head_example(model, tokenizer, t, max_tokens=limit) for t in texts]
        widget = cls(scores, examples,
                     run=lambda text: head_example(model, tokenizer, text, TYPED_NAME, limit),
                     score=score, title=title, layer=layer, head=head, max_tokens=limit,
                     context=model.config.max_len)
        if payload is not None:
            widget._esm = maps_module("heads.js", page_model=True, helpers=["tokenspans.js"])
            widget.page_model = payload_json(payload)
        return widget

    def _set_examples(self, examples: list[AttentionExample]) -> None:
        def describe(e: AttentionExample, w: torch.Tensor) -> dict:
            if e.source_tokens is not None:
                raise ValueError(f"example {e.name!r:.40}: the head explorer shows "
                                 f"self-attention, got cross-attention (source_tokens)")
            if tuple(w.shape[:2]) != self._shape:
                raise ValueError(f"example {e.name!r:.40} has (L, H) = {tuple(w.shape[:2])} "
                                 f"heads, the scores have {self._shape}")
            return {"name": str(e.name), "tokens": [str(t) for t in e.tokens], "note": e.note,
                    "T": int(w.shape[-1])}

        meta, offsets, data = pack_examples(examples, describe)
        if len(data) > MAX_DATA_CHARS:
            raise ValueError(f"the maps of {len(examples)} texts take {len(data):,} characters "
                             f"in the page, more than {MAX_DATA_CHARS:,}: give fewer or shorter "
                             f"texts (max_tokens)")
        self._examples = examples
        with self.hold_sync():  # one message: the page never sees new names with old maps
            self.examples, self.offsets, self.data = meta, offsets, data
            self.example = min(self.example, len(meta) - 1)

    def compute(self, text: str = "") -> None:
        """Run the attached model on the reader's text and show it as the last example."""
        if self._run is None:
            raise TypeError("this head explorer has no model attached (pass run=..., or make "
                            "it with HeadExplorer.from_model)")
        new = self._run(check_text(text))
        if not isinstance(new, AttentionExample):
            raise TypeError(f"run must return an AttentionExample, got {type(new).__name__}")
        self._set_examples(self._examples[:self._fixed] + [new])
        self.example = len(self.examples) - 1

    def pattern(self, example: int, layer: int, head: int) -> np.ndarray:
        """The (T, T) bytes the page draws for one head of one example (round(255 w))."""
        L, H = self._shape
        for what, value, n in (("example", example, len(self._examples)), ("layer", layer, L),
                               ("head", head, H)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise ValueError(f"{what} must be an int in [0, {n}), got {value!r:.40}")
        w = self._examples[example].as_4d()[layer, head]
        return quantise_maps(w)


__all__ = ["HeadExplorer", "check_scores", "head_example"]
