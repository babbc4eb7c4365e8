"""tfbook.diagrams: every shape on a drawing is the real tensor's; configs change drawings."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch

import tests.diagram_helpers as helpers
from tfbook.attention import MultiHeadAttention
from tfbook.blocks import BlockConfig, SelfAttentionBlock
from tfbook.diagrams import (
    Canvas,
    Diagram,
    attention_path,
    block,
    blocks_side_by_side,
    cross_attention,
    decoder_stack,
    encoder_decoder,
    encoder_stack,
    escape,
    families,
    ffn,
    ffns_side_by_side,
    head_split,
    masks,
    shape_label,
    trace,
    trace_attention,
)
from tfbook.masks import causal_mask, padding_mask
from tfbook.models.bert import Bert, BertConfig
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.transformer import Transformer, TransformerConfig

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = ["<script>alert(1)</script>", "&amp;", '"onload="x', "</svg>", "a\nb", " "]


def numbers(label: str) -> tuple[int, ...]:
    """(B, T, C) = (1, 9, 64) -> (1, 9, 64)."""
    match = re.search(r"\(([^)]*)\) = \(([^)]*)\)$", label)  # a shape, maybe after words
    assert match, label
    letters = [s for s in match.group(1).split(", ") if s.strip(",")]
    sizes = tuple(int(s) for s in match.group(2).rstrip(",").split(", "))
    assert len(letters) == len(sizes), label
    return sizes


def svg_texts(diagram: Diagram) -> list[str]:
    """Every <text> of the SVG, parsed as XML (so the escaping must be right)."""
    return helpers.svg_texts(diagram.svg)


def check_labels(diagram: Diagram) -> None:
    """Each shape label's numbers are its traced shape, and every label is in the SVG."""
    texts = svg_texts(diagram)
    for label in diagram.labels:
        assert label.text in texts, label
        if label.key and label.shape is not None:
            if " = (" in label.text:
                assert numbers(label.text) == label.shape, label
            else:  # a count: "H = 4 heads", "2 ×"
                found = tuple(int(n) for n in re.findall(r"\d+", label.text))
                assert label.shape == found[:len(label.shape)], label


def shapes(d: Diagram) -> dict[str, tuple[int, ...]]:
    """key -> traced sizes of every shape label of a diagram."""
    return {k: numbers(v) for k, v in d.shape_labels.items() if " = (" in v}


def gpt(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(GPTConfig.tiny(), **changes)).eval()


IDX = torch.tensor([list(b"The cat s")])  # (1, 9)


def test_decoder_stack_labels_are_the_models_tensors() -> None:
    model = gpt()
    d = decoder_stack(trace(model, IDX))
    check_labels(d)
    out = model(IDX, need_weights=True)
    labels = shapes(d)
    assert labels["ids"] == tuple(IDX.shape)
    assert labels["tok_emb"] == tuple(model.tok_emb(IDX).shape)
    assert labels["logits"] == tuple(out.logits.shape) == (1, 9, 256)
    for i in range(model.config.n_layers):
        assert labels[f"blocks.{i}"] == (1, 9, model.config.d_model)
    # the tie is drawn because the matrix is one object, and its size is the parameter's
    assert model.lm_head.weight is model.tok_emb.weight and "tied:" in svg_texts(d)
    assert f"E: (V, C) = {tuple(model.tok_emb.weight.shape)}" in svg_texts(d)
    untied = decoder_stack(trace(gpt(tie_weights=False), IDX))
    assert "tied:" not in svg_texts(untied)
    # blocks are counted from 0, as in the code (blocks.0) and the notation appendix
    assert [t for t in svg_texts(d) if t.startswith("block ")] == ["block 0", "block 1"]
    # the tie is a dashed link without an arrowhead: nothing flows from the logits into E
    assert d.wired and ("lm_head", "tok_emb") not in d.edges
    assert ("tok_emb", "pos_emb") in d.edges and ("blocks.1", "norm_f") in d.edges
    # with targets, the loss is computed from the logits and the targets
    targets = torch.roll(IDX, -1, 1)
    with_loss = decoder_stack(trace(model, IDX, targets), inputs=list("The cat s"),
                              targets=list("he cat sa"))
    assert {("lm_head", "loss"), ("targets", "loss")} <= set(with_loss.edges)


