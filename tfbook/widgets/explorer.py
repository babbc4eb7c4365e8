"""The model explorer: a decoder's architecture diagram that runs the reader's sentence.

    explorer_layout(config)            -> the boxes and arrows of the diagram (SVG drawn by JS)
    trace_decoder(model, ids)          -> {box key: the tensor it shows}, by forward hooks
    box_hooks(model, keep)             -> those hooks, for a `with` block (keep(key, tensor))
    ModelExplorer.from_page_model(...) -> the small GPT in the page: gpt.js runs the text
    ModelExplorer.from_model(...)      -> any tfbook decoder, fed by Python (Jupyter)

Every box of the diagram names a tensor of one forward pass (B = 1), keyed as the page keys
it (static/gpt.js's `record` hook uses the same names):

    tok_emb, pos_emb, embed                      (T, C)  E[id], P[t], their sum x^(0)
    blocks.i.norm1, .attn.q, .attn.k, .attn.v    (T, C)  (k, v: (T, H_kv D)); one head shown
    blocks.i.attn.weights                        (H, T, T) softmax(q k^T / sqrt(D)), causal
    blocks.i.attn, blocks.i.resid1               (T, C)  attention output, x + attention
    blocks.i.norm2, blocks.i.ff.hidden, .ff      (T, C), (T, F), (T, C)
    blocks.i.resid2                              (T, C)  the stream after the block
    norm_f, logits                               (T, C), (T, V)

A Llama-style model has no pos_emb box (RoPE acts inside attention: its q and k boxes show
the projections before the rotation). Shape legend: T tokens, C width, H heads, D = C / H,
F feed-forward width, V vocabulary, L blocks.

Notation as in the book: x_t is the stream's vector at position t, so the stream's states
are named by a superscript, x^(l) the stream entering block l (blocks and heads counted from
0, as in the code's keys): x^(0) the embedding, x^(l+1) the stream after block l.

Each arrow of the diagram is a data dependency of the forward pass, and each dependency
between two boxes is an arrow (tests/test_widgets_explorer.py holds the layout's edges
against the pass recorded by tfbook.diagrams.dataflow).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import traitlets
from torch import Tensor

from tfbook.diagrams.svg import COLOURS, text_width
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.tokenizers.base import Tokenizer
from tfbook.widgets.base import STATIC, Widget, _text_to_page, bundle, check_typed, page_text
from tfbook.widgets.page_model import (
    check_dtype,
    gpt_js_script_safe,
    page_payload,
    payload_json,
    quantised_reference,
    token_label,
)

MAX_TEXT_CHARS = 2000  # what the text box takes
TOP_N = 10  # next tokens listed for the logits box

# the stages of one block: (key suffix, label, symbolic shape, kind). The attention row reads
# norm 1, then q, k and v side by side in one column (each computed from norm 1's output),
# the weights from q and k, and the attention output from the weights and v; the FFN row
# reads left to right.
ATTENTION_ROW = [
    ("norm1", "norm 1", ("T", "C"), "norm"),
    ("attn.q", "q", ("T", "D"), "head"),
    ("attn.k", "k", ("T", "D"), "head"),
    ("attn.v", "v", ("T", "D"), "head"),
    ("attn.weights", "weights", ("T", "T"), "weights"),
    ("attn", "attn out", ("T", "C"), "linear"),
]
FFN_ROW = [
    ("norm2", "norm 2", ("T", "C"), "norm"),
    ("ff.hidden", "FFN hidden", ("T", "F"), "hidden"),
    ("ff", "FFN out", ("T", "C"), "linear"),
]
FONT_PX = 12  # every text of the explorer (explorer.js): the book's minimum text size
LINE = 15  # px between the baselines of a box's name and its shape label (12 px text)
BOX_HEIGHT = 2 * LINE + 6  # a name and a shape label, 3 px above and below
ROW_GAP = 14
STREAM_X = 16  # the residual stream: a vertical line the sub-layers add to
FIRST_X = STREAM_X + 22  # the left edge of every row's first box
GAP = 8  # between the boxes of a row
FORK_GAP = 14  # between a norm and q, k, v: room for the fork of its three arrows
STACK_GAP = 4  # between q, k and v, one above the other
PAD = 8  # a box is wider than the estimate of its widest text by this much
T_LABEL = 99  # shape labels are sized for T up to 99 (explorer.js narrows a longer one)
# the book's diagrams' colour for each concept (tfbook.diagrams.svg.COLOURS): embeddings,
# norms, attention, FFN, the output head, the stream
KIND_COLOUR = {"embed": "embed", "stream": "stream", "norm": "norm", "head": "attn",
               "weights": "attn", "linear": "attn", "hidden": "ffn", "logits": "head"}
ACTIVATION_NAME = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU", "silu": "SiLU"}


def superscript(n: int) -> str:
    """x^(n) as text: superscript digits in parentheses, e.g. 12 -> '⁽¹²⁾'."""
    return "⁽" + str(n).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")) + "⁾"


def stream_label(state: int) -> str:
    """The name of the stream's state number `state` (0 .. 2L) in the book's notation:
    x⁽⁰⁾ the embedding, x⁽ˡ⁾+a after block l's attention, x⁽ˡ⁺¹⁾ after its FFN (as the
    page's chart names them)."""
    if isinstance(state, bool) or not isinstance(state, int) or state < 0:
        raise ValueError(f"state must be an int >= 0 (0 is the embedding), got {state!r}")
    return "x" + superscript(state // 2) + ("+a" if state % 2 else "")


def shape_text(shape: Sequence[str], n: dict[str, int]) -> str:
    """The widest shape label a box shows, e.g. ('T', 'D') -> '(64, 16)': T at its largest
    (T_max, capped at T_LABEL), the other letters the config's sizes."""
    T = min(n["T_max"], T_LABEL)
    return "(" + ", ".join(str(T if d == "T" else n[d]) for d in shape) + ")"


def box_width(label: str, shape: Sequence[str], n: dict[str, int]) -> int:
    """A box's width: room for its name and its widest shape label at FONT_PX, by a generous
    estimate of the text's width (0.6 em a character), so that neither reaches the box's
    edge. A label for T above T_LABEL (SmolLM2's T can reach 8,192) is narrowed to its box
    by explorer.js; capping T keeps a long context from widening the whole diagram."""
    return int(max(text_width(label, FONT_PX), text_width(shape_text(shape, n), FONT_PX))) + PAD


def _check_decoder(model: object) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tfbook decoder (tfbook.models.gpt.GPT: the trained "
                        f"GPT, SmolLM2, a GPTConfig preset), got {type(model).__name__}")
    return model


def sizes(config: GPTConfig) -> dict[str, int]:
    """The named sizes of a config: C, H, H_kv, D, F, V, L, T_max."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    H = config.n_heads
    return {"C": config.d_model, "H": H, "H_kv": config.n_kv_heads or H,
            "D": config.head_size, "F": config.block_config().d_ff, "V": config.vocab_size,
            "L": config.n_layers, "T_max": config.max_len}


def box_texts(key: str, config: GPTConfig) -> dict[str, str]:
    """What the panel says about a box: its accessible name (with its block, "block 16, q"),
    a one-line explanation, and its formula in the book's notation, written with _{...} for
    a subscript and ^{...} for a superscript (explorer.js draws them as <sub> and <sup>).
    Blocks and heads are counted from 0, as in the code's keys."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a box's key (str), got {type(key).__name__}")
    layer, suffix = -1, key
    if key.startswith("blocks."):
        _, number, suffix = key.split(".", 2)
        layer = int(number)
    l = layer  # noqa: E741 (the book's letter for a block)
    norm = "LN" if config.norm == "layer" else "RMSNorm"
    norm_formula = ("γ ⊙ (x − μ) / √(σ^{2} + ε) + β" if config.norm == "layer"
                    else "γ ⊙ x / √(mean(x^{2}) + ε)")
    rope = config.position == "rope"
    bias = " + b" if config.bias else ""
    grouped = (config.n_kv_heads or config.n_heads) != config.n_heads
    kv = "^{g(h)}" if grouped else "^{h}"
    act = ACTIVATION_NAME.get(config.activation, config.activation)
    x_in = f"x^{{({l})}}"  # the stream entering block l
    texts = {
        "tok_emb": ("token embedding",
                    "the row of the embedding matrix E for each token v of the text",
                    "E_{v}, a row of E, (V, C)"),
        "pos_emb": ("position embedding", "a learned vector for each position t",
                    "P_{t}, a row of P, (T_{max}, C)"),
        "embed": ("the stream's start, x⁽⁰⁾",
                  "the residual stream starts here: every sub-layer adds to it"
                  + (" (RoPE brings the positions in inside attention)" if rope else ""),
                  "x^{(0)}_{t} = E_{v}" + ("" if rope else " + P_{t}")),
        "norm1": (f"block {l}, norm 1", f"block {l}'s attention reads the stream through "
                  f"this {'layer' if config.norm == 'layer' else 'RMS'} norm",
                  f"X = {norm}({x_in}), {norm}(x) = {norm_formula}"),
        "attn.q": (f"block {l}, q", "head h's queries: what each token looks for"
                   + (" (before RoPE rotates them)" if rope else ""),
                   "Q^{h} = X W_{Q}^{h}, X = norm 1's output"),
        "attn.k": (f"block {l}, k", "the keys: what each token offers to the queries"
                   + (" (before RoPE rotates them)" if rope else "")
                   + ("; query head h reads key head g(h) = ⌊h / n⌋, n query heads to a key "
                      "head" if grouped else ""),
                   f"K = X W_{{K}}{kv}"),
        "attn.v": (f"block {l}, v", "the values: what each token hands to the tokens that "
                   "read it" + ("; shared like the keys" if grouped else ""),
                   f"V = X W_{{V}}{kv}"),
        "attn.weights": (f"block {l}, weights", "head h's attention weights: row t is how "
                         "token t spreads its reading over the tokens up to t (each row "
                         "sums to 1)", "A = softmax(Q K^{⊤} / √D + log M), M causal"),
        "attn": (f"block {l}, attn out", "every head's A V side by side, projected back to "
                 "the width C: what attention adds to the stream",
                 "[A^{0}V^{0}, …, A^{H−1}V^{H−1}] W_{O}" + bias),
        "resid1": (f"block {l}, stream after attention",
                   f"the stream after block {l}'s attention added its output",
                   f"x^{{({l})}}+a = {x_in} + attn out"),
        "norm2": (f"block {l}, norm 2", f"block {l}'s FFN reads the stream through this norm",
                  f"X = {norm}(x^{{({l})}}+a)"),
        "ff.hidden": (f"block {l}, FFN hidden",
                      f"the FFN's F hidden units, after the {act}"
                      + (" (its tanh form)" if config.activation == "gelu_tanh" else "")
                      + (" gate" if config.ffn == "swiglu" else ""),
                      f"{act}(X W_{{gate}}) ⊙ (X W_{{1}})" if config.ffn == "swiglu"
                      else f"{act}(X W_{{1}}{' + b_{1}' if config.bias else ''})"),
        "ff": (f"block {l}, FFN out", "the FFN's output, back to the width C: what it adds "
               "to the stream", f"FFN hidden · W_{{2}}{' + b_{2}' if config.bias else ''}"),
        "resid2": (f"block {l}, stream after the FFN",
                   f"the stream after block {l}'s FFN added its output: block {l + 1} "
                   "reads it" if l + 1 < config.n_layers else
                   f"the stream after the last block, {l}: the final norm reads it",
                   f"x^{{({l + 1})}} = x^{{({l})}}+a + FFN out"),
        "norm_f": ("final norm", "the last block's stream normalised: the vectors h that the "
                   "output layer scores",
                   f"h = {norm}(x^{{({config.n_layers})}})"),
        "logits": ("logits", "a score for every token of the vocabulary: the softmax of a "
                   "row is the next token's distribution",
                   "ℓ = h E^{⊤} (the output layer is E)" if config.tie_weights
                   else "ℓ = h W_{out}"),
    }
    if suffix not in texts:
        raise ValueError(f"unknown box {key!r:.60}")
    name, about, formula = texts[suffix]
    return {"name": name, "about": about, "formula": formula}


def explorer_layout(config: GPTConfig) -> dict[str, Any]:
    """The diagram of a decoder as boxes and arrows, coordinates computed from the config.

    The residual stream is a vertical line at the left; every block is two rows (attention,
    then FFN) that read the stream through a norm and add back to it at a circle (resid1,
    resid2). In the attention row, norm 1 feeds q, k and v, stacked in one column; q and k
    feed the weights, and the weights and v the attention output. Each box: {key, label,
    shape (symbolic dims), kind, colour, x, y, w, h, layer, name, about, formula}.

    `edges` lists every arrow as [source, result], each a data dependency of the forward pass
    (the tests hold them against the traced computation): a sub-layer's output into its
    circle, a norm reading the stream ([stream state, norm]), and the stream's own segments
    ([state, next state]), which the vertical line draws.
    """
    n = sizes(config)
    learned = config.position == "learned"
    boxes: list[dict[str, Any]] = []
    edges: list[list[str]] = []

    def box(key: str, label: str, shape: Sequence[str], kind: str, x: float, y: float,
            w: float, layer: int = -1, h: float = BOX_HEIGHT) -> None:
        boxes.append({"key": key, "label": label, "shape": list(shape), "kind": kind,
                      "colour": COLOURS[KIND_COLOUR[kind]], "x": x, "y": y, "w": w, "h": h,
                      "layer": layer, **box_texts(key, config)})

    y = 0
    w = box_width("token embedding", ("T", "C"), n)
    box("tok_emb", "token embedding", ("T", "C"), "embed", FIRST_X, y, w)
    if learned:
        box("pos_emb", "position", ("T", "C"), "embed", FIRST_X + w + GAP, y,
            box_width("position", ("T", "C"), n))
        edges.append(["pos_emb", "embed"])
    edges.append(["tok_emb", "embed"])
    y += BOX_HEIGHT + ROW_GAP
    box("embed", "x⁽⁰⁾ = embedding" + (" + position" if learned else ""), ("T", "C"),
        "stream", STREAM_X - 12, y, 24)
    # one width a stage, the same in every block, so that the columns line up; q, k and v
    # share a column
    widths = {suffix: box_width(label, shape, n) for suffix, label, shape, _ in ATTENTION_ROW
              + FFN_ROW}
    qkv = max(widths["attn.q"], widths["attn.k"], widths["attn.v"])
    y += BOX_HEIGHT + ROW_GAP
    stream = "embed"  # the stream's latest state
    step = BOX_HEIGHT + STACK_GAP
    for layer in range(config.n_layers):
        p = f"blocks.{layer}."
        # attention: norm 1 level with k; q, k, v one above the other; the weights as tall
        # as q and k, the output as tall as all three
        x = FIRST_X
        box(p + "norm1", "norm 1", ("T", "C"), "norm", x, y + step, widths["norm1"], layer)
        x += widths["norm1"] + FORK_GAP
        for i, (suffix, label) in enumerate((("attn.q", "q"), ("attn.k", "k"),
                                             ("attn.v", "v"))):
            box(p + suffix, label, ("T", "D"), "head", x, y + i * step, qkv, layer)
        x += qkv + GAP
        box(p + "attn.weights", "weights", ("T", "T"), "weights", x, y,
            widths["attn.weights"], layer, h=step + BOX_HEIGHT)
        x += widths["attn.weights"] + GAP
        box(p + "attn", "attn out", ("T", "C"), "linear", x, y, widths["attn"], layer,
            h=2 * step + BOX_HEIGHT)
        edges += [[stream, p + "norm1"], [p + "norm1", p + "attn.q"],
                  [p + "norm1", p + "attn.k"], [p + "norm1", p + "attn.v"],
                  [p + "attn.q", p + "attn.weights"], [p + "attn.k", p + "attn.weights"],
                  [p + "attn.weights", p + "attn"], [p + "attn.v", p + "attn"],
                  [p + "attn", p + "resid1"], [stream, p + "resid1"]]
        y += 2 * step + BOX_HEIGHT + 4
        box(p + "resid1", f"x{superscript(layer)} + block {layer}'s attention", ("T", "C"),
            "stream", STREAM_X - 12, y, 24, layer)
        y += BOX_HEIGHT + ROW_GAP
        # the FFN, left to right
        x = FIRST_X
        for suffix, label, shape, kind in FFN_ROW:
            box(p + suffix, label, shape, kind, x, y, widths[suffix], layer)
            x += widths[suffix] + GAP
        edges += [[p + "resid1", p + "norm2"], [p + "norm2", p + "ff.hidden"],
                  [p + "ff.hidden", p + "ff"], [p + "ff", p + "resid2"],
                  [p + "resid1", p + "resid2"]]
        y += BOX_HEIGHT + 4
        box(p + "resid2", f"x{superscript(layer + 1)} = … + block {layer}'s FFN", ("T", "C"),
            "stream", STREAM_X - 12, y, 24, layer)
        stream = p + "resid2"
        y += BOX_HEIGHT + ROW_GAP
    w = box_width("final norm", ("T", "C"), n)
    box("norm_f", "final norm", ("T", "C"), "norm", FIRST_X, y, w)
    box("logits", "logits", ("T", "V"), "logits", FIRST_X + w + GAP, y,
        box_width("logits", ("T", "V"), n))
    edges += [[stream, "norm_f"], ["norm_f", "logits"]]
    # a stream's name and shape are written right of its circle (explorer.js: from x + 18)
    width = max(max(b["x"] + b["w"] for b in boxes),
                max(STREAM_X + 18 + text_width(b["label"], FONT_PX) for b in boxes
                    if b["kind"] == "stream")) + 10
    return {"boxes": boxes, "edges": edges, "sizes": n, "width": width, "height": y + BOX_HEIGHT,
            "norm": config.norm, "ffn": config.ffn, "position": config.position}


def stream_keys(n_layers: int) -> list[str]:
    """The residual stream's states in order: x^(0), then after each sub-layer's addition."""
    keys = ["embed"]
    for layer in range(n_layers):
        keys += [f"blocks.{layer}.resid1", f"blocks.{layer}.resid2"]
    return keys


def _check_ids(model: GPT, ids: Sequence[int]) -> list[int]:
    if isinstance(ids, Tensor):
        ids = ids.tolist()
    if (isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids
            or any(not isinstance(i, int) or isinstance(i, bool) for i in ids)):
        raise TypeError(f"ids must be a non-empty list of token ids (int), got {ids!r:.80}")
    if len(ids) > model.config.max_len:
        raise ValueError(f"{len(ids)} tokens exceed the model's context of "
                         f"{model.config.max_len}: keep the last {model.config.max_len}")
    return list(ids)


@contextmanager
def box_hooks(model: GPT, keep: Callable[[str, Tensor], None]) -> Iterator[None]:
    """Forward hooks on every module the diagram draws, for the `with` block: each forward
    pass calls keep(box key, tensor) with each box's tensor as the model computed it (batch
    dimension included). The position box is the table's rows P[positions] (B = 1)."""
    model = _check_decoder(model)

    def after(key: str, pick=lambda output: output):
        return lambda _m, _args, output: keep(key, pick(output))

    def before(key: str):
        return lambda _m, args, _output: keep(key, args[0])

    def positions_hook(module, args, output):
        positions = args[1] if len(args) > 1 and args[1] is not None else torch.arange(
            args[0].shape[1])
        keep("pos_emb", module.weight[positions].reshape(output.shape[1:])[None])
        keep("embed", output)

    hooks = [(model.tok_emb, after("tok_emb"))]
    if model.pos_emb is not None:
        hooks.append((model.pos_emb, positions_hook))
    else:
        hooks.append((model.tok_emb, after("embed")))  # RoPE: x^(0) is the embedding
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}."
        attn = block.attn
        hooks += [
            (block.norm1, after(p + "norm1")),
            (attn.q_proj, after(p + "attn.q")),
            (attn.k_proj, after(p + "attn.k")),
            (attn.v_proj, after(p + "attn.v")),
            (attn, after(p + "attn", lambda o: o[0])),
            (attn, after(p + "attn.weights", lambda o: o[1])),
            (block.norm2, before(p + "resid1")),
            (block.norm2, after(p + "norm2")),
            (block.ff.fc_out, before(p + "ff.hidden")),
            (block.ff, after(p + "ff")),
            (block, after(p + "resid2", lambda o: o[0])),
        ]
    hooks += [(model.norm_f, after("norm_f")), (model.lm_head, after("logits"))]
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def trace_decoder(model: GPT, ids: Sequence[int]) -> dict[str, Tensor]:
    """One forward pass of `model` on `ids` (B = 1), every box's tensor taken by forward
    hooks on the real modules: key -> float32 tensor without the batch dimension."""
    model = _check_decoder(model)
    ids = _check_ids(model, ids)
    out: dict[str, Tensor] = {}

    def keep(key: str, tensor: Tensor) -> None:
        out[key] = tensor.detach()[0].float().cpu()  # drop B = 1

    was_training = model.training
    model.eval()
    try:
        with box_hooks(model, keep):
            model(torch.tensor([ids]), need_weights=True)
    finally:
        model.train(was_training)
    return out


