"""tfbook.diagrams.inputs: the one-hot product and BERT's input sum, drawn from real tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.diagram_helpers import numbers, svg_texts
from tfbook.diagrams.inputs import bert_input, embedding_lookup
from tfbook.embeddings import TokenEmbedding
from tfbook.models.bert import Bert, BertConfig, BertForMaskedLM

HOSTILE = ["<script>", "a&b", '"q"', "'s", "</svg>", "\x00"]


def _labels(d) -> dict[str, str]:
    return {lb.key: lb.text for lb in d.labels if lb.key}


# --- embedding_lookup ------------------------------------------------------------------------

def test_lookup_labels_are_the_tensors_shapes() -> None:
    embed = TokenEmbedding(500, 24)
    idx = torch.tensor([[7, 300, 7, 41, 499]])
    d = embedding_lookup(embed, idx, ["a", " b", "a", "c", "d"])
    labels = _labels(d)
    one_hot = F.one_hot(idx[0], 500)
    assert numbers(labels["one_hot"]) == tuple(one_hot.shape) == (5, 500)
    assert numbers(labels["table"]) == tuple(embed.weight.shape) == (500, 24)
    assert numbers(labels["x"]) == tuple(embed(idx)[0].shape) == (5, 24)
    # the columns drawn are the ids present, in order; each row of X names the row it copies
    assert [labels[f"column.{j}"] for j in range(4)] == ["7", "41", "300", "499"]
    assert [labels[f"x.{t}"] for t in range(5)] == [f"E[{v}]" for v in idx[0].tolist()]
    assert [labels[f"row.{j}"] for j in range(4)] == [f"row {v}" for v in (7, 41, 300, 499)]
    texts = svg_texts(d.svg)
    assert texts.count("1") == 5  # one 1 per row of O
    for label in d.labels:
        assert label.text in texts


def test_lookup_changes_with_the_table_and_ids() -> None:
    idx = torch.tensor([[1, 2, 3]])
    a = embedding_lookup(TokenEmbedding(10, 8), idx, ["x", "y", "z"])
    b = embedding_lookup(TokenEmbedding(40, 16), idx, ["x", "y", "z"])
    c = embedding_lookup(TokenEmbedding(10, 8), torch.tensor([[1, 2, 9]]), ["x", "y", "z"])
    assert _labels(a)["table"] == "(V, C) = (10, 8)" and _labels(b)["table"] == "(V, C) = (40, 16)"
    assert _labels(b)["x"] == "(T, C) = (3, 16)"
    assert _labels(c)["column.2"] == "9" and "column.2" in _labels(a)
    assert a.svg != c.svg
    d = embedding_lookup(torch.nn.Embedding(10, 8), torch.tensor([[0, 5], [4, 4]]), ["p", "q"],
                         row_index=1)
    assert _labels(d)["x.0"] == "E[4]" and "column.1" not in _labels(d)


def test_lookup_escapes_tokens() -> None:
    ids = torch.arange(len(HOSTILE)).unsqueeze(0)
    d = embedding_lookup(TokenEmbedding(10, 4), ids, HOSTILE)
    html = d._repr_html_()
    assert "<script>" not in html and "</svg>x" not in html
    texts = svg_texts(d.svg)  # parses as XML: nothing broke out
    for token in HOSTILE[:-1]:
        assert token in texts
    assert "\\x00" in texts  # a control character shown escaped


def test_lookup_bad_input() -> None:
    embed = TokenEmbedding(10, 4)
    idx = torch.tensor([[1, 2]])
    with pytest.raises(TypeError, match="module with a \\(V, C\\) weight"):
        embedding_lookup(torch.zeros(10, 4), idx, ["a", "b"])
    with pytest.raises(TypeError, match="integer torch.Tensor"):
        embedding_lookup(embed, idx.float(), ["a", "b"])
    with pytest.raises(ValueError, match="shape \\(B, T\\)"):
        embedding_lookup(embed, idx[0], ["a", "b"])
    with pytest.raises(ValueError, match="1 tokens for 2 ids"):
        embedding_lookup(embed, idx, ["a"])
    with pytest.raises(TypeError, match="list of str"):
        embedding_lookup(embed, idx, "ab")
    with pytest.raises(ValueError, match="row_index must be"):
        embedding_lookup(embed, idx, ["a", "b"], row_index=1)
    with pytest.raises(ValueError, match="scale=True"):
        embedding_lookup(TokenEmbedding(10, 4, scale=True), idx, ["a", "b"])


# --- bert_input ------------------------------------------------------------------------------

def _pair(T_a: int = 3, T_b: int = 2) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    ids = torch.arange(5, 5 + T_a + T_b + 3).unsqueeze(0)
    types = torch.tensor([[0] * (T_a + 2) + [1] * (T_b + 1)])
    tokens = ["[CLS]"] + [f"a{i}" for i in range(T_a)] + ["[SEP]"] + \
        [f"b{i}" for i in range(T_b)] + ["[SEP]"]
    return ids, types, tokens


@pytest.mark.parametrize("cls", [Bert, BertForMaskedLM])
def test_bert_input_labels_are_traced(cls) -> None:
    config = BertConfig.tiny()
    model = cls(config).eval()
    ids, types, tokens = _pair()
    d = bert_input(model, ids, types, tokens)
    labels = _labels(d)
    emb = model.embeddings if cls is Bert else model.bert.embeddings
    with torch.no_grad():
        out = emb(ids, types)
    for key in ("token_emb", "type_emb", "pos_emb", "norm"):
        assert numbers(labels[key]) == tuple(out.shape) == (1, 8, config.d_model)
    inputs = {k: numbers(labels[k].split(" ", 1)[1]) for k in ("token_ids", "type_ids")}
    assert inputs["token_ids"] == inputs["type_ids"] == tuple(ids.shape)
    texts = svg_texts(d.svg)
    assert f"E: (V, C) = ({config.vocab_size}, {config.d_model})" in texts
    assert any(f"(T_max, C) = ({config.max_len}, {config.d_model})" in t for t in texts)
    assert [labels[f"type.{t}"] for t in range(8)] == [str(g) for g in types[0].tolist()]
    assert [labels[f"position.{t}"] for t in range(8)] == [str(t) for t in range(8)]
    assert [labels[f"token.{t}"] for t in range(8)] == tokens


def test_bert_input_changes_with_the_config_and_input() -> None:
    ids, types, tokens = _pair()
    small = bert_input(Bert(BertConfig.tiny()).eval(), ids, types, tokens)
    wide = bert_input(Bert(BertConfig(vocab_size=100, max_len=16, n_layers=1, n_heads=2,
                                      d_model=48, d_ff=32)).eval(), ids, types, tokens)
    assert _labels(small)["norm"] != _labels(wide)["norm"] == "(B, T, C) = (1, 8, 48)"
    longer = bert_input(Bert(BertConfig.tiny()).eval(), *_pair(5, 4))
    assert numbers(_labels(longer)["token_emb"])[1] == 12 and "position.11" in _labels(longer)


def test_bert_input_escapes_and_refuses() -> None:
    model = Bert(BertConfig.tiny()).eval()
    ids, types, _ = _pair(3, 2)
    tokens = ["[CLS]", "<b>", "&amp;", '"', "[SEP]", "</svg>", "'", "[SEP]"]
    d = bert_input(model, ids, types, tokens)
    assert "<b>" not in d._repr_html_()
    texts = svg_texts(d.svg)
    for token in tokens:
        assert token in texts
    with pytest.raises(ValueError, match="must have the shape of input_ids"):
        bert_input(model, ids, types[:, :3], tokens)
    with pytest.raises(TypeError, match="token_type_ids must be an integer"):
        bert_input(model, ids, types.float(), tokens)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        bert_input("bert", ids, types, tokens)
    with pytest.raises(ValueError, match="no BertEmbeddings"):
        bert_input(torch.nn.Embedding(100, 4), ids, types, tokens)


def test_lookup_colours_pair_each_id_and_a_phone_sees_o_e_and_x() -> None:
    """An id's 1 in O, its row of E and the rows of X that copy it share one colour (so "The"
    pairs with its own id's row, not with the row drawn beside it), and the phone's layout,
    O then E then X, shows the same labels within a 358 px column."""
    import re

    embed = TokenEmbedding(500, 24)
    idx = torch.tensor([[7, 300, 7, 41, 499]])
    d = embedding_lookup(embed, idx, ["a", " b", "a", "c", "d"])
    colour_of: dict[str, set[str]] = {}
    swatches = re.findall(r'class="sw" x="([\d.]+)" y="([\d.]+)"[^>]*style="fill:(#[0-9a-f]+);'
                          r'fill-opacity:([\d.]+)[^>]*/>(?:<text[^>]*>([^<]*)</text>)?', d.svg)
    for _x, _y, fill, opacity, text in swatches:
        colour_of.setdefault(fill + opacity, set()).add(text)
    # one colour per id: its E row and its X rows under it (the 1s of O carry the same colour)
    for v in (7, 41, 300, 499):
        group = next(g for g in colour_of.values() if f"row {v}" in g)
        assert group - {"1"} == {f"row {v}", f"E[{v}]"}
    assert len(colour_of) == 4
    assert max(d.phone_widths) <= 358
    narrow = {lb.key: lb.text for lb in d.narrow_labels if lb.key}
    assert narrow == {lb.key: lb.text for lb in d.labels if lb.key}


def test_bert_input_is_wired_as_it_runs() -> None:
    """Token and type embeddings are added first; the position layer adds P's rows to that
    sum; then LayerNorm: the drawing's arrows are those of the traced pass."""
    torch.manual_seed(0)
    bert = Bert(BertConfig.tiny()).eval()
    ids = torch.randint(0, 100, (1, 6))
    d = bert_input(bert, ids, torch.zeros_like(ids), [str(i) for i in range(6)])
    assert d.wired
    assert ("embeddings.token", "embeddings.position:x") in d.edges
    assert ("embeddings.token_type", "embeddings.position:x") in d.edges
    assert ("embeddings.position", "embeddings.norm") in d.edges
    assert max(d.phone_widths) <= 358