def test_attention_labels_equal_hand_computed_shapes() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(48, 6, n_kv_heads=2).eval()
    x = torch.randn(2, 5, 48)
    tr = trace(mha, x, causal=True)
    at = tr.attention("")
    q = mha.split_heads(mha.q_proj(x))
    k = mha.split_heads(mha.k_proj(x), 2)
    _, weights = mha(x, causal=True, need_weights=True)
    assert at.q == tuple(q.shape) == (2, 6, 5, 8)
    assert at.k == at.v == tuple(k.shape) == (2, 2, 5, 8)
    assert at.weights == tuple(weights.shape) and at.masked
    for d in (attention_path(at), head_split(tr, "")):
        check_labels(d)
        labels = shapes(d)
        assert labels["q"] == tuple(q.shape) and labels["k"] == tuple(k.shape)
        assert labels["weights"] == tuple(weights.shape)
    assert "(B, H_kv, S, D) = (2, 2, 5, 8)" in head_split(tr, "").shape_labels.values()
    # the trace leaves the module as it found it: no hooks, the class's split_heads
    assert "split_heads" not in vars(mha)
    assert not mha._forward_hooks and not mha._forward_pre_hooks


def test_bare_function_trace() -> None:
    x = torch.randn(6, 16)
    w = tuple(torch.randn(3, 16, 8).unbind(0))
    q, k, v = (x @ m for m in w)
    at = trace_attention(q, k, v, x=x, projections=w)
    d = attention_path(at)
    check_labels(d)
    assert d.shape_labels["weights"] == "(T, S) = (6, 6)"
    assert d.shape_labels["heads"] == "(T, D) = (6, 8)"
    assert d.shape_labels["x"] == "(T, C) = (6, 16)"
    assert "none in this call" in svg_texts(d)
    masked = attention_path(trace_attention(q, k, v, causal_mask(6, 6)))
    assert "none in this call" not in svg_texts(masked)
    # X -> Q, K, V are drawn only when the call says how q, k, v were made from X
    with pytest.raises(ValueError, match="give x together with projections"):
        trace_attention(q, k, v, x=x)
    with pytest.raises(ValueError, match="are not the q, k, v given"):
        trace_attention(k, q, v, x=x, projections=w)


@pytest.mark.parametrize("change, expect", [
    ({"n_layers": 3}, "block 2"),
    ({"n_heads": 8}, "H = 8 heads"),
    ({"n_kv_heads": 2}, "H_kv = 2"),
    ({"d_model": 96}, "(B, T, C) = (1, 9, 96)"),
])
def test_changing_the_config_changes_the_drawing(change: dict, expect: str) -> None:
    base = gpt()
    changed = gpt(**change)
    figures = [
        lambda m: decoder_stack(trace(m, IDX)),
        lambda m: head_split(trace(m, IDX), "blocks.0.attn"),
        lambda m: block(trace(m, IDX), "blocks.0"),
    ]
    before = [f(base) for f in figures]
    after = [f(changed) for f in figures]
    assert after[0].svg != before[0].svg  # the whole model always shows the change
    assert any(any(expect in t for t in svg_texts(d)) for d in after), expect
    assert not any(any(expect in t for t in svg_texts(d)) for d in before), expect
    for d in after:
        check_labels(d)


def test_head_split_draws_one_slice_per_head() -> None:
    for heads, kv in ((2, 2), (4, 4), (8, 8), (8, 2)):
        d = head_split(trace(gpt(n_heads=heads, n_kv_heads=kv), IDX), "blocks.0.attn")
        slices = [el for el in ET.fromstring(d.svg).iter(f"{SVG}rect")
                  if el.get("class") == "sw"]
        # Q, its heads, the heads' outputs, the merge: one per query head; one per K, V head
        assert len(slices) == 4 * heads + kv


