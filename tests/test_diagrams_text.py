"""tfbook.diagrams.text: each stage of the drawn pipeline is the tokenizer's own output."""

from __future__ import annotations

import functools

import pytest

from tests.diagram_helpers import svg_texts
from tfbook.diagrams.text import pipeline_stages, pipelines_side_by_side, tokenizer_pipeline, wrap
from tfbook.tokenizers import BPETokenizer
from tfbook.tokenizers import load_gpt2 as _load_gpt2
from tfbook.tokenizers.pretokenize import bert_normalize, bert_pretokenize, regex_split
from tfbook.tokenizers.pretrained import load_minilm_wordpiece as _load_wordpiece
from tfbook.tokenizers.wordpiece import WordPieceTokenizer

load_gpt2 = functools.cache(_load_gpt2)  # read once for all tests
load_minilm_wordpiece = functools.cache(_load_wordpiece)
TEXT = "Café, naïve RÉSUMÉ; Łódź!"



def chip_labels(diagram, stage: str) -> list[str]:
    keys = sorted((lb for lb in diagram.labels if lb.key.startswith(stage + ".")),
                  key=lambda lb: int(lb.key.rsplit(".", 1)[1]))
    return [lb.text for lb in keys]


def test_wordpiece_stages_are_the_tokenizers_own() -> None:
    tok = load_minilm_wordpiece()
    stages = {s.name: s for s in pipeline_stages(tok, TEXT)}
    assert stages["normalise"].pieces == (bert_normalize(TEXT),)
    assert stages["pre-tokenise"].pieces == tuple(bert_pretokenize(TEXT))
    ids = tok.encode(TEXT, add_special_tokens=True)
    assert stages["post-process"].pieces == tuple(tok.vocab[i] for i in ids)
    post = stages["post-process"].pieces
    assert post[0] == "[CLS]" and post[-1] == "[SEP]"
    assert stages["ids"].pieces == tuple(str(i) for i in ids)
    d = tokenizer_pipeline(tok, TEXT)
    assert chip_labels(d, "ids") == [str(i) for i in ids]  # the drawn ids are encode()'s
    assert chip_labels(d, "model") == [tok.vocab[i] for i in tok.encode(TEXT)]
    for label in d.labels:
        assert label.text in svg_texts(d.svg)


def test_bpe_stages_are_the_tokenizers_own() -> None:
    tok = load_gpt2()
    stages = {s.name: s for s in pipeline_stages(tok, TEXT)}
    assert stages["normalise"].pieces == (TEXT,)  # byte-level BPE keeps every byte
    assert [p.replace("␣", " ") for p in stages["pre-tokenise"].pieces] == \
        regex_split(TEXT, tok.pattern)
    assert stages["ids"].pieces == tuple(str(i) for i in tok.encode(TEXT))
    assert stages["post-process"].pieces == ()  # GPT-2 adds nothing
    # a piece of a multi-byte character is shown escaped, not as a broken character
    d = tokenizer_pipeline(tok, "Łódź")
    assert any("\\x" in t for t in chip_labels(d, "model"))


def test_config_changes_the_drawing() -> None:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "café", "Café", "!"]
    uncased = WordPieceTokenizer(vocab)
    cased = WordPieceTokenizer(vocab, lowercase=False, strip_accents=False)
    a, b = tokenizer_pipeline(uncased, "Café!"), tokenizer_pipeline(cased, "Café!")
    assert chip_labels(a, "model") == ["cafe", "!"] and chip_labels(b, "model") == ["Café", "!"]
    assert "lowercase, strip accents" in svg_texts(a.svg)
    assert "lowercase, strip accents" not in svg_texts(b.svg)
    small = BPETokenizer.train("ab ab ab abc abc", 260)
    assert chip_labels(tokenizer_pipeline(small, "abc"), "ids") == \
        [str(i) for i in small.encode("abc")]


@pytest.mark.parametrize("hostile", ["<script>alert(1)</script>", '"onload="x', "a & b </svg>",
                                     "tab\there", "\x00nul"])
