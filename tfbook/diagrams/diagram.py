"""`Diagram`: a finished drawing that shows itself in Jupyter and in the static book."""

from __future__ import annotations

from tfbook.diagrams.svg import Canvas, Label


class Diagram:
    """An SVG drawing with the list of its labels.

    `.svg` is the SVG string; `.labels` every text on it (`Label(text, key, shape)`, where
    `key` names the traced tensor a shape label shows); `.shape_labels` maps those keys to
    their text. In a notebook it displays as inline SVG in HTML, so its text and lines take
    the page's colour (light or dark theme).
    """

    def __init__(self, canvas: Canvas) -> None:
        if not isinstance(canvas, Canvas):
            raise TypeError(f"Diagram needs a Canvas, got {type(canvas).__name__}")
        self.title = canvas.title
        self.labels: list[Label] = list(canvas.labels)
        self.svg: str = canvas.render()

    @property
    def shape_labels(self) -> dict[str, str]:
        """key -> text of every label that shows a traced shape."""
        return {lb.key: lb.text for lb in self.labels if lb.key}

    def _repr_html_(self) -> str:
        # its own box scrolls if a phone is narrower than the diagram's smallest legible size
        return ('<div class="tfbook-diagram" style="overflow-x:auto;max-width:100%;'
                'margin:0.5em 0">' + self.svg + "</div>")

    def __repr__(self) -> str:
        return f"<Diagram {self.title!r}: {len(self.labels)} labels>"
