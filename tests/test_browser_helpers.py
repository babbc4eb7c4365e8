"""The standalone widget pages of the browser tests hold only the widget under test."""

from pathlib import Path

import ipywidgets

from tests.browser import widget_page


def test_a_widget_page_holds_only_its_widget_not_every_widget_of_the_process(tmp_path: Path):
    """ipywidgets embeds every live widget unless told otherwise: the page's size (which the
    explorer's test bounds) must not depend on which tests ran before."""
    bystander = ipywidgets.Textarea(value="bystander " * 1000)  # alive, unrelated
    shown = ipywidgets.IntSlider(value=7, description="shown")
    assets = tmp_path / "assets_src"
    assets.mkdir()
    page = widget_page(shown, assets, tmp_path / "site").read_text()
    assert "shown" in page and "bystander" not in page
    bystander.close()
    shown.close()
