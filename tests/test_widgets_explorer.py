"""The model explorer: forward hooks take the right tensors of a GPT and a Llama-style model,
the diagram follows the config and its arrows are the computation's data dependencies,
hostile text stays text, bad input is a clear error."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from tfbook.diagrams.dataflow import Dataflow, Recorder, check_edges
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.widgets import ModelExplorer
from tfbook.widgets.explorer import (
    FONT_PX,
    box_hooks,
    box_texts,
    cut_note,
    explorer_layout,
    sizes,
    stream_keys,
    stream_label,
    stream_norms,
    top_next_tokens,
    trace_decoder,
)
from tfbook.widgets.page_model import export_page_model, payload_json

HOSTILE = '<img src=x onerror=alert(1)> </script><!--<script> "%3C" 100%'
BYTES = BPETokenizer({})  # plain bytes: 256 ids


def gpt(**changes) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(GPTConfig.tiny(), max_len=32, **changes)).eval()


def llama() -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_llama()).eval()


def label_shape(box: dict, n: dict[str, int], T: int) -> tuple[int, ...]:
    """The sizes a box's shape label names, for T tokens."""
    return tuple(T if d == "T" else n[d] for d in box["shape"])


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_hooks_take_every_boxs_tensor(make) -> None:
    model = make()
    ids = BYTES.encode_ordinary("the cat sat.")
    T, n = len(ids), sizes(model.config)
    trace = trace_decoder(model, ids)
    layout = explorer_layout(model.config)
    assert set(trace) == {b["key"] for b in layout["boxes"]}
    for box in layout["boxes"]:  # every shape label of the diagram is the traced tensor's
        shape = tuple(trace[box["key"]].shape)
        dims = label_shape(box, n, T)
        if box["kind"] == "head":  # one head's slice of (T, H D) or (T, H_kv D)
            heads = n["H"] if box["key"].endswith(".q") else n["H_kv"]
            assert shape == (T, heads * n["D"]) and dims == (T, n["D"]), box
        elif box["kind"] == "weights":  # one head of (H, T, T)
            assert shape == (n["H"], T, T) and dims == (T, T), box
        else:
            assert shape == dims, box
    assert not any(m._forward_hooks for m in model.modules())  # the hooks are gone
    with torch.no_grad():
        out = model(torch.tensor([ids]), need_weights=True)
        x = model.tok_emb(torch.tensor([ids]))[0]
    assert torch.allclose(trace["logits"], out.logits[0], atol=1e-6, rtol=0)
    for layer, w in enumerate(out.attentions):
        assert torch.equal(trace[f"blocks.{layer}.attn.weights"], w[0])
    block = model.blocks[0]
    with torch.no_grad():  # each box is what its module computes from the box before it
        assert torch.equal(trace["tok_emb"], x)
        assert torch.equal(trace["blocks.0.norm1"], block.norm1(trace["embed"]))
        assert torch.equal(trace["blocks.0.attn.q"], block.attn.q_proj(trace["blocks.0.norm1"]))
        assert torch.equal(trace["blocks.0.attn.v"], block.attn.v_proj(trace["blocks.0.norm1"]))
        assert torch.equal(trace["blocks.0.resid1"], trace["embed"] + trace["blocks.0.attn"])
        assert torch.equal(trace["blocks.0.norm2"], block.norm2(trace["blocks.0.resid1"]))
        assert torch.equal(trace["blocks.0.ff"], block.ff.fc_out(trace["blocks.0.ff.hidden"]))
        assert torch.equal(trace["blocks.0.resid2"],
                           trace["blocks.0.resid1"] + trace["blocks.0.ff"])
        assert torch.equal(trace["blocks.1.norm1"], model.blocks[1].norm1(trace["blocks.0.resid2"]))
        assert torch.equal(trace["norm_f"], model.norm_f(trace["blocks.1.resid2"]))
    w = trace["blocks.1.attn.weights"]  # causal rows of probabilities
    assert torch.allclose(w.sum(-1), torch.ones(n["H"], T), atol=1e-6)
    assert torch.equal(w.triu(1), torch.zeros_like(w))
    if model.pos_emb is not None:
        assert torch.equal(trace["pos_emb"], model.pos_emb.weight[:T])
        assert torch.equal(trace["embed"], trace["tok_emb"] + trace["pos_emb"])
    else:  # RoPE: no position box, x_0 is the embedding; k and v have H_kv heads
        assert "pos_emb" not in trace and torch.equal(trace["embed"], trace["tok_emb"])
        assert trace["blocks.0.attn.k"].shape == (T, 2 * n["D"])
        assert trace["blocks.0.ff.hidden"].shape == (T, 96)  # SwiGLU: act(gate) * up