def test_blocks_pre_and_post() -> None:
    cfg = BlockConfig(d_model=32, n_heads=4, d_ff=128, dropout=0.0)
    pre = SelfAttentionBlock(replace(cfg, norm_first=True)).eval()
    post = SelfAttentionBlock(cfg).eval()
    x = torch.randn(2, 6, 32)
    d = blocks_side_by_side((trace(pre, x), ""), (trace(post, x), ""))
    check_labels(d)
    assert d.shape_labels["pre.ff"] == "(B, T, C) = (2, 6, 32)"
    assert "F = 128 hidden units" in svg_texts(d)  # the FFN's traced hidden width
    with pytest.raises(ValueError, match="pre must be a pre-LN block"):
        blocks_side_by_side((trace(post, x), ""), (trace(pre, x), ""))
    sw = SelfAttentionBlock(replace(cfg, norm_first=True, ffn="swiglu", norm="rms",
                                    activation="silu")).eval()
    tsw = trace(sw, x)
    assert "RMSNorm" in svg_texts(block(tsw, "")) and "FFN (SwiGLU)" in svg_texts(block(tsw, ""))
    f = ffns_side_by_side((trace(pre, x), "ff"), (tsw, "ff"))
    check_labels(f)
    assert f.shape_labels["swiglu.ff.fc_gate"] == "(B, T, F) = (2, 6, 128)"
    assert "W_gate" not in svg_texts(ffn(trace(pre, x), "ff"))
    assert "MLP: relu(x W1) W2" in svg_texts(f)  # the module's own activation (subscripts)
    assert f.wired and ("swiglu.ff.act", "swiglu.ff.dropout:input") in f.edges
    with pytest.raises(ValueError, match="an MLP .FeedForward. first"):
        ffns_side_by_side((tsw, "ff"), (trace(pre, x), "ff"))
    with pytest.raises(ValueError, match="not a FeedForward or SwiGLU"):
        ffn(tsw, "attn")


def test_encoder_decoder_and_families() -> None:
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.tiny()).eval()
    src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
    tr = trace(model, src, tgt)
    out = model(src, tgt, need_weights=True)
    d = encoder_decoder(tr)
    check_labels(d)
    labels = shapes(d)
    assert labels["cross"] == tuple(out.cross_attentions[0].shape) == (2, 4, 5, 7)
    assert labels["dec_self"] == tuple(out.attentions[0].shape)
    assert labels["enc_weights"] == tuple(out.encoder_attentions[0].shape)
    assert labels["logits"] == tuple(out.logits.shape)
    assert labels["memory"] == tuple(model.encode(src)[0].shape)
    assert d.shape_labels["n_enc"] == "2 ×"
    # the residual skips into each add & norm, and the memory into the cross-attention
    memory = "encoder_norm" if model.encoder_norm is not None else "encoder.1"
    assert d.wired and {("pos_enc", "encoder.0.norm1"), ("encoder.0.norm1", "encoder.0.norm2"),
                        ("pos_enc#1", "decoder.0.norm1"), ("decoder.0.norm2", "decoder.0.norm3"),
                        (memory, "decoder.0.cross_attn")} <= set(d.edges)
    deeper = encoder_decoder(trace(Transformer(replace(TransformerConfig.tiny(),
                                                       n_decoder_layers=3)).eval(), src, tgt))
    assert deeper.shape_labels["n_dec"] == "3 ×"
    dec_block = block(tr, "decoder.0")
    check_labels(dec_block)
    assert shapes(dec_block)["decoder.0.memory"] == labels["memory"]
    assert shapes(dec_block)["decoder.0.cross_attn"] == (2, 5, 32)
    c = cross_attention(tr.attention("decoder.1.cross_attn"))
    check_labels(c)
    assert c.shape_labels["source"] == "(B, S, C) = (2, 7, 32)"
    with pytest.raises(ValueError, match="self-attention, not cross-attention"):
        cross_attention(tr.attention("decoder.0.self_attn"))
    bert = Bert(BertConfig.tiny()).eval()
    ids = torch.randint(0, 100, (1, 9))
    e = encoder_stack(trace(bert, ids))
    assert numbers(e.shape_labels["blocks"]) == tuple(bert(ids).last_hidden_state.shape)
    fam = families(trace(bert, ids), trace(gpt(), IDX), tr)
    check_labels(fam)
    assert fam.shape_labels["decoder.logits"] == "(B, T, V) = (1, 9, 256)"
    assert fam.shape_labels["encdec.logits"] == "(B, T, V) = (2, 5, 50)"


def test_masks_draw_the_real_cells() -> None:
    pad = padding_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]).bool())
    d = masks([("causal", causal_mask(3, 3)), ("padding", pad)], tokens=["a", "b", "c"])
    check_labels(d)
    assert d.shape_labels["mask1"] == f"(B, H, T, S) = {tuple(pad.shape)}"
    cells = [el for el in ET.fromstring(d.svg).iter(f"{SVG}rect") if "fill-opacity:0.79" in
             el.get("style", "")]
    assert len(cells) == 6 + 2  # 6 visible pairs of the causal 3 x 3, 2 real keys of row 0
    with pytest.raises(ValueError, match="boolean tensor"):
        masks([("float", torch.ones(3, 3))])


