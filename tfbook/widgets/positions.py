"""The sinusoidal positional-encoding explorer.

A heatmap of the table PE (positions x dimensions), a position slider, and the dot product
PE[p] . PE[j] against every position j: it peaks at j = p and falls off with distance,
which is how attention can read relative position out of absolute encodings.
"""

from __future__ import annotations

from collections.abc import Sequence

import traitlets

from tfbook.positional import sinusoidal_encoding
from tfbook.widgets.base import Widget, bundle, rounded


class PositionalEncodingExplorer(Widget):
    """Explore the sinusoidal table: heatmap, the vector at a position, dot product vs distance."""

    _esm = bundle("positions.js")

    table = traitlets.List().tag(sync=True)  # (T, C) values of the encoding
    labels = traitlets.List(traitlets.Unicode()).tag(sync=True)  # one label per position
    position = traitlets.Int(0).tag(sync=True)  # the selected position
    d_model = traitlets.Int(64).tag(sync=True)  # C, the width of the encoding
    base = traitlets.Float(10000.0).tag(sync=True)  # the base of the wavelengths

    def __init__(self, n_positions: int = 64, d_model: int = 64, base: float = 10000.0,
                 labels: Sequence[str] | None = None, position: int = 0) -> None:
        super().__init__()
        if labels is not None:
            labels = [str(label) for label in labels]
            n_positions = len(labels)
        self._labels = labels
        self.compute(n_positions=n_positions, d_model=d_model, base=base)
        self.position = min(max(position, 0), n_positions - 1)

    def compute(self, n_positions: int | None = None, d_model: int = 64,
                base: float = 10000.0) -> None:
        """Recompute the table for a new width C, base, or number of positions T."""
        if n_positions is None:
            n_positions = len(self.table)
        for name, value in (("n_positions", n_positions), ("d_model", d_model)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TypeError(f"{name} must be a positive int, got {value!r}")
        if d_model % 2 or d_model > 512:
            raise ValueError(f"d_model must be even and at most 512, got {d_model}")
        if not base > 1:
            raise ValueError(f"base must be greater than 1, got {base!r}")
        table = sinusoidal_encoding(n_positions, d_model, base=float(base))
        self.labels = self._labels if self._labels else [str(t) for t in range(n_positions)]
        self.d_model, self.base = d_model, float(base)
        self.table = rounded(table)
