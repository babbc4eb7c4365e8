"""tfbook.show renders the real source of package objects, and fails loudly on stale names."""

from __future__ import annotations

import inspect

import pytest

import tfbook
from tfbook.source import resolve, show
from tfbook.widgets.base import rounded


def test_show_renders_the_real_source_with_its_location() -> None:
    shown = show(rounded)
    assert shown.code == inspect.getsource(rounded)
    assert shown.qualname == "tfbook.widgets.base.rounded"
    assert shown.path == "tfbook/widgets/base.py"
    lines, first = inspect.getsourcelines(rounded)
    assert (shown.first_line, shown.last_line) == (first, first + len(lines) - 1)
    page = shown._repr_html_()
    assert "tfbook/widgets/base.py" in page and "rounded" in page and "<span" in page


def test_show_by_dotted_name_and_class() -> None:
    assert show("tfbook.widgets.base.rounded").code == show(rounded).code
    assert show("tfbook.source.SourceCode").code.startswith("@dataclass")
    assert tfbook.show is show


@pytest.mark.parametrize("name, error, message", [
    ("tfbook.widgets.base.renamed_function", AttributeError, "has no attribute 'renamed_function'"),
    ("nonexistent_package.thing", ModuleNotFoundError, "no module 'nonexistent_package'"),
])
def test_a_stale_name_raises(name: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        show(name)


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="expected a Python function, class, method or module"):
        show(3)
    with pytest.raises(TypeError, match="expected a Python function, class, method or module"):
        show(len)  # a builtin has no Python source
    with pytest.raises(TypeError, match="expected a dotted name"):
        resolve("")
