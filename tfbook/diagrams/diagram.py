"""`Diagram`: a finished drawing that shows itself in Jupyter and in the static book."""

from __future__ import annotations

from tfbook.diagrams.svg import Canvas, Label, escape


class Diagram:
    """An SVG drawing with the list of its labels.

    `.svg` is the SVG string; `.labels` every text on it (`Label(text, key, shape)`, where
    `key` names the traced tensor a shape label shows); `.shape_labels` maps those keys to
    their text. In a notebook it displays as inline SVG in HTML, so its text and lines take
    the page's colour (light or dark theme).
    """

    def __init__(self, canvas: Canvas, panels: list[Canvas] | None = None) -> None:
        if not isinstance(canvas, Canvas):
            raise TypeError(f"Diagram needs a Canvas, got {type(canvas).__name__}")
        if panels is not None and not all(isinstance(p, Canvas) for p in panels):
            raise TypeError("panels must be a list of Canvas")
        self.title = canvas.title
        self.labels: list[Label] = list(canvas.labels)
        self.svg: str = canvas.render()  # the whole drawing, panels side by side
        # a drawing made of panels shows them as separate SVGs that wrap onto a new line
        # when the page is too narrow for all of them side by side
        self._panels = [(p.render(), p.width) for p in panels] if panels else []

    @property
    def shape_labels(self) -> dict[str, str]:
        """key -> text of every label that shows a traced shape."""
        return {lb.key: lb.text for lb in self.labels if lb.key}

    def _repr_html_(self) -> str:
        # its own box scrolls if a phone is narrower than the diagram's smallest legible size
        box = ('<div class="tfbook-diagram" style="overflow-x:auto;max-width:100%;'
               'margin:0.5em 0">')
        if not self._panels:
            return box + self.svg + "</div>"
        row = ('<div role="group" aria-label="' + escape(self.title) + '" style="display:flex;'
               'flex-wrap:wrap;justify-content:center;align-items:flex-start;gap:12px 24px">')
        items = "".join(f'<div style="flex:0 1 auto;max-width:100%">{svg}</div>'
                        for svg, _ in self._panels)
        return box + row + items + "</div></div>"

    def __repr__(self) -> str:
        return f"<Diagram {self.title!r}: {len(self.labels)} labels>"
