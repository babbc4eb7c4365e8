"""The widget foundation: anywidget widgets that draw from data Python computed.

Each widget's JavaScript is a real file in ``static/`` (no build step), prefixed with the
shared helpers of ``static/common.js``. The front end redraws only from the widget's synced
data, so in the static HTML of the book (no kernel) sliders, hovers and step buttons still
work on the data saved at build time. In Jupyter the front end can also ask Python for new
data: it sends ``{"type": "request", "args": {...}}`` and the widget's ``compute(**args)``
answers by updating the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

STATIC = Path(__file__).resolve().parent / "static"


def bundle(script: str) -> str:
    """The ES module of a widget: the shared helpers followed by ``static/<script>``."""
    parts = [(STATIC / "common.js").read_text(encoding="utf-8"),
             (STATIC / script).read_text(encoding="utf-8")]
    return "\n".join(parts)


class Widget(anywidget.AnyWidget):
    """Base of every tfbook widget: live-mode handshake and requests for new data."""

    # True once a kernel has answered the front end's ping: only then can it ask for data.
    live = traitlets.Bool(False).tag(sync=True)
    # The last error met while computing requested data, shown by the front end ("" if none).
    error = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_front_end_message)

    def _on_front_end_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "ping":
            self.live = True
        elif content.get("type") == "request":
            try:
                self.compute(**content.get("args", {}))
                self.error = ""
            except (ValueError, TypeError) as error:
                self.error = str(error)

    def compute(self, **args: Any) -> None:
        """Recompute the widget's data for new arguments (subclasses override)."""
        raise TypeError(f"{type(self).__name__} takes no requests, got {args!r}")


def rounded(values: Any, digits: int = 4) -> Any:
    """Nested lists of floats rounded for the page: the saved state stays small."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, list):
        return [rounded(v, digits) for v in values]
    return round(float(values), digits)