def box_flow(model: GPT, ids: list[int]) -> Dataflow:
    """One forward pass recorded as a graph of named tensors (tfbook.diagrams.dataflow: which
    tensor was computed from which), each box's tensor named "[key]" by the explorer's own
    hooks (box_hooks) as the pass makes it; `name` gives the few others."""
    with torch.no_grad(), Recorder(model) as recorder:
        if model.pos_emb is not None:
            recorder.name(model.pos_emb.weight, "[pos_emb]")

        def keep(key: str, tensor: torch.Tensor) -> None:
            if key != "pos_emb" and name(key) == f"[{key}]":  # pos_emb: P, named above
                recorder.name(tensor, f"[{key}]")

        with box_hooks(model, keep):
            model(torch.tensor([ids]), need_weights=True)
    return recorder.flow


def name(key: str) -> str:
    """A box's tensor in box_flow's graph. Boxes whose hook sees their tensor only after the
    model has used it take the recorder's name, given as the pass makes the tensor: the
    stream after attention is norm 2's input, the FFN's hidden units are the input of its
    output layer, and the weights are attention's softmax (the same values as the box's: a
    causal mask hides no whole row). The position box shows rows of the table P: P itself."""
    if key.startswith("blocks."):
        block = ".".join(key.split(".")[:2])
        if key.endswith(".resid1"):
            return f"{block}.norm2:x"
        if key.endswith(".ff.hidden"):
            return f"{block}.ff.fc_out:input"
        if key.endswith(".attn.weights"):
            return f"{block}.attn.weights"
    return f"[{key}]"


def drawn(edges: list[list[str]]) -> list[tuple[str, str]]:
    """The layout's arrows in box_flow's names."""
    return [(name(a), name(b)) for a, b in edges]


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_every_arrow_is_a_data_dependency_and_every_dependency_is_drawn(make) -> None:
    """The diagram's arrows (explorer_layout's edges, which explorer.js draws one by one) are
    exactly the dependencies between the boxes' tensors in the traced forward pass: norm 1
    feeds q, k and v; q and k the weights; the weights and v the attention output; each norm
    reads the stream, and each circle adds a sub-layer's output to the stream before it.
    (RoPE's x^(0) is the token embedding itself: an arrow between two names of one tensor.)"""
    model = make()
    flow = box_flow(model, BYTES.encode_ordinary("the cat sat."))
    edges = explorer_layout(model.config)["edges"]
    check_edges(drawn(edges), flow)  # raises on a wrong or a missing arrow
    p = "blocks.0."
    for sources, result in [(["norm1"], "attn.q"), (["norm1"], "attn.k"), (["norm1"], "attn.v"),
                            (["attn.q", "attn.k"], "attn.weights"),
                            (["attn.weights", "attn.v"], "attn")]:
        assert {a for a, b in edges if b == p + result} == {p + s for s in sources}
        assert all(flow.depends(name(p + result), name(p + s)) for s in sources)
    assert not flow.depends(name(p + "attn.weights"), name(p + "attn.v"))


def test_the_check_finds_a_wrong_wiring() -> None:
    """The old drawing (norm 1 -> q -> ... -> v -> weights -> attn out, no arrow into k or v)
    is refused, and so is a drawing that leaves one dependency out."""
    model = gpt()
    flow = box_flow(model, BYTES.encode_ordinary("abc"))
    edges = explorer_layout(model.config)["edges"]
    p = "blocks.0."
    old = [e for e in edges if not e[0].startswith(p + "attn.") and e[1] not in (
        p + "attn.q", p + "attn.k", p + "attn.v", p + "attn.weights", p + "attn")]
    old += [[p + "norm1", p + "attn.q"], [p + "attn.v", p + "attn.weights"],
            [p + "attn.weights", p + "attn"]]
    with pytest.raises(ValueError, match=r"wrong: \[blocks.0.attn.v\] -> "
                                         r"blocks.0.attn.weights \("):
        check_edges(drawn(old), flow)
    without_v = [e for e in edges if e != [p + "attn.v", p + "attn"]]
    with pytest.raises(ValueError,  # named by the modules whose outputs they are
                       match=r"missing: blocks.0.attn.v_proj -> blocks.0.attn.out_proj$"):
        check_edges(drawn(without_v), flow)


