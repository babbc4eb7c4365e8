"""The widget foundation: anywidget widgets that draw from data Python computed.

Each widget's JavaScript is a real file in ``static/`` (no build step), prefixed with the
shared helpers of ``static/common.js``. The front end redraws only from the widget's synced
data, so in the static HTML of the book (no kernel) sliders, hovers and step buttons still
work on the data saved at build time. In Jupyter the front end can also ask Python for new
data: it sends ``{"type": "request", "args": {...}}`` and the widget's ``compute(**args)``
answers by updating the data, then sends ``{"type": "done"}`` (the page shows that Python is
computing until then). A ``{"type": "ping"}`` is answered by ``live`` and ``{"type": "live"}``.

Text that comes from data reaches the saved page through ``page_text`` (no raw "<"), and the
front end undoes it (``fromPage`` in common.js); the error text too, since it can quote what
the reader typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

STATIC = Path(__file__).resolve().parent / "static"


def page_text(text: str) -> str:
    """`text` without any "<": "%" -> "%25", then "<" -> "%3C"; common.js's fromPage undoes
    both.

    The saved page holds the widget state as JSON inside a <script> element, and the book's
    builder escapes only "</script>" there: a token such as "<!--<script>" would make the
    HTML parser run past the element's end and swallow the rest of the page.

    >>> page_text("<!--<script> 100%")
    '%3C!--%3Cscript> 100%25'
    """
    return text.replace("%", "%25").replace("<", "%3C")


def check_typed(value: object, name: str, limit: int, empty: str, widget: str) -> str:
    """A reader's typed text: a str with something besides spaces, at most `limit` characters.

    `empty` is the message for a blank box; `widget` names the widget in the length message.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.60}")
    if not value.strip():
        raise ValueError(empty)
    if len(value) > limit:
        raise ValueError(f"the {name} has {len(value):,} characters; {widget} takes at most "
                         f"{limit:,}")
    return value


def _text_to_page(text: str, _widget: Any) -> str:
    return page_text(text)


def bundle(script: str) -> str:
    """The ES module of a widget: the shared helpers followed by ``static/<script>``."""
    parts = [(STATIC / "common.js").read_text(encoding="utf-8"),
             (STATIC / script).read_text(encoding="utf-8")]
    return "\n".join(parts)


class Widget(anywidget.AnyWidget):
    """Base of every tfbook widget: live-mode handshake and requests for new data."""

    # True once a kernel has answered the front end's ping: only then can it ask for data.
    live = traitlets.Bool(False).tag(sync=True)
    # The last error met while computing requested data, shown by the front end ("" if none);
    # it can quote the reader's text, so it goes to the page as page_text.
    error = traitlets.Unicode("").tag(sync=True, to_json=_text_to_page)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_front_end_message)

    def _on_front_end_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "ping":
            self.live = True
            self.send({"type": "live"})
        elif content.get("type") == "request":
            try:
                args = content.get("args", {})
                if not isinstance(args, dict):
                    raise TypeError(f"a request's args must be an object, got "
                                    f"{type(args).__name__}")
                self.compute(**args)
                self.error = ""
            except (ValueError, TypeError) as error:
                self.error = str(error)
            finally:
                self.send({"type": "done"})

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
