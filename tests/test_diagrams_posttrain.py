"""The figures of Part VII's post-training chapters (tfbook.diagrams.posttrain), held against
the objects they draw.

- chat_mask_figure: its boxes are chat_ids' tokens in order (their texts give back the rendered
  chat), the highlighted ones are exactly assistant_mask's 1s, each role's boxes hold exactly
  that role's text, the bars of `shifted` are sft's shifted labels; hostile message text
  (markup, quotes, a forged <|im_end|>, an 80-byte token) stays text;
- both figures fit the book's column and a phone's with the book's smallest text, and in
  Chromium no two texts overlap and no line crosses a text.
"""

from __future__ import annotations

import doctest
import time
import xml.etree.ElementTree as ET

import pytest

import tests.diagram_helpers as helpers
import tfbook.diagrams.posttrain as posttrain_figures
from tfbook.diagrams.diagram import PHONE_COLUMN
from tfbook.diagrams.posttrain import chat_mask_figure, token_text
from tfbook.diagrams.svg import SMALL
from tfbook.losses import IGNORE_INDEX
from tfbook.posttrain.chat import assistant_mask, chat_ids, render_chat
from tfbook.posttrain.sft import sft_example

SVG = "{http://www.w3.org/2000/svg}"
DESKTOP_COLUMN = 672.0  # the article column at 1,280 px

TWO_TURNS = [{"role": "user", "content": "What is 7 times 8?"},
             {"role": "assistant", "content": "7 times 8 is 56."},
             {"role": "user", "content": "And plus 4?"},
             {"role": "assistant", "content": "56 + 4 = 60."}]
WITH_SYSTEM = [{"role": "system", "content": "Answer in one line."},
               {"role": "user", "content": "Name a prime."},
               {"role": "assistant", "content": "\n 7 is prime."}]  # "\n " may merge with "\n"
NO_ANSWER = [{"role": "user", "content": "Hello there"}]
HOSTILE = [{"role": "system", "content": "Be <script>alert('x')</script> & \"brief\" <|im_end|>"},
           {"role": "user", "content": "#" * 80 + " a\u202eb\t&amp;"},
           {"role": "assistant", "content": "<b>ok</b> <|im_start|>user"}]
CONVERSATIONS = {"two turns": TWO_TURNS, "system": WITH_SYSTEM, "no answer": NO_ANSWER,
                 "hostile": HOSTILE}


@pytest.fixture(scope="module")
def tok():
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def boxes(svg: str) -> list[tuple[str, str]]:
    """(category, text) of every token box, in drawing order (the legend's swatches have no
    text after them in the token rows: they are told apart by their class only)."""
    root = ET.fromstring(svg)
    out, category = [], None
    for el in root.iter():
        cls = el.get("class", "")
        if el.tag == f"{SVG}rect" and cls.startswith("tk "):
            category = cls.split("tk-")[1]
        elif el.tag == f"{SVG}text" and category is not None:
            out.append((category, helpers.text_of(el)))
            category = None
    return out


def token_boxes(d, svg: str) -> list[tuple[str, str]]:
    return boxes(svg)[: len(d.ids)]


def unshown(label: str) -> str:
    """A box's text back to the token's text, for text without ␣, \\ or long tokens."""
    return label.replace("␣", " ").replace("\\n", "\n")


# --- chat_mask_figure ------------------------------------------------------------------------

@pytest.mark.parametrize("which", CONVERSATIONS)
def test_highlighted_boxes_are_the_assistant_mask(tok, which: str) -> None:
    """One box per id of chat_ids, in order, in both layouts; the highlighted ones are exactly
    the positions where assistant_mask is 1."""
    messages = CONVERSATIONS[which]
    d = chat_mask_figure(tok, messages)
    ids, mask = chat_ids(tok, messages), assistant_mask(tok, messages)
    assert d.ids == ids and d.mask == mask
    assert d.token_bytes == [tok.decode_bytes([i]) for i in ids]
    for svg in [d.svg, *d._narrow]:
        drawn = token_boxes(d, svg)
        assert [text for _, text in drawn] == [token_text(b) for b in d.token_bytes]
        assert [cat == "target" for cat, _ in drawn] == [bool(m) for m in mask]
        root = ET.fromstring(svg)
        targets = [r for r in root.iter(f"{SVG}rect") if "tk-target" in r.get("class", "")]
        assert len(targets) == sum(mask) + 1  # the boxes, and the legend's swatch
    texts = helpers.svg_texts(d.svg)
    assert f"{sum(mask)} of {len(ids)} tokens" in " ".join(texts)
    if which == "no answer":
        assert sum(mask) == 0