def test_the_diagram_fits_a_phone_and_names_each_box_with_its_block() -> None:
    """q, k and v stacked: the diagram of the trained GPT's shape and of SmolLM2's fits the
    358 px of a phone's column, so it never scrolls sideways past the stream. Every box has
    a name with its block, an explanation and a formula whose markup is balanced."""
    smol_like = replace(tiny_llama(), n_layers=30, d_model=576, n_heads=9, n_kv_heads=3,
                        d_ff=1536, vocab_size=49152, max_len=8192)
    for config in (replace(GPTConfig.tiny(), vocab_size=2048), smol_like):
        layout = explorer_layout(config)
        assert layout["width"] <= 358, layout["width"]
        boxes = {b["key"]: b for b in layout["boxes"]}
        q, k, v = (boxes[f"blocks.1.attn.{x}"] for x in "qkv")
        assert q["x"] == k["x"] == v["x"] and q["y"] < k["y"] < v["y"]  # one column
        assert q["name"] == "block 1, q"
        for b in layout["boxes"]:
            assert b["about"] and b["formula"] and b["colour"].startswith("#")
            if b["layer"] >= 0:
                assert b["name"].startswith(f"block {b['layer']}, "), b
            plain = re.sub(r"[_^]\{[^{}]*\}", "", b["formula"])
            assert "{" not in plain and "}" not in plain and "_" not in plain, b["formula"]
        names = [b["name"] for b in layout["boxes"]]
        assert len(set(names)) == len(names)  # a screen reader tells every box apart
    assert box_texts("blocks.2.attn.k", smol_like)["formula"] == "K = X W_{K}^{g(h)}"
    assert "RMSNorm" in box_texts("norm_f", smol_like)["formula"]
    assert box_texts("blocks.0.ff.hidden", smol_like)["formula"] == "SiLU(X W_{gate}) ⊙ (X W_{1})"
    with pytest.raises(ValueError, match="unknown box 'blocks.0.nowhere'"):
        box_texts("blocks.0.nowhere", smol_like)
    with pytest.raises(TypeError, match="key must be a box's key"):
        box_texts(3, smol_like)


def test_stream_norms_and_top_tokens() -> None:
    model = gpt()
    ids = BYTES.encode_ordinary("abc")
    trace = trace_decoder(model, ids)
    norms = stream_norms(trace, 2)
    assert stream_keys(2) == ["embed", "blocks.0.resid1", "blocks.0.resid2", "blocks.1.resid1",
                              "blocks.1.resid2"]
    assert norms.shape == (5, 3)
    assert torch.allclose(norms[2], trace["blocks.0.resid2"].norm(dim=-1))
    ids_, probs = top_next_tokens(trace["logits"], 5)
    full = torch.softmax(trace["logits"].double(), -1)
    assert torch.equal(ids_[:, 0], full.argmax(-1)) and probs.shape == (3, 5)
    assert torch.all(probs[:, :-1] >= probs[:, 1:])  # most likely first


def test_layout_follows_the_config() -> None:
    small = explorer_layout(GPTConfig.tiny())
    deep = explorer_layout(replace(GPTConfig.tiny(), n_layers=5))
    rope = explorer_layout(tiny_llama())
    per_block = 11  # 6 attention boxes, 3 FFN boxes, 2 additions to the stream
    assert len(small["boxes"]) == 3 + 2 * per_block + 2  # tok, pos, x0, ..., norm, logits
    assert len(deep["boxes"]) == 3 + 5 * per_block + 2 and deep["height"] > small["height"]
    assert len(rope["boxes"]) == 2 + 2 * per_block + 2 and rope["sizes"]["H_kv"] == 2
    assert small["sizes"] == {"C": 64, "H": 4, "H_kv": 4, "D": 16, "F": 256, "V": 256, "L": 2,
                              "T_max": 64}
    keys = [b["key"] for b in small["boxes"]]
    assert len(set(keys)) == len(keys)
    for a, b in small["edges"]:
        assert a in keys and b in keys
    rows = {}  # boxes of one row do not overlap
    for b in small["boxes"]:
        rows.setdefault(b["y"], []).append((b["x"], b["x"] + b["w"]))
    for spans in rows.values():
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))


def test_labels_follow_the_books_notation_and_fit_their_boxes() -> None:
    """x_t is a position's vector in the book, so the stream's states carry a superscript:
    x^(l) enters block l (blocks counted from 0, as the keys count them)."""
    assert [stream_label(p) for p in range(5)] == ["x⁽⁰⁾", "x⁽⁰⁾+a", "x⁽¹⁾", "x⁽¹⁾+a", "x⁽²⁾"]
    assert stream_label(24) == "x⁽¹²⁾"
    smol_like = replace(GPTConfig.tiny(), max_len=8192, d_model=576, n_heads=9, n_kv_heads=3)
    for config in (GPTConfig.tiny(), replace(GPTConfig.tiny(), max_len=8192, d_model=256),
                   smol_like):
        layout = explorer_layout(config)
        labels = {b["key"]: b["label"] for b in layout["boxes"]}
        assert labels["embed"] == "x⁽⁰⁾ = embedding + position"
        assert labels["blocks.1.resid1"] == "x⁽¹⁾ + block 1's attention"
        assert labels["blocks.1.resid2"] == "x⁽²⁾ = … + block 1's FFN"
        assert not any("₀" in label for label in labels.values())
        n = layout["sizes"]
        T = min(n["T_max"], 99)  # labels sized for T up to 99 (the page narrows longer ones)
        assert FONT_PX >= 12  # the book's minimum text size
        for b in layout["boxes"]:
            if b["kind"] == "stream":
                continue
            shape = "(" + ", ".join(str(T if d == "T" else n[d]) for d in b["shape"]) + ")"
            widest = max(len(b["label"]), len(shape))  # 0.6 em a character, 4 px to spare
            assert b["w"] >= 0.6 * FONT_PX * widest + 4, (b, shape)
            assert b["h"] >= 2 * FONT_PX + 6  # a name and a shape label
        # the stream's names, written right of its circle, stay inside the drawing
        for b in layout["boxes"]:
            if b["kind"] == "stream":
                assert b["x"] + b["w"] / 2 + 18 + 0.6 * FONT_PX * len(b["label"]) <= layout["width"]