def test_masks_name_their_axes_pads_and_empty_rows() -> None:
    """Queries down, keys across, both labelled; a key no query may read is a pad; a query
    that may read nothing is outlined as reading nothing (its output is zero)."""
    from tfbook.masks import combine_masks

    left_pad = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    both = combine_masks(causal_mask(4), padding_mask(left_pad))  # (B, 1, 4, 4)
    d = masks([("causal AND padding", both, 1)])
    texts = svg_texts(d)
    assert {"query ↓", "key →", "pads", "reads nothing:", "output 0"} <= set(texts)
    assert "batch row 1 (from 0)" in texts and d.shape_labels["mask0"].startswith("(B, H, T, S)")
    outlined = [el for el in ET.fromstring(d.svg).iter(f"{SVG}rect")
                if "dash" in el.get("class", "")]
    assert len(outlined) == int((~both[1, 0].any(-1)).sum()) == 2  # rows 0 and 1 read nothing
    full = masks([("causal", causal_mask(4))], tokens=["a", "b", "c", "d"], self_attention=True)
    texts = svg_texts(full)
    assert full.shape_labels["mask0"] == "(T, T) = (4, 4)" and "pads" not in texts
    assert texts.count("a") == 2  # the token labels both its row (query) and its column (key)
    assert "reads nothing:" not in texts
    with pytest.raises(TypeError, match="list of str"):
        masks([("causal", causal_mask(3, 3))], tokens=[1, 2, 3])


def test_hostile_text_is_escaped() -> None:
    tr = trace(gpt(), IDX)
    d = decoder_stack(tr, inputs=HOSTILE, targets=HOSTILE[1:] + ["x"])
    root = ET.fromstring(d.svg)  # parses: nothing broke out of its element
    assert not any(el.tag.endswith("script") for el in root.iter())
    assert "<script" not in d.svg and "</svg>" not in d.svg[:-6]
    texts = svg_texts(d)
    assert "<script>alert(1)</script>" in texts and "&amp;amp;" in d.svg
    assert "a\\nb" in texts and "␣" in texts  # a newline and a space made visible
    m = masks([("<b>causal</b>", causal_mask(2, 2))], tokens=["<i>", "&"])
    assert "<i>" in svg_texts(m) and "<b>causal</b>" in svg_texts(m)
    c = Canvas('"><script>')
    c.box(0, 0, 10, 10)
    assert '"><script>' not in c.render() and escape("<") == "&lt;"