def stream_norms(trace: dict[str, Tensor], n_layers: int) -> Tensor:
    """||x_t|| of the residual stream at each of its 2L + 1 states: (2L + 1, T)."""
    return torch.stack([trace[k].norm(dim=-1) for k in stream_keys(n_layers)])


def top_next_tokens(logits: Tensor, n: int = TOP_N) -> tuple[Tensor, Tensor]:
    """The n most likely next tokens at every position: ids (T, n) and probabilities (T, n),
    from the softmax of logits (T, V) in float64."""
    probs = torch.softmax(logits.double(), dim=-1)
    values, ids = probs.topk(min(n, probs.shape[-1]), dim=-1)
    return ids, values


def cut_note(n_tokens: int, max_len: int) -> str:
    """What the page says when the text is longer than the context (explorer.js's cutNote)."""
    return (f"the text has {n_tokens} tokens and the model reads at most {max_len}: "
            f"its first {n_tokens - max_len} were cut")


def check_text(text: object) -> str:
    """The reader's sentence: a str with something besides spaces, at most MAX_TEXT_CHARS."""
    return check_typed(text, "text", MAX_TEXT_CHARS,
                       "the text box is empty: type a sentence to run the model on",
                       "the explorer")


def _strings_to_page(strings: Any, _widget: Any) -> Any:
    return [page_text(s) for s in strings]