def test_python_fed_widget_sends_the_selected_box_and_hostile_text_stays_text() -> None:
    model = gpt()
    w = ModelExplorer.from_model(model, BYTES, HOSTILE, box="blocks.0.ff.hidden")
    ids = BYTES.encode_ordinary(HOSTILE)[-32:]  # the context's 32 last
    assert w.dropped == len(HOSTILE) - 32 and w.ids(HOSTILE) == (ids, w.dropped)
    assert w.tokens == [chr(i) for i in ids]  # Python keeps the real text
    state = json.dumps({k: v for k, v in w.get_state().items() if not k.startswith("_")})
    assert "<" not in state and "%3C" in state  # the page gets page_text
    trace = trace_decoder(model, ids)
    data = np.frombuffer(base64.b64decode(w.shown["data"]), dtype="<f4")
    assert w.shown["shape"] == [len(ids), 256]
    assert torch.equal(torch.from_numpy(data.copy()).reshape(len(ids), 256),
                       trace["blocks.0.ff.hidden"])
    assert torch.allclose(torch.tensor(w.norms), stream_norms(trace, 2))
    w._on_front_end_message(w, {"type": "request", "args": {"box": "logits"}}, [])
    assert w.error == "" and w.shown["key"] == "logits" and w.shown["data"] == ""
    w._on_front_end_message(w, {"type": "request", "args": {"text": "x" * 40}}, [])
    assert w.dropped == 8 and len(w.tokens) == 32 and cut_note(40, 32).endswith("first 8 were cut")
    w._on_front_end_message(w, {"type": "request", "args": {"box": "nowhere"}}, [])
    assert "unknown box 'nowhere'" in w.error
    w._on_front_end_message(w, {"type": "request", "args": {"text": "  "}}, [])
    assert "the text box is empty" in w.error


def test_page_model_widget_carries_the_payload() -> None:
    model = gpt(vocab_size=256)
    w = ModelExplorer.from_page_model(model, BYTES, "the cat", dtype="float32")
    assert w.page_model == payload_json(export_page_model(model, BYTES, "float32"))
    assert w.tokens == [] and w.shown == {}  # the page computes
    assert "class PageGPT" in w._esm and "record" in w._esm
    assert w.box == "blocks.0.attn.weights"


def test_bad_input_is_refused() -> None:
    model = gpt()
    with pytest.raises(TypeError, match="model must be a tfbook decoder"):
        ModelExplorer.from_model(torch.nn.Linear(2, 2), BYTES, "hi")
    with pytest.raises(TypeError, match="tokenizer must be a tfbook tokenizer"):
        ModelExplorer.from_model(model, "bytes", "hi")
    with pytest.raises(TypeError, match="text must be a str"):
        ModelExplorer.from_model(model, BYTES, b"hi")
    with pytest.raises(ValueError, match="the text box is empty"):
        ModelExplorer.from_model(model, BYTES, " \n")
    with pytest.raises(ValueError, match="at most 2,000"):
        ModelExplorer.from_model(model, BYTES, "a" * 2001)
    with pytest.raises(ValueError, match="box must be one of the diagram's keys"):
        ModelExplorer.from_model(model, BYTES, "hi", box="blocks.9.norm1")
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 4\), got 4"):
        ModelExplorer.from_model(model, BYTES, "hi", head=4)
    with pytest.raises(ValueError, match="exceed the model's context of 32"):
        trace_decoder(model, [1] * 33)
    with pytest.raises(TypeError, match="ids must be a non-empty list of token ids"):
        trace_decoder(model, "abc")
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        explorer_layout({"d_model": 64})
    with pytest.raises(ValueError, match="dtype must be one of"):
        ModelExplorer.from_page_model(model, BYTES, "hi", dtype="bfloat16")
    with pytest.raises(ValueError, match="the page runs GPTs"):
        ModelExplorer.from_page_model(llama(), BYTES, "hi")
    with pytest.raises(ValueError,
                       match=r"state must be an int >= 0 \(0 is the embedding\), got -1"):
        stream_label(-1)