def test_hostile_text_stays_text(hostile: str) -> None:
    for tok in (load_minilm_wordpiece(), load_gpt2()):
        d = pipelines_side_by_side([("<b>heading</b>", tok)], "x " + hostile)
        html = d._repr_html_()
        assert "<script>" not in html and "<b>heading" not in html
        texts = svg_texts(d.svg)  # parses: nothing broke out of its element
        assert "<b>heading</b>" in texts
        for label in d.labels:
            assert label.text in texts


def test_wrap_keeps_every_character() -> None:
    text = "café, naïve, façade, résumé, Ångström, São Paulo, Zürich"
    for n in (8, 13, 40, 100):
        lines = wrap(text, n)
        assert "".join(lines) == text and all(len(line) <= n for line in lines)


def test_bad_input() -> None:
    tok = load_gpt2()
    with pytest.raises(TypeError, match="WordPieceTokenizer or a BPETokenizer"):
        pipeline_stages("gpt2", "text")
    with pytest.raises(TypeError, match="text must be a str"):
        pipeline_stages(tok, b"bytes")
    with pytest.raises(ValueError, match="something to tokenize"):
        pipeline_stages(tok, "   ")
    with pytest.raises(ValueError, match="width must be a number"):
        tokenizer_pipeline(tok, "text", width=20)
    with pytest.raises(TypeError, match="heading, tokenizer"):
        pipelines_side_by_side([tok], "text")


# --- RoPE (book/text/rope.md) -----------------------------------------------------------------

def test_rope_angles_are_apply_ropes() -> None:
    import math

    from tfbook.diagrams.positions import rope_angles_drawn, rope_planes
    from tfbook.rope import rope_frequencies

    D, positions, planes = 16, (0, 1, 2, 5, 30), (0, 1, 7)
    theta = rope_frequencies(D).tolist()
    angles = rope_angles_drawn(D, positions, planes)
    for i, n in enumerate(planes):
        for j, t in enumerate(positions):
            gap = abs(angles[i][j] - (t * theta[n]) % math.tau)
            assert min(gap, math.tau - gap) < 1e-9  # float64 rotation of a unit vector
    d = rope_planes(D, positions, planes)
    labels = {lb.key: lb for lb in d.labels if lb.key}
    assert labels["angle0.4"].text == f"{30 * theta[0]:.3g} rad"
    assert labels["theta2"].text == f"θ = {theta[7]:.3g}"
    assert [labels[f"plane{i}"].shape for i in range(3)] == [(0,), (1,), (7,)]
    for label in d.labels:
        assert label.text in svg_texts(d.svg)
    wider = rope_planes(64, positions, planes)  # another head size: other frequencies
    assert {lb.key: lb.text for lb in wider.labels}["theta1"] != labels["theta1"].text
    assert rope_planes(16, base=500.0).svg != rope_planes(16).svg


def test_rope_relative_angle_and_the_phones_layout() -> None:
    """The angle between a query at t and a key at s, read from apply_rope, is (t - s) theta
    (plus their angle before turning) at (t, s) and at (t + 10, s + 10); on a phone the grid
    turns so that its positions run down: every drawing fits a 358 px column."""
    import math

    from tfbook.diagrams.positions import rope_planes
    from tfbook.rope import rope_frequencies

    d = rope_planes(16, (0, 1, 2, 5, 30), (0, 1, 7), relative=(5, 2))
    labels = {lb.key: lb.text for lb in d.labels if lb.key}
    gap = ((5 - 2) * rope_frequencies(16)[0].item() + 0.7) % math.tau
    assert labels["relative.gap0"] == labels["relative.gap1"] == f"q − k: {gap:.3g} rad"
    assert labels["relative.pair1"] == "t = 15, s = 12"
    assert d.wired and max(d.phone_widths) <= 358
    narrow = {lb.key: lb.text for lb in d.narrow_labels if lb.key}
    assert all(narrow[f"angle{i}.{j}"] == labels[f"angle{i}.{j}"]
               for i in range(3) for j in range(5))
    with pytest.raises(ValueError, match="relative must be a pair"):
        rope_planes(16, relative=(5, -2))


@pytest.mark.parametrize("args", [(15,), (16, (), (0,)), (16, (0, -1), (0,)), (16, (0,), (8,)),
                                  (16, [0, 1], (0,)), (16, (0,), (0,), 1.0)])
