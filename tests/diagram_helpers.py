"""Helpers the diagram tests share: the SVG's texts and the sizes of a shape label."""

import re
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def text_of(el: ET.Element) -> str:
    """What a reader sees of one <text>: its lines (tspans placed at their own x) joined by a
    space, a subscript (a tspan in the flow) run into its word."""
    out = el.text or ""
    for span in el:
        out += (" " if "x" in span.attrib and out else "") + (span.text or "") + (span.tail or "")
    return out


def svg_texts(svg: str) -> list[str]:
    """Every <text> of the SVG, parsed as XML (so the escaping must be right)."""
    return [text_of(el) for el in ET.fromstring(svg).iter(f"{SVG}text")]


def numbers(label: str) -> tuple[int, ...]:
    """(B, T, C) = (1, 9, 64) -> (1, 9, 64)."""
    match = re.search(r"\(([^)]*)\) = \(([^)]*)\)", label)  # maybe among words
    assert match, label
    return tuple(int(s) for s in match.group(2).rstrip(",").split(", "))


def measure_in_chromium(browser, directory, page_name: str, drawn: dict, width: int,
                        script: str) -> list[dict]:
    """Each figure of `drawn` ({name: Diagram}) on one page with the book's CSS, opened in
    Chromium at `width` px; `script` (a JS function of the figure's box) measures each."""
    from tests.browser import serve
    from tests.diagram_gallery import page

    (directory / "index.html").write_text(page([(page_name, n, d) for n, d in drawn.items()]))
    with serve(directory) as site:
        tab = browser.new_page(viewport={"width": width, "height": 900})
        tab.goto(site + "/index.html")
        boxes = tab.locator(".tfbook-diagram")
        measured = [boxes.nth(i).evaluate(script) for i in range(boxes.count())]
        tab.close()
    assert len(measured) == len(drawn)
    return measured
