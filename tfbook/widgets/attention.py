"""The attention-map widget: every head of every layer, and what each token attends to.

A grid of small maps (layers x heads) and a large view of one head; hovering over the large
map or clicking a token shows, as a heat strip over the key tokens, where that query token
puts its attention. It works for self-attention (keys = the same tokens) and cross-attention
(keys = the source sentence). The maps are stored as bytes (probabilities quantised to
1/255), so 6 layers x 12 heads x 128 x 128 tokens still make a page of about 1.5 MB.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import traitlets

from tfbook.widgets.base import Widget, bundle


@dataclass(frozen=True)
class AttentionExample:
    """One input and its attention probabilities."""

    name: str  # shown in the example picker
    tokens: list[str]  # the T query tokens
    weights: torch.Tensor  # (L, H, T, S) probabilities; also accepts (H, T, S) or (T, S)
    source_tokens: list[str] | None = None  # the S key tokens; None for self-attention

    def as_4d(self) -> torch.Tensor:
        """The weights as (L, H, T, S), checked against the tokens."""
        for what, tokens in (("tokens", self.tokens), ("source_tokens", self.source_tokens)):
            if tokens is not None and (isinstance(tokens, str) or not all(
                    isinstance(t, str) for t in tokens)):
                raise TypeError(f"{what} must be a list of strings, got {tokens!r:.80}")
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
        if not torch.isfinite(w).all():
            raise ValueError("weights must be finite probabilities, got NaN or infinite values")
        if w.min() < 0 or w.max() > 1 + 1e-4:
            raise ValueError("weights must be probabilities in [0, 1] (apply the softmax first)")
        return w


class AttentionMap(Widget):
    """Explore attention maps: layers x heads grid, one head in large, hover a token."""

    _esm = bundle("attention.js")

    examples = traitlets.List().tag(sync=True)  # [{name, tokens, keys, shape: [L, H, T, S]}]
    data = traitlets.Unicode("").tag(sync=True)  # base64 of uint8 maps, examples back to back
    offsets = traitlets.List(traitlets.Int()).tag(sync=True)  # byte offset of each example
    example = traitlets.Int(0).tag(sync=True)  # selected example
    layer = traitlets.Int(0).tag(sync=True)  # selected layer
    head = traitlets.Int(0).tag(sync=True)  # selected head
    query = traitlets.Int(0).tag(sync=True)  # selected query token
    can_run = traitlets.Bool(False).tag(sync=True)  # a model is attached for your own text
    placeholder = traitlets.Unicode("type a sentence").tag(sync=True)  # hint in the text box

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

    def _set_examples(self, examples: list[AttentionExample]) -> None:
        chunks, meta, offsets, offset = [], [], [], 0
        for e in examples:
            w = e.as_4d()
            quantised = np.round(w.numpy() * 255).clip(0, 255).astype(np.uint8)
            chunks.append(quantised.tobytes())  # row-major (L, H, T, S)
            keys = e.tokens if e.source_tokens is None else e.source_tokens
            meta.append({"name": e.name, "tokens": [str(t) for t in e.tokens],
                         "keys": [str(t) for t in keys], "cross": e.source_tokens is not None,
                         "shape": list(w.shape)})
            offsets.append(offset)
            offset += quantised.size
        self._examples = examples
        self.examples, self.offsets = meta, offsets
        self.data = base64.b64encode(b"".join(chunks)).decode("ascii")

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