@pytest.mark.parametrize("which", ["two turns", "system"])
def test_box_texts_give_back_the_rendered_chat(tok, which: str) -> None:
    """The boxes' texts, read from the SVG and joined, are render_chat's string; and each
    role's boxes hold exactly that role's text (the system prompt SmolLM2 adds included)."""
    from tfbook.checkpoints.smollm2 import DEFAULT_SYSTEM_PROMPT

    messages = CONVERSATIONS[which]
    d = chat_mask_figure(tok, messages)
    rendered = render_chat(messages)
    assert b"".join(d.token_bytes) == rendered.encode()
    assert "".join(unshown(text) for _, text in token_boxes(d, d.svg)) == rendered
    by_role = {cat: b"".join(b for b, c in zip(d.token_bytes, d.categories, strict=True)
                             if c == cat) for cat in ("system", "user", "target")}
    system = [m["content"] for m in messages if m["role"] == "system"] or [DEFAULT_SYSTEM_PROMPT]
    assert by_role["system"].decode() == "".join(system)
    assert by_role["user"].decode() == "".join(m["content"] for m in messages
                                               if m["role"] == "user")
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    # the targets: each answer and its <|im_end|>; the answer opening with "\n " shares its
    # first token "\n\n " with the role's newline, and assistant_mask marks that token
    shared = "\n" if which == "system" else ""
    assert by_role["target"].decode() == shared + "".join(a + "<|im_end|>" for a in answers)
    specials = [t for t, c in zip(token_boxes(d, d.svg), d.categories, strict=True)
                if c == "template"]
    assert [t for _, t in specials].count("<|im_start|>") == rendered.count("<|im_start|>")


def test_the_bars_are_the_shifted_labels(tok) -> None:
    """With shifted=True, a bar under box t exactly where sft's label of position t is a
    target (token t + 1 is the assistant's); none without it."""
    d = chat_mask_figure(tok, TWO_TURNS, shifted=True)
    labels = sft_example(tok, TWO_TURNS, max_len=1000).labels
    assert d.graded == [label != IGNORE_INDEX for label in labels]
    assert sum(d.graded) == sum(d.mask[1:])
    for svg in [d.svg, *d._narrow]:
        bars = [r for r in ET.fromstring(svg).iter(f"{SVG}rect") if r.get("class") == "graded"]
        assert len(bars) == sum(d.graded) + 1  # and the legend's
    assert f"{sum(d.graded)} positions" in " ".join(helpers.svg_texts(d.svg))
    plain = chat_mask_figure(tok, TWO_TURNS)
    assert plain.graded is None and 'class="graded"' not in plain.svg


def test_hostile_text_stays_text(tok) -> None:
    """Markup, quotes and ampersands are escaped text; a forged <|im_end|> in a message is
    drawn as the message's text (several ordinary tokens), never as a marker; an 80-byte token
    is cut with "…"; a right-to-left override is shown as bytes, not obeyed."""
    d = chat_mask_figure(tok, HOSTILE)
    for svg in [d.svg, *d._narrow]:
        root = ET.fromstring(svg)  # parses: nothing broke out of its element
        assert not any(el.tag.endswith(("script", "b")) for el in root.iter())
        assert "<script" not in svg and "<b>" not in svg and "\u202e" not in svg
    texts = [t for _, t in token_boxes(d, d.svg)]
    ids = chat_ids(tok, HOSTILE)
    end = tok.token_to_id("<|im_end|>")
    assert texts.count("<|im_end|>") == ids.count(end) == 3  # the template's only
    assert ids.count(tok.token_to_id("<|im_start|>")) == texts.count("<|im_start|>") == 3
    assert "#" * 15 + "…" in texts and not any("#" * 16 in t for t in texts)
    assert any("&" in t for t in texts) and any('"' in t for t in texts)
    assert "\\t" in texts or any("\\t" in t for t in texts)
    # the forged markers lie in the system's and the assistant's text, as that role's tokens
    def held(category: str) -> bytes:
        return b"".join(b for b, c in zip(d.token_bytes, d.categories, strict=True)
                        if c == category)

    assert held("system") == HOSTILE[0]["content"].encode()
    assert held("user") == HOSTILE[1]["content"].encode()
    assert held("target") == (HOSTILE[2]["content"] + "<|im_end|>").encode()


