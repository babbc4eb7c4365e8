"""Every diagram of the book, drawn as its chapter draws it (tests/diagram_gallery.py): every
arrow is a checked dependency of the computation (or says why it is none), every figure fits
the book's column at 1,280 px and a phone's at 390 px without scrolling sideways, and, in
Chromium with the book's CSS, no diagram's box scrolls at either width."""

from __future__ import annotations

import pytest

from tests.browser import serve
from tests.diagram_gallery import figures, page
from tfbook.diagrams.diagram import PHONE_COLUMN

FIGURES = figures()
DESKTOP_COLUMN = 672.0  # the article column at 1,280 px
# Figures that may scroll sideways on a phone, each with the reason: none today. A figure
# added here must say why its point stays in sight without scrolling.
SCROLLS_ON_A_PHONE: dict[str, str] = {}


@pytest.fixture(scope="module")
def drawn() -> dict[str, object]:
    return {name: draw() for _, name, draw in FIGURES}


def test_the_gallery_holds_every_diagram_of_the_book() -> None:
    """Parts I-VI's 27 diagrams (the speculative-decoding and Q4_1 figures are their chapters',
    drawn and tested there), the model families chapter's five (sliding window, QK-norm,
    mixture of experts, latent attention, RoPE scaling), the sharding chapter's five (DDP's
    buckets on the backward pass, memory per rank, the tensor-parallel split, GPipe and 1F1B,
    the ring's zig-zag), Part VII's two inside the model and its two after pre-training (the
    assistant mask, DPO's pair of policies): 41, each with a name of its own."""
    names = [name for _, name, _ in FIGURES]
    assert len(names) == len(set(names)) == 41


@pytest.mark.parametrize("name", [name for _, name, _ in FIGURES])
def test_every_arrow_is_a_checked_dependency_or_says_why_not(drawn, name: str) -> None:
    d = drawn[name]
    assert d.wired, f"{name}: an arrow neither checked against the computation nor explained"


@pytest.mark.parametrize("name", [name for _, name, _ in FIGURES])
def test_fits_the_column_at_both_widths(drawn, name: str) -> None:
    d = drawn[name]
    assert d._wide_min <= DESKTOP_COLUMN, f"{name}: {d._wide_min:.0f} px at 1,280 px"
    if name not in SCROLLS_ON_A_PHONE:
        assert max(d.phone_widths) <= PHONE_COLUMN, f"{name}: {d.phone_widths} px on a phone"


MEASURE_JS = """() => [...document.querySelectorAll('section')].map((s) => {
  const box = s.querySelector('.tfbook-diagram');
  const shown = [...box.querySelectorAll('.tfd-wide, .tfd-narrow')]
    .filter((e) => getComputedStyle(e).display !== 'none').map((e) => e.className);
  return {name: s.dataset.name, scroll: box.scrollWidth, client: box.clientWidth, shown,
          layouts: box.querySelectorAll('.tfd-wide, .tfd-narrow').length};
})"""


@pytest.mark.parametrize("width", [1280, 390])
def test_no_diagram_scrolls_in_chromium(browser, drawn, tmp_path, width: int) -> None:
    """The gallery page with the book's CSS and its article column (672 px at 1,280 px, 358 px
    on a phone): no diagram's box is wider than its column, and a figure with a phone layout
    shows exactly one of its two layouts (the phone's on the phone, when the wide one would
    not fit)."""
    (tmp_path / "index.html").write_text(page([(p, n, drawn[n]) for p, n, _ in FIGURES]))
    with serve(tmp_path) as site:
        tab = browser.new_page(viewport={"width": width, "height": 900})
        tab.goto(site + "/index.html")
        boxes = tab.evaluate(MEASURE_JS)
        tab.close()
    assert len(boxes) == len(FIGURES)
    for box in boxes:
        if box["name"] not in SCROLLS_ON_A_PHONE or width > 400:
            assert box["scroll"] <= box["client"] + 1, box
        if box["layouts"]:
            assert len(box["shown"]) == 1, box
            d = drawn[box["name"]]
            phone = width < 400 and d._switch > PHONE_COLUMN
            assert box["shown"] == (["tfd-narrow"] if phone else ["tfd-wide"]), box