def test_bad_input_is_refused() -> None:
    tr = trace(gpt(), IDX)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        trace("model")
    with pytest.raises(TypeError, match="must be a tfbook.diagrams.Trace"):
        decoder_stack({"not": "a trace"})
    with pytest.raises(TypeError, match="expected an AttentionTrace"):
        attention_path(tr)
    with pytest.raises(ValueError, match="no module 'blocks.9' ran"):
        tr.shape("blocks.9")
    with pytest.raises(ValueError, match="not a MultiHeadAttention"):
        tr.attention("blocks.0")
    with pytest.raises(ValueError, match="not a SelfAttentionBlock"):
        block(tr, "norm_f")
    with pytest.raises(ValueError, match="draws a Transformer"):
        encoder_decoder(tr)
    with pytest.raises(TypeError, match="list of str"):
        decoder_stack(tr, inputs="abc", targets=["a"])
    with pytest.raises(ValueError, match="3 legend letters"):
        shape_label(("B", "T", "C"), (1, 9))
    with pytest.raises(TypeError, match="tuple of ints"):
        shape_label(("B",), [1])
    with pytest.raises(TypeError, match="must be a str"):
        Canvas("t").text(0, 0, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not legible"):
        Canvas("t").text(0, 0, "tiny", size=8)
    with pytest.raises(ValueError, match="box kind"):
        Canvas("t").box(0, 0, 1, 1, kind="neon")
    with pytest.raises(ValueError, match="is empty"):
        Canvas("t").render()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        trace_attention([1.0], torch.ones(1, 1), torch.ones(1, 1))


def test_html_scales_inside_its_own_box() -> None:
    d = decoder_stack(trace(gpt(), IDX))
    html = d._repr_html_()
    assert html.startswith('<div class="tfbook-diagram" style="overflow-x:auto')
    root = ET.fromstring(d.svg)
    style = root.get("style")
    assert "width:100%" in style and "height:auto" in style
    width = float(root.get("viewBox").split()[2])
    assert f"max-width:{width:g}px" in style.replace(".0px", "px")
    assert root.find(f"{SVG}title").text == d.title
    # a drawing of panels shows each as its own SVG, which wrap on a narrow page
    pad = padding_mask(torch.tensor([[0, 1, 1]]).bool())
    m = masks([("causal", causal_mask(3, 3)), ("padding", pad)])
    html = m._repr_html_()
    assert html.count("<svg") == 2 and "flex-wrap:wrap" in html
    assert m.svg.count("<svg") == 1  # .svg is one drawing with both panels

@pytest.mark.parametrize("module", ["svg", "layout"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"tfbook.diagrams.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_trace_follows_a_decode_step_through_the_cache():
    """On a cached decode step the weights span every stored key: k and v are drawn so."""
    from tfbook.diagrams import trace
    from tfbook.models.gpt import GPT
    from tfbook.models.llama import tiny_llama

    torch.manual_seed(0)
    model = GPT(tiny_llama()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 5))
    cache = model.new_cache(6)
    trace(model, prompt, cache=cache)
    tr = trace(model, prompt[:, -1:], cache=cache)  # one new token against 6 cached keys
    at = tr.attention(tr.names("MultiHeadAttention")[0])
    B, H, T, S = at.weights
    assert (T, S) == (1, 6) and at.q[2] == 1
    assert at.k[2] == at.v[2] == 6 and at.k[1] == model.config.n_kv_heads
    assert at.heads == (B, H, 1, at.q[3])


def test_head_split_on_smollm2_shapes_joins_each_query_head_to_its_kv_head() -> None:
    from tfbook.models.llama import smollm2_135m

    cfg = replace(smollm2_135m(), n_layers=1, vocab_size=256)  # SmolLM2's attention shapes
    torch.manual_seed(0)
    tr = trace(GPT(cfg).eval(), IDX)
    d = head_split(tr, "blocks.0.attn")
    check_labels(d)
    H, H_kv = cfg.n_heads, cfg.n_kv_heads
    assert d.shape_labels["n_kv_heads"] == (f"H_kv = {H_kv} heads, each read by "
                                            f"{H // H_kv} query heads")
    assert numbers(d.shape_labels["k"])[1] == H_kv and numbers(d.shape_labels["q"])[1] == H
    texts = svg_texts(d)
    # heads counted from 0, as blocks are (and as the model explorer counts them)
    assert [t for t in texts if t.startswith("K, V ")] == [f"K, V {g}" for g in range(H_kv)]
    assert [t for t in texts if t.isdigit()][:H] == [str(h) for h in range(H)]
    # one dashed line from each query head down to the key/value head it reads
    dashed = [el for el in ET.fromstring(d.svg).iter(f"{SVG}polyline")
              if "dash" in el.get("class", "")]
    assert len(dashed) == H
    mqa = head_split(trace(GPT(replace(cfg, n_kv_heads=1)).eval(), IDX), "blocks.0.attn")
    assert "H_kv = 1 head, each read by 9 query heads" in svg_texts(mqa)
    # SmolLM2's drawing fits the book's column at 1,280 px (672 px) without scrolling
    assert d.svg.count("min-width:") == 1
    assert float(d.svg.split("min-width:")[1].split("px")[0]) <= 672


def test_attention_input_is_written_x_as_in_the_notation() -> None:
    """The book writes X for the stacked input of attention (appendix, notation)."""
    tr = trace(gpt(), IDX)
    at = tr.attention("blocks.0.attn")
    for d in (head_split(tr, "blocks.0.attn"), attention_path(at)):
        texts = svg_texts(d)
        assert "input X" in texts and "input x" not in texts
        assert not any("x W_" in t for t in texts)


def test_rope_angle_labels_keep_their_distance() -> None:
    from tfbook.diagrams.positions import LABEL_GAP, rope_planes
    from tfbook.diagrams.svg import SMALL, text_width

    d = rope_planes(16, (0, 1, 2, 5, 30), (0, 1, 7))
    root = ET.fromstring(d.svg)
    by_row: dict[float, list[tuple[float, str]]] = {}
    for el in root.iter(f"{SVG}text"):
        if (el.text or "").endswith(" rad"):
            by_row.setdefault(float(el.get("y")), []).append((float(el.get("x")), el.text))
    assert len(by_row) == 3 and all(len(r) == 5 for r in by_row.values())
    for labels in by_row.values():
        labels.sort()
        for (x0, a), (x1, b) in zip(labels, labels[1:], strict=False):
            room = x1 - x0 - (text_width(a, SMALL) + text_width(b, SMALL)) / 2
            assert room >= LABEL_GAP - 1e-9, (a, b, room)
    # the chapter's drawing fits the book's column at 1,280 px (672 px) without scrolling
    assert float(d.svg.split("min-width:")[1].split("px")[0]) <= 672
