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


def test_stream_messages_are_joined_as_a_terminal_shows_them():
    ext = site_extension()
    outputs = [{"output_type": "stream", "name": "stderr", "text": "\r 10%|#  |"},
               {"output_type": "stream", "name": "stderr", "text": "\r100%|###|"},
               {"output_type": "stream", "name": "stderr", "text": "\n"},
               {"output_type": "stream", "name": "stdout", "text": "done\n"}]
    joined = ext.terminal_streams(outputs)
    assert [o["text"] for o in joined] == ["100%|###|\n", "done\n"]
    assert outputs[0]["text"] == "\r 10%|#  |"  # the notebook's own outputs are not changed
    from myst_nb.core import render, utils

    ext.setup.__globals__["_use_terminal_streams"]()
    merged = {o["name"]: o["text"] for o in render.coalesce_streams(outputs)}  # the page's
    assert merged["stderr"].strip() == "100%|###|" and merged["stdout"] == "done\n"
    alone = {o["name"]: o["text"] for o in utils.coalesce_streams(outputs)}  # myst-nb alone
    assert alone["stderr"].count("\n") > 1  # one line per drawing
