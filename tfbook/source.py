"""Show the real source of a package object in a chapter, so the book never holds a copy.

``show(obj)`` renders the code that runs, highlighted, with the file and line numbers it
comes from. A name that no longer exists raises, so a renamed function fails the book
build instead of rendering an empty box.
"""

from __future__ import annotations

import html
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SourceCode:
    """Source text of one object, displayed as highlighted HTML in notebooks and the book."""

    qualname: str  # e.g. "tfbook.attention.scaled_dot_product_attention"
    path: str  # file, relative to the repository root when it is inside it
    first_line: int  # 1-based line number where the object starts
    code: str  # the exact source text

    @property
    def last_line(self) -> int:
        return self.first_line + self.code.count("\n") - (1 if self.code.endswith("\n") else 0)

    def header(self) -> str:
        return f"{self.qualname}  ({self.path}, lines {self.first_line}-{self.last_line})"

    def __repr__(self) -> str:
        return f"# {self.header()}\n{self.code}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        formatter = HtmlFormatter(noclasses=True, style="friendly", linenos="inline",
                                  linenostart=self.first_line, wrapcode=True)
        body = highlight(self.code, PythonLexer(), formatter)
        return (
            '<div class="tfbook-source" style="border:1px solid #d0d7de;border-radius:6px;'
            'margin:0.5em 0;overflow:auto">'
            '<div style="font:12px monospace;background:#f6f8fa;padding:4px 8px;'
            f'border-bottom:1px solid #d0d7de">{html.escape(self.header())}</div>'
            f'<div style="font-size:0.85em;padding:0 8px">{body}</div></div>'
        )


def resolve(name: str) -> Any:
    """Find an object from a dotted name: ``"tfbook.source.show"`` -> the function."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"expected a dotted name such as 'tfbook.source.show', got {name!r}")
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            if not hasattr(obj, attr):
                raise AttributeError(
                    f"cannot show {name!r}: {obj.__name__ if inspect.ismodule(obj) else obj!r} "
                    f"has no attribute {attr!r} (was it renamed?)"
                )
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"cannot show {name!r}: no module {parts[0]!r} can be imported")


def show(obj: Any) -> SourceCode:
    """Return the highlighted real source of a function, class, method or module.

    >>> show("tfbook.source.resolve").qualname
    'tfbook.source.resolve'
    """
    if isinstance(obj, str):
        obj = resolve(obj)
    target = inspect.unwrap(obj)
    try:
        lines, first_line = inspect.getsourcelines(target)
        path = Path(inspect.getsourcefile(target) or "")
    except (TypeError, OSError) as error:
        raise TypeError(
            f"show() expected a Python function, class, method or module with source code, "
            f"got {type(obj).__name__} {obj!r}: {error}"
        ) from None
    code = "".join(lines)
    if not code.strip():
        raise ValueError(f"show() found no source text for {obj!r}")
    module = inspect.getmodule(target)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "")
    if module is not None and module is not target:
        qualname = f"{module.__name__}.{qualname}"
    try:
        shown_path = path.resolve().relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        shown_path = path.name
    return SourceCode(qualname=qualname, path=shown_path, first_line=max(first_line, 1), code=code)
