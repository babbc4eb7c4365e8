"""`Diagram`: a finished drawing that shows itself in Jupyter and in the static book."""

from __future__ import annotations

import hashlib

from tfbook.diagrams.svg import MIN_SCALE, PAD, Canvas, Label, escape

PHONE_COLUMN = 358.0  # the book's article column on a phone held upright (390 px wide)


def narrowest(canvas: Canvas) -> float:
    """The least width (CSS px) `canvas` is drawn at before its box scrolls: its natural
    width, margins included, times the smallest scale that keeps its text legible."""
    return (canvas.width + 2 * PAD) * MIN_SCALE


class Diagram:
    """An SVG drawing with the list of its labels and its arrows.

    `.svg` is the SVG string; `.labels` every text on it (`Label(text, key, shape)`, where
    `key` names the traced tensor a shape label shows); `.shape_labels` maps those keys to
    their text; `.edges` are its arrows as dependencies (source, result) between traced
    tensors, and `.wired` says whether every arrow was held against the computation. In a
    notebook it displays as inline SVG in HTML, so its text and lines take the page's colour.

    `panels` show as separate SVGs that wrap onto new lines when the column is narrow.
    `narrow`, drawings of the same figure laid out for a phone's column (stacked, each at most
    `PHONE_COLUMN` wide), replaces the wide layout wherever the column is narrower than it (a
    CSS container query): the point of the figure stays in sight without scrolling sideways.
    """

    def __init__(self, canvas: Canvas, panels: list[Canvas] | None = None,
                 narrow: list[Canvas] | None = None, narrow_below: float | None = None) -> None:
        if not isinstance(canvas, Canvas):
            raise TypeError(f"Diagram needs a Canvas, got {type(canvas).__name__}")
        for what, group in (("panels", panels), ("narrow", narrow)):
            if group is not None and not (isinstance(group, list) and group
                                          and all(isinstance(p, Canvas) for p in group)):
                raise TypeError(f"{what} must be a non-empty list of Canvas")
        self.title = canvas.title
        self.labels: list[Label] = list(canvas.labels)
        self.svg: str = canvas.render()  # the whole drawing, panels side by side
        # a drawing made of panels shows them as separate SVGs that wrap onto a new line
        # when the page is too narrow for all of them side by side
        self._panels = [(p.render(), p.width) for p in panels] if panels else []
        self._wide_min = max(narrowest(p) for p in panels or [canvas])
        # the narrow layout replaces the wide one below this width: where the wide one would
        # scroll, or (given) where its panels would no longer stand side by side
        self._switch = self._wide_min if narrow_below is None else float(narrow_below)
        # the arrows: dependencies (source, result) between traced tensors, each panel's
        # names with its prefix, and whether every arrow was checked against the computation
        self.edges: list[tuple[str, str]] = list(canvas.edges)
        self._other_arrows: list[str] = list(canvas.other_arrows)  # arrows that are no data
        self.wired: bool = canvas.wired and all(p.wired for p in panels or [])
        self.narrow_labels: list[Label] = []
        self._narrow: list[str] = []
        if narrow is not None:
            wide = {lb.key: lb.shape for lb in self.labels if lb.key}
            for lb in (lb for p in narrow for lb in p.labels if lb.key):
                if lb.key in wide and wide[lb.key] != lb.shape:
                    raise RuntimeError(f"the narrow layout shows {lb.key} as {lb.shape}, the "
                                       f"wide one as {wide[lb.key]}")
            self.narrow_labels = [lb for p in narrow for lb in p.labels]
            self._narrow = [p.render() for p in narrow]
            self.narrow_widths = [narrowest(p) for p in narrow]
            self.wired = self.wired and all(p.wired for p in narrow)

    @property
    def shape_labels(self) -> dict[str, str]:
        """key -> text of every label that shows a traced shape."""
        return {lb.key: lb.text for lb in self.labels if lb.key}

    @property
    def phone_widths(self) -> list[float]:
        """The least widths (CSS px) of the drawings a phone's column shows: the narrow
        layout's if there is one and the wide one does not fit, else the wide one's panels."""
        if self._narrow and self._switch > PHONE_COLUMN:
            return list(self.narrow_widths)
        return [self._wide_min]

    def _wide_html(self) -> str:
        if not self._panels:
            return self.svg
        row = ('<div role="group" aria-label="' + escape(self.title) + '" style="display:flex;'
               'flex-wrap:wrap;justify-content:center;align-items:flex-start;gap:12px 24px">')
        items = "".join(f'<div style="flex:0 1 auto;max-width:100%">{svg}</div>'
                        for svg, _ in self._panels)
        return row + items + "</div>"

    def _repr_html_(self) -> str:
        # its own box scrolls if a phone is narrower than the diagram's smallest legible size
        box = ('<div class="tfbook-diagram" style="overflow-x:auto;max-width:100%;'
               'margin:0.5em 0')
        if not self._narrow:
            return box + '">' + self._wide_html() + "</div>"
        # the narrow layout replaces the wide one when the box is narrower than the wide one
        # can be drawn (a container query on the box: no script, any number per page)
        tag = "tfd-" + hashlib.sha1((self.svg + "".join(self._narrow)).encode()).hexdigest()[:10]
        below = f"{self._switch - 0.5:.1f}".rstrip("0").rstrip(".")
        style = (f".{tag}>.tfd-narrow{{display:none}}"
                 f"@container (max-width:{below}px){{.{tag}>.tfd-wide{{display:none}}"
                 f".{tag}>.tfd-narrow{{display:flex}}}}")
        narrow = ('<div class="tfd-narrow" role="group" aria-label="' + escape(self.title)
                  + '" style="flex-direction:column;align-items:center;gap:12px">'
                  + "".join(f'<div style="max-width:100%">{svg}</div>' for svg in self._narrow)
                  + "</div>")
        return (box + ';container-type:inline-size"><div class="' + tag + '">'
                + f"<style>{style}</style>"
                + '<div class="tfd-wide">' + self._wide_html() + "</div>" + narrow
                + "</div></div>")

    def __repr__(self) -> str:
        return f"<Diagram {self.title!r}: {len(self.labels)} labels>"
