"""A small Sphinx extension for the tfbook site: nothing on a page may come from a CDN.

Jupyter Book always loads sphinx-thebe, whose configuration script (declared twice on each
page, a JavaScript error) points at a CDN copy of thebe. The book does not offer thebe's
"live code" (it runs offline; chapters run in Jupyter instead), so its scripts are dropped.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def _is_thebe(script: Any) -> bool:
    text = f"{getattr(script, 'filename', '') or ''} {script.attributes.get('body', '')}"
    return "thebe" in text.lower()


def drop_thebe(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_thebe(s)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
