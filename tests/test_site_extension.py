"""The book's Sphinx extension shows stream outputs as a terminal would (progress bars)."""

from docutils import nodes

from tests.browser import site_extension


def test_terminal_text_keeps_the_last_drawing_of_each_line():
    terminal_text = site_extension().terminal_text
    bar = "train:   0%| | 0/300\rtrain:  50%|#| 150/300\rtrain: 100%|##| 300/300\n"
    assert terminal_text(bar + "done\n") == "train: 100%|##| 300/300\ndone\n"
    assert terminal_text("a\rb\r\nc") == "b\nc"  # a line that ends with \r keeps its drawing
    assert terminal_text("plain\ntext") == "plain\ntext"


def test_only_stream_outputs_change():
    ext = site_extension()
    doc = nodes.document(None, None)
    stream = nodes.literal_block("x\ry", "x\ry", classes=["output", "stderr"])
    source = nodes.literal_block("x\ry", "x\ry", classes=["cell_input"])
    doc += [stream, source]
    ext.collapse_progress_bars(None, doc, "page")
    assert stream.astext() == "y" and stream.rawsource == "y"
    assert source.astext() == "x\ry"