def _top_to_page(top: Any, _widget: Any) -> Any:
    if not top:
        return top
    return {"tokens": [[page_text(s) for s in row] for row in top["tokens"]],
            "probs": top["probs"]}


def _b64(tensor: Tensor) -> str:
    return base64.b64encode(tensor.contiguous().numpy().astype("<f4").tobytes()).decode("ascii")


class ModelExplorer(Widget):
    """A decoder's diagram; click a box to see its tensor for the text, hover a token.

    With a page model (`from_page_model`) the page runs the text itself (static/gpt.js),
    kernel or not. Fed by Python (`from_model`, any tfbook decoder), the page holds the
    tokens, the stream norms, the top next tokens and the tensor of the selected box; a
    click asks Python for another box (Jupyter), and the static page shows the saved one.
    """

    # the token widgets' drawing of a token (tokenspans.js), the page's GPT, the explorer
    _esm = "\n".join([bundle("tokenspans.js"), gpt_js_script_safe(),
                      (STATIC / "explorer.js").read_text(encoding="utf-8")])

    diagram = traitlets.Dict().tag(sync=True)  # explorer_layout(config)
    page_model = traitlets.Unicode("").tag(sync=True)  # payload_json of a GPT, or ""
    text = traitlets.Unicode("").tag(sync=True, to_json=_text_to_page)  # the sentence
    box = traitlets.Unicode("blocks.0.attn.weights").tag(sync=True)  # the selected box
    head = traitlets.Int(0).tag(sync=True)  # the head shown in q, k, v, weights
    # Python-fed data (empty with a page model): token labels, (2L + 1, T) norms, the top
    # next tokens, and the selected box's tensor {key, head, shape, data (base64 float32)}
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True, to_json=_strings_to_page)
    dropped = traitlets.Int(0).tag(sync=True)  # tokens cut from the start of the text
    norms = traitlets.List().tag(sync=True)
    top = traitlets.Dict().tag(sync=True, to_json=_top_to_page)  # {tokens, probs}: (T, n)
    shown = traitlets.Dict().tag(sync=True)

    def __init__(self, model: GPT, tokenizer: Tokenizer, text: str, *, box: str | None = None,
                 head: int = 0, payload: dict | None = None) -> None:
        super().__init__()
        model = _check_decoder(model)
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a tfbook tokenizer, got "
                            f"{type(tokenizer).__name__}")
        check_text(text)
        self._model, self._tokenizer = model, tokenizer
        layout = explorer_layout(model.config)
        keys = {b["key"] for b in layout["boxes"]}
        box = "blocks.0.attn.weights" if box is None else box
        if box not in keys:
            raise ValueError(f"box must be one of the diagram's keys ({', '.join(sorted(keys))}"
                             f"), got {box!r:.60}")
        if not isinstance(head, int) or isinstance(head, bool) or not (
                0 <= head < model.config.n_heads):
            raise ValueError(f"head must be an int in [0, {model.config.n_heads}), got {head!r}")
        self._trace: dict[str, Tensor] = {}
        with self.hold_sync():
            self.diagram, self.box, self.head = layout, box, head
            if payload is not None:
                self.page_model = payload_json(payload)
                self.text = text
            else:
                self.compute(text=text)

    @classmethod
    def from_page_model(cls, model: GPT, tokenizer: Tokenizer, text: str, *,
                        dtype: str = "float16", box: str | None = None,
                        head: int = 0) -> ModelExplorer:
        """The explorer with `model` in the page (export_page_model, at most 3 MB): the page
        runs the reader's text with gpt.js, kernel or not. Python keeps the page's weights
        (quantised_reference) for `trace`."""
        check_dtype(dtype)
        payload = page_payload(model, tokenizer, dtype)
        reference = quantised_reference(model, dtype)
        return cls(reference, tokenizer, text, box=box, head=head, payload=payload)

    @classmethod
    def from_model(cls, model: GPT, tokenizer: Tokenizer, text: str, *,
                   box: str | None = None, head: int = 0) -> ModelExplorer:
        """The explorer of any tfbook decoder, its tensors computed by Python's hooks."""
        return cls(model, tokenizer, text, box=box, head=head)

    def ids(self, text: str) -> tuple[list[int], int]:
        """The text's token ids as the page takes them (encode_ordinary, the last T_max),
        and how many were cut from the start."""
        ids = self._tokenizer.encode_ordinary(check_text(text))
        if not ids:
            raise ValueError("the text has no tokens")
        max_len = self._model.config.max_len
        return ids[-max_len:], max(0, len(ids) - max_len)

    def trace(self, text: str) -> dict[str, Tensor]:
        """Every box's tensor for `text`, by forward hooks (what the page shows)."""
        return trace_decoder(self._model, self.ids(text)[0])

    def compute(self, text: str | None = None, box: str | None = None,
                head: int | None = None) -> None:
        """Python-fed: run a new text and/or pick another box or head, and send what the page
        shows (with a page model the page computes, and only the selection changes)."""
        if box is not None:
            if not isinstance(box, str) or box not in {b["key"] for b in self.diagram["boxes"]}:
                raise ValueError(f"unknown box {box!r:.60}")
            self.box = box
        if head is not None:
            if not isinstance(head, int) or not 0 <= head < self._model.config.n_heads:
                raise ValueError(f"head must be an int in [0, {self._model.config.n_heads}), "
                                 f"got {head!r}")
            self.head = head
        if self.page_model:
            if text is not None:
                self.text = check_text(text)
            return
        if text is not None:
            ids, dropped = self.ids(text)
            trace = trace_decoder(self._model, ids)
            norms = stream_norms(trace, self._model.config.n_layers)
            top_ids, top_probs = top_next_tokens(trace["logits"])
            label = lambda i: token_label(self._tokenizer, int(i))  # noqa: E731
            with self.hold_sync():
                self._trace = trace
                self.text, self.dropped = text, dropped
                self.tokens = [label(i) for i in ids]
                self.norms = norms.tolist()
                self.top = {"tokens": [[label(i) for i in row] for row in top_ids.tolist()],
                            "probs": top_probs.tolist()}
        tensor = self._trace[self.box]
        # the logits box lists the top next tokens (sent above), not V numbers a position
        data = "" if self.box == "logits" else _b64(tensor)
        self.shown = {"key": self.box, "head": self.head, "shape": list(tensor.shape),
                      "data": data}


__all__ = ["ModelExplorer", "box_hooks", "box_texts", "cut_note", "explorer_layout",
           "stream_label", "stream_norms", "top_next_tokens", "trace_decoder", "sizes",
           "stream_keys"]