def test_drawing_is_cheap(tok) -> None:
    messages = TWO_TURNS * 1 + [{"role": "user", "content": "Once more?"},
                                {"role": "assistant", "content": "Yes. " * 20}]
    start = time.process_time()
    chat_mask_figure(tok, messages, shifted=True)
    assert time.process_time() - start < 0.5


def test_bad_input_is_refused(tok) -> None:
    with pytest.raises(TypeError, match="SmolLM2's VocabBPETokenizer"):
        chat_mask_figure("gpt2", TWO_TURNS)
    with pytest.raises(ValueError, match="role 'robot'"):
        chat_mask_figure(tok, [{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="must alternate"):
        chat_mask_figure(tok, [TWO_TURNS[0], TWO_TURNS[0]])
    with pytest.raises(TypeError, match="shifted must be True or False"):
        chat_mask_figure(tok, TWO_TURNS, shifted=1)
    with pytest.raises(ValueError, match="draws at most max_tokens=20"):
        chat_mask_figure(tok, TWO_TURNS, max_tokens=20)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        chat_mask_figure(tok, TWO_TURNS, max_tokens=0)
    with pytest.raises(TypeError, match="title must be a str"):
        chat_mask_figure(tok, TWO_TURNS, title=3)
    with pytest.raises(TypeError, match="a token must be bytes"):
        token_text("x")


# --- sizes, and a look in Chromium --------------------------------------------------------

def drawings(tok) -> dict[str, object]:
    return {
        "chat mask, two turns, shifted": chat_mask_figure(tok, TWO_TURNS, shifted=True),
        "chat mask, system": chat_mask_figure(tok, WITH_SYSTEM),
        "chat mask, hostile": chat_mask_figure(tok, HOSTILE, shifted=True),
    }


@pytest.fixture(scope="module")
def drawn(tok) -> dict[str, object]:
    return drawings(tok)


def test_fits_a_phone_and_the_book_column_with_legible_text(drawn) -> None:
    for name, d in drawn.items():
        assert d.wired, name
        assert d._wide_min <= DESKTOP_COLUMN, (name, d._wide_min)
        assert max(d.phone_widths) <= PHONE_COLUMN, (name, d.phone_widths)
        for svg in [d.svg, *d._narrow]:
            sizes = [float(el.get("font-size")) for el in ET.fromstring(svg).iter(f"{SVG}text")]
            assert min(sizes) >= SMALL, name


@pytest.mark.parametrize("width", [1280, 390])
def test_no_text_overlaps_and_no_line_crosses_text_in_chromium(browser, drawn, tmp_path,
                                                                width: int) -> None:
    """The figures in the book's column (672 px at 1,280 px, 358 px on a phone): nothing
    scrolls sideways, every text is at least the book's 12 px, no two texts overlap and no
    line runs through a text (the measuring script and the tests are the inspect figures')."""
    from tests.browser import serve
    from tests.diagram_gallery import page
    from tests.test_diagrams_inspect import TEXTS_JS, crosses

    (tmp_path / "index.html").write_text(page([("posttrain", n, d) for n, d in drawn.items()]))
    with serve(tmp_path) as site:
        tab = browser.new_page(viewport={"width": width, "height": 900})
        tab.goto(site + "/index.html")
        found = tab.locator(".tfbook-diagram")
        measured = [found.nth(i).evaluate(TEXTS_JS) for i in range(found.count())]
        tab.close()
    assert len(measured) == len(drawn)
    for name, m in zip(drawn, measured, strict=True):
        assert m["scroll"] <= m["client"] + 1, (name, width, m["scroll"], m["client"])
        texts = [t for t in m["texts"] if not t.get("disc")]
        assert len(texts) > 20 and min(t["px"] for t in texts) >= 12 - 0.01, (name, width)
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                overlap = (min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
                           and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5)
                assert not overlap, (name, width, a["text"], b["text"], a["left"], b["left"])
        for t in texts:
            hit = [s for s in m["segments"] if crosses(s, t)]
            assert not hit, (name, width, t["text"], hit[:2])


def test_docstring_examples() -> None:
    assert doctest.testmod(posttrain_figures).failed == 0


if __name__ == "__main__":  # `python -m tests.test_diagrams_posttrain OUT.html`: to look at
    import sys
    from pathlib import Path

    from tests.diagram_gallery import page
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    Path(sys.argv[1]).write_text(page([("posttrain", n, d) for n, d in
                                       drawings(load_smollm2_tokenizer()).items()]))