def test_rope_bad_input(args: tuple) -> None:
    from tfbook.diagrams.positions import rope_planes

    with pytest.raises(ValueError, match="must be"):
        rope_planes(*args)


# --- BPE merge tree (book/text/bpe.md) ----------------------------------------------------------

def test_merge_tree_is_the_tokenizers_merges() -> None:
    from tfbook.diagrams.text import merge_forest, merge_tree

    tok = BPETokenizer.train("low lower lowest newest widest " * 20, 256 + 12)
    word = " lowest"
    forest = merge_forest(tok, word)
    assert [tree.token_id for tree in forest] == tok.encode(word)  # the roots are encode()'s
    for tree in forest:
        for node in tree.merges():  # each inner node is a learned merge of its two children
            left, right = node.children
            assert tok.merges[(left.token_id, right.token_id)] == node.token_id
            assert node.text == left.text + right.text == tok.vocab[node.token_id]
    leaves = [leaf.token_id for tree in forest for leaf in tree.leaves()]
    assert bytes(leaves) == word.encode()
    d = merge_tree(tok, word)
    labels = {lb.key: lb for lb in d.labels if lb.key}
    merged = {node.token_id for tree in forest for node in tree.merges()}
    assert {k for k in labels if k.startswith("merge.")} == {f"merge.{i}" for i in merged}
    for i in merged:
        assert labels[f"merge.{i}"].text == f"merge {i}" and labels[f"merge.{i}"].shape == (i,)
    texts = svg_texts(d.svg)
    for label in d.labels:
        assert label.text in texts
    # one arrow from each part to the merge that joined it, each said to be the tokenizer's
    assert d.wired and len(d._other_arrows) == 2 * len(merged)
    # fewer merges: another tree
    fewer = merge_tree(tok.with_merges(3), word)
    assert fewer.svg != d.svg and len(merge_forest(tok.with_merges(3), word)) > len(forest)


def test_merge_tree_escapes_hostile_tokens() -> None:
    from tfbook.diagrams.text import merge_forest, merge_tree

    hostile = '<a&"b\'>'
    tok = BPETokenizer.train(hostile * 40, 256 + 8, pattern=None)
    forest = merge_forest(tok, hostile)
    assert len(forest) < len(hostile)  # merges happened across <, &, quotes
    d = merge_tree(tok, hostile, title="<script>x</script>")
    assert "<script>" not in d._repr_html_()
    texts = svg_texts(d.svg)  # parses: nothing broke out of its element
    assert "<script>x</script>" in texts
    assert any("<" in t and "&" in t for t in texts)  # a merged token holding < and &
    for label in d.labels:
        assert label.text in texts


def test_merge_tree_bad_input() -> None:
    from tfbook.diagrams.text import merge_tree

    tok = BPETokenizer.train("ab ab ab", 258)
    with pytest.raises(TypeError, match="needs a BPETokenizer"):
        merge_tree(load_minilm_wordpiece(), "ab")
    with pytest.raises(TypeError, match="word must be a str"):
        merge_tree(tok, b"ab")
    with pytest.raises(ValueError, match="1 to 16 bytes"):
        merge_tree(tok, "")
    with pytest.raises(ValueError, match="1 to 16 bytes"):
        merge_tree(tok, "ab" * 9)


def test_pipelines_line_up_their_stages_and_every_arrow_says_what_it_is() -> None:
    """Side by side, each stage starts at one height in both pipelines; on a phone they stack,
    each with its own spacing; every arrow is a stage feeding the next (no arrow unexplained)."""
    import re

    from tfbook.diagrams.text import pipelines_side_by_side
    from tfbook.tokenizers import load_gpt2, load_minilm_wordpiece

    d = pipelines_side_by_side([("WordPiece", load_minilm_wordpiece()), ("BPE", load_gpt2())],
                               "Łódź, naïve café")
    tops = [[float(y) for y in re.findall(r'<text x="0" y="([\d.]+)" font-size="14" '
                                          r'text-anchor="start" class="b">(?:text|normalise|'
                                          r'pre-tokenise|model|post-process|ids)<', svg)]
            for svg, _ in d._panels]
    assert len(tops[0]) == len(tops[1]) == 6 and tops[0] == tops[1]
    assert d.wired and max(d.phone_widths) <= 358
