r"""A small Sphinx extension for the tfbook site: nothing on a page comes from a CDN, and no
text inside a widget's saved state can escape its <script> element.

Jupyter Book always loads sphinx-thebe, whose configuration script (declared twice on each
page, a JavaScript error) points at a CDN copy of thebe. The book does not offer thebe's
"live code" (it runs offline; chapters run in Jupyter instead), so its scripts are dropped.

myst-nb writes the widgets' saved state into a
``<script type="application/vnd.jupyter.widget-state+json">`` element and escapes only the
exact lowercase ``</script>``. Tokens, sentences and labels are data the reader (or a
model) chose: ``</SCRIPT><img src=x onerror=...>`` or ``</script >`` would end the element
and run as part of the page, and ``<!--<script>`` would make the HTML parser run past its
end and stop every widget on the page. The state is therefore written again, the way
ipywidgets' own embedder escapes it (``ipywidgets.embed.escape_script``), but stricter:
every ``<`` becomes the JSON escape ``\u003c``, which JSON.parse reads back as ``<``.
With no ``<`` left, the HTML parser cannot end, open or comment anything inside the element.

Progress bars (tqdm) redraw their line with carriage returns. A terminal or Jupyter shows
only the last drawing; the saved output holds every one as its own stream message, and
myst-nb, merging a cell's stream messages, ends each one with a newline, so the page would
print every drawing on a line of its own. The messages of a stream are therefore joined as
they arrived and shown as a terminal would show them (on each line, only the text after its
last carriage return) before myst-nb merges them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

WIDGET_STATE_TYPE = "application/vnd.jupyter.widget-state+json"


def escape_widget_state(state: Any) -> str:
    r"""`state` as JSON that cannot end, open or comment out its <script>: "<" as \u003c.

    Only strings of JSON can hold a "<", and "\u003c" is the same character there; the
    default ensure_ascii also writes U+2028 and U+2029 as escapes.

    >>> escape_widget_state({"t": "</SCRIPT><!--"})
    '{"t": "\\u003c/SCRIPT>\\u003c!--"}'
    """
    return json.dumps(state).replace("<", "\\u003c")


def _is_thebe(script: Any) -> bool:
    text = f"{getattr(script, 'filename', '') or ''} {script.attributes.get('body', '')}"
    return "thebe" in text.lower()


def _is_widget_state(script: Any) -> bool:
    return getattr(script, "attributes", {}).get("type") == WIDGET_STATE_TYPE


def drop_thebe(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_thebe(s)]


def escape_widget_states(app: Sphinx, pagename: str, templatename: str, context: dict,
                         doctree) -> None:
    """Write each widget-state script of the page again with `escape_widget_state`.

    This handler runs after myst-nb's own (which adds the state to the page's scripts), on
    every page, so it also covers states kept from an earlier build's environment. It parses
    myst-nb's JSON back rather than patching myst-nb's renderer: the state's text is the
    same, only its escaping changes. A state that is not JSON stops the build.
    """
    scripts = context.get("script_files")
    if not scripts:
        return
    rewritten = []
    for script in scripts:
        if _is_widget_state(script):
            try:
                state = json.loads(script.attributes.get("body", ""))
            except json.JSONDecodeError as error:
                raise ExtensionError(f"tfbook_site: the widget state of page {pagename!r} is "
                                     f"not JSON ({error}); cannot escape it safely") from None
            attributes = {**script.attributes, "body": escape_widget_state(state)}
            script = type(script)(script.filename, priority=script.priority, **attributes)
        rewritten.append(script)
    context["script_files"] = rewritten


def terminal_text(text: str) -> str:
    """What a terminal shows of `text`: each line keeps what follows its last carriage return
    (a line that ends with one keeps the drawing before it). "a\rb\nc" -> "b\nc"."""
    lines = []
    for line in text.split("\n"):
        drawings = [part for part in line.split("\r") if part]
        lines.append(drawings[-1] if drawings else "")
    return "\n".join(lines)


def collapse_progress_bars(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Stream outputs (stdout/stderr of a cell) shown as a terminal shows them."""
    for block in doctree.findall(nodes.literal_block):
        classes = block.get("classes", [])
        if "output" in classes and ("stream" in classes or "stderr" in classes):
            text = block.astext()
            if "\r" in text:
                shown = terminal_text(text)
                block.rawsource = shown  # equal to its text: still highlighted as an output
                block.children = [nodes.Text(shown)]


def terminal_streams(outputs: list) -> list:
    """A cell's outputs with consecutive messages of one stream joined as they arrived and
    shown as a terminal shows them (terminal_text); other outputs unchanged."""
    joined: list = []
    for output in outputs:
        previous = joined[-1] if joined else None
        if (output.get("output_type") == "stream" and previous is not None
                and previous.get("output_type") == "stream"
                and previous.get("name") == output.get("name")):
            previous["text"] += output["text"]
        else:
            joined.append(copy.deepcopy(output))
    for output in joined:
        if output.get("output_type") == "stream":
            output["text"] = terminal_text(output["text"])
    return joined


def _use_terminal_streams() -> None:
    """Make myst-nb's stream merging (merge_streams) see terminal_streams' outputs."""
    from myst_nb.core import render

    merge = render.coalesce_streams
    if getattr(merge, "tfbook_terminal", False):
        return

    def coalesce(outputs: list) -> list:
        return merge(terminal_streams(outputs))

    coalesce.tfbook_terminal = True
    render.coalesce_streams = coalesce


def declare_parallel_reading(app: Sphinx, _config: Any) -> None:
    """Let Sphinx read (and so execute) several chapters at once (scripts/build_book.py).

    Two extensions that Jupyter Book loads do not declare whether they are safe for parallel
    reading, so Sphinx would read the pages one at a time: sphinx_multitoc_numbering renumbers
    sections only after every page is read, and sphinx_jupyterbook_latex acts only in LaTeX
    builds. Both are set up by the time the configuration is initialised.
    """
    for name in ("sphinx_multitoc_numbering", "sphinx_jupyterbook_latex"):
        extension = app.extensions.get(name)
        if extension is not None and extension.parallel_read_safe is None:
            extension.parallel_read_safe = True


def setup(app: Sphinx) -> dict[str, Any]:
    _use_terminal_streams()
    app.connect("config-inited", declare_parallel_reading)
    app.connect("doctree-resolved", collapse_progress_bars)
    app.connect("html-page-context", drop_thebe, priority=900)
    # myst-nb adds the widget state at the default priority (500): escape it after that.
    app.connect("html-page-context", escape_widget_states, priority=950)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
