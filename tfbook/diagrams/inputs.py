"""The model's input layer drawn from real tensors: the embedding lookup as a one-hot product,
and BERT's sum of token, token-type and position embeddings.

    from tfbook.diagrams.inputs import embedding_lookup, bert_input
    embedding_lookup(embed, idx, tokens)          # O (T, V) x E (V, C) = X (T, C)
    bert_input(minilm, ids, types, tokens)        # token + type + position -> LayerNorm

`embedding_lookup` builds the one-hot matrix of the ids, multiplies it by the table and checks
that the product is the lookup's output before drawing; every shape it prints is one of those
tensors'. `bert_input` runs the model once under `trace` and reads every shape from the hooks
on its embedding modules (and each table's size from the table itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.diagrams._shared import CHIP_H, heading, note, visible
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import GAP, Node, column, row, shape_label
from tfbook.diagrams.svg import SMALL, Canvas, text_width
from tfbook.diagrams.trace import trace
from tfbook.models.bert import BertEmbeddings

ROW = 22.0  # height of one row of a matrix drawn cell by cell
MAX_TOKENS = 24  # more rows would not fit the page


def _check_tokens(tokens: object, n: int) -> list[str]:
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise TypeError(f"tokens must be a list of str, got {tokens!r:.60}")
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} tokens for {n} ids: give one token per id")
    if not 1 <= n <= MAX_TOKENS:
        raise ValueError(f"the drawing holds 1 to {MAX_TOKENS} tokens, got {n}")
    return tokens


def _check_ids(idx: object, name: str = "idx") -> Tensor:
    if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer torch.Tensor of shape (B, T), got "
                        f"{type(idx).__name__}" + (f" {idx.dtype}" if isinstance(idx, Tensor)
                                                   else ""))
    if idx.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(idx.shape)}")
    return idx


# --- the lookup as a product ------------------------------------------------------------------

def embedding_lookup(embedding: nn.Module, idx: Tensor, tokens: list[str], row_index: int = 0,
                     title: str = "The lookup is a one-hot product") -> Diagram:
    """O (T, V) times E (V, C) equals X (T, C), for row `row_index` of the batch `idx` (B, T).

    O is drawn cell by cell, but only its columns that hold a 1 (the ids present, in
    increasing order; every other column is all zeros), E only the rows those columns pick,
    and each row of X names the row of E it copies. Before drawing, the product is computed
    and must equal `embedding(idx)` exactly.
    """
    weight = getattr(embedding, "weight", None)
    if not isinstance(embedding, nn.Module) or not isinstance(weight, Tensor) \
            or weight.dim() != 2:
        raise TypeError("embedding must be a module with a (V, C) weight (TokenEmbedding, "
                        f"nn.Embedding), got {type(embedding).__name__}")
    idx = _check_ids(idx)
    if not (isinstance(row_index, int) and 0 <= row_index < idx.size(0)):
        raise ValueError(f"row_index must be an int in [0, {idx.size(0)}), got {row_index!r}")
    tokens = _check_tokens(tokens, idx.size(1))
    with torch.no_grad():
        looked_up = embedding(idx)[row_index]  # (T, C): the module's own output
        ids = idx[row_index]
        one_hot = F.one_hot(ids, num_classes=weight.size(0)).to(weight.dtype)  # (T, V)
        product = one_hot @ weight  # (T, V) @ (V, C) -> (T, C)
    if getattr(embedding, "scale", 1.0) != 1.0:
        raise ValueError("embedding_lookup draws a plain lookup; this embedding multiplies "
                         f"its rows by {embedding.scale:.4g} (built with scale=True)")
    if not torch.equal(looked_up, product):  # each entry is one weight times 1.0: exact
        raise RuntimeError("the embedding's output is not the one-hot product O E")
    used = sorted(set(ids.tolist()))
    column_of = {v: j for j, v in enumerate(used)}

    c = Canvas(title)
    y = heading(c, title, 0, 0)
    shown = [visible(t) for t in tokens]
    label_w = max(text_width(t, SMALL, mono=True) for t in shown) + 8
    cell_w = max(max(text_width(str(v), SMALL, mono=True) for v in used) / 2 + 8, 24.0)
    x_o = label_w
    o_w = len(used) * cell_w
    staggered = any(text_width(str(v), SMALL, mono=True) + 6 > cell_w for v in used)
    # headings of the three matrices, then the column ids of O (on two lines if crowded)
    e_label = shape_label(("V", "C"), tuple(weight.shape))
    x_label = shape_label(("T", "C"), tuple(product.shape))
    o_label = shape_label(("T", "V"), tuple(one_hot.shape))
    e_w = max(text_width(e_label, SMALL, mono=True),
              text_width(f"row {max(used)}", SMALL, mono=True)) + 12
    x_w = max(text_width(x_label, SMALL, mono=True),
              text_width(f"E[{max(used)}]", SMALL, mono=True)) + 12
    x_e = x_o + max(o_w, text_width(o_label, SMALL, mono=True)) + 26
    x_x = x_e + e_w + 26
    for x, name, label, key, shape in (
            (x_o, "O: one-hot rows", o_label, "one_hot", tuple(one_hot.shape)),
            (x_e, "E: the table", e_label, "table", tuple(weight.shape)),
            (x_x, "X = O E", x_label, "x", tuple(product.shape))):
        c.text(x, y + 2, name, SMALL, bold=True, anchor="start")
        note(c, x, y + 20, label, key, shape, mono=True)
    y += 40
    for j, v in enumerate(used):
        low = staggered and j % 2
        c.text(x_o + (j + 0.5) * cell_w, y + (28 if low else 12), str(v), SMALL, mono=True,
               key=f"column.{j}", shape=(v,))
    y += 40 if staggered else 22
    top = y
    for t, v in enumerate(ids.tolist()):
        ry = top + t * ROW
        c.text(label_w - 8, ry + ROW / 2 + 4.5, shown[t], SMALL, mono=True, anchor="end",
               key=f"token.{t}")
        for j in range(len(used)):
            one = j == column_of[v]
            c.box(x_o + j * cell_w, ry, cell_w, ROW, "embed" if one else "plain", radius=0)
            if one:
                c.text(x_o + (j + 0.5) * cell_w, ry + ROW / 2 + 4.5, "1", SMALL, mono=True,
                       bold=True)
        c.box(x_x, ry, x_w, ROW, "embed", radius=0)
        c.text(x_x + x_w / 2, ry + ROW / 2 + 4.5, f"E[{v}]", SMALL, mono=True,
               key=f"x.{t}")
    for j, v in enumerate(used):  # the rows of E the product reads, in column order
        ry = top + j * ROW
        c.box(x_e, ry, e_w, ROW, "embed", radius=0)
        c.text(x_e + e_w / 2, ry + ROW / 2 + 4.5, f"row {v}", SMALL, mono=True,
               key=f"row.{j}", shape=(v,))
    mid = top + min(len(ids), len(used)) * ROW / 2
    c.text(x_e - 13, mid + 5, "×", 18, bold=True)
    c.text(x_x - 13, mid + 5, "=", 18, bold=True)
    bottom = top + len(ids) * ROW
    note(c, x_o, bottom + 20, f"only the {len(used)} columns that hold a 1; the other "
         f"{weight.size(0) - len(used):,} are all 0")
    note(c, x_o, bottom + 38, f"E: only the {len(used)} rows they pick, of {weight.size(0):,}")
    return Diagram(c)


# --- BERT's input ------------------------------------------------------------------------------


def bert_input(model: nn.Module, input_ids: Tensor, token_type_ids: Tensor,
               tokens: list[str], row_index: int = 0,
               title: str = "BERT's input: three lookups added") -> Diagram:
    """Token + token type + position embeddings, added, then LayerNorm: (B, T) -> (B, T, C).

    Runs `model(input_ids, token_type_ids=token_type_ids)` once under `trace`; every shape
    on the drawing is read from the hooks on the embedding modules, each table's size from
    its weight. The table at the top shows batch row `row_index`: each token with its type
    and its position.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    input_ids = _check_ids(input_ids, "input_ids")
    token_type_ids = _check_ids(token_type_ids, "token_type_ids")
    if token_type_ids.shape != input_ids.shape:
        raise ValueError(f"token_type_ids {tuple(token_type_ids.shape)} must have the shape "
                         f"of input_ids {tuple(input_ids.shape)}")
    if not (isinstance(row_index, int) and 0 <= row_index < input_ids.size(0)):
        raise ValueError(f"row_index must be an int in [0, {input_ids.size(0)}), "
                         f"got {row_index!r}")
    tokens = _check_tokens(tokens, input_ids.size(1))
    names = [n for n, m in model.named_modules() if isinstance(m, BertEmbeddings)]
    if not names:
        raise ValueError(f"the model ({type(model).__name__}) has no BertEmbeddings module: a "
                         "Bert, BertForMaskedLM or BertEmbeddings is needed")
    tr = trace(model, input_ids, token_type_ids=token_type_ids)
    emb = names[0]
    part = (lambda p: f"{emb}.{p}") if emb else (lambda p: p)
    module = tr.module(emb)
    types = token_type_ids[row_index].tolist()
    T = tr.input_shape(part("token"))[1]  # (B, T)
    BTC = ("B", "T", "C")

    c = Canvas(title)
    y = heading(c, title, 0, 0)
    # the table: one column per token; rows token, type, position
    shown = [visible(t) for t in tokens]
    widths = [max(text_width(s, SMALL, mono=True) + 12, 26.0) for s in shown]
    label_w = text_width("position", SMALL) + 14
    rows = (("token", shown, "data"), ("type", [str(g) for g in types], None),
            ("position", [str(t) for t in range(T)], "plain"))
    for r, (name, texts, kind) in enumerate(rows):
        ry = y + r * (CHIP_H + 6)
        c.text(label_w - 10, ry + CHIP_H / 2 + 4.5, name, SMALL, bold=True, anchor="end")
        x = label_w
        for t, text in enumerate(texts):
            box_kind = kind or ("attn" if types[t] == 0 else "ffn")  # the two segments
            c.box(x, ry, widths[t], CHIP_H, box_kind, radius=3)
            c.text(x + widths[t] / 2, ry + CHIP_H / 2 + 4.5, text, SMALL, mono=True,
                   key=f"{name}.{t}")
            x += widths[t] + 5
    table_right = x - 5
    y += 3 * (CHIP_H + 6) + 30
    tables = {p: tuple(getattr(module, p).weight.shape) for p in ("token", "token_type",
                                                                   "position")}
    nodes = [Node("token embedding", tr.shape(part("token")), BTC, "embed", "token_emb",
                  note="E: " + shape_label(("V", "C"), tables["token"])),
             Node("type embedding", tr.shape(part("token_type")), BTC, "embed", "type_emb",
                  note=shape_label(("types", "C"), tables["token_type"])),
             Node("position embedding", tr.shape(part("position")), BTC, "embed", "pos_emb",
                  note=shape_label(("T_max", "C"), tables["position"]))]
    width = max(n.width for n in nodes)
    for n in nodes:
        n.min_width = width
    centre = (label_w + table_right) / 2
    inputs = (("ids", tr.input_shape(part("token")), "token_ids"),
              ("types", tr.input_shape(part("token_type")), "type_ids"),
              ("positions", (T,), "positions"))
    rects = row(c, nodes, centre, y + 26, gap=14)
    for rect, (name, shape, key) in zip(rects, inputs, strict=True):
        label = shape_label(("B", "T") if len(shape) == 2 else ("T",), shape)
        c.text(rect.cx, y + 4, f"{name} {label}", SMALL, mono=True, key=key, shape=shape)
        c.arrow(rect.cx, y + 10, rect.cx, rect.y)
    y_add = max(r.bottom for r in rects) + 30
    for rect in rects:  # each sum's input into the adder: from above, left or right
        if abs(rect.cx - centre) < 1:
            c.arrow(rect.cx, rect.bottom, centre, y_add - 10)
        else:
            side = 10 if rect.cx > centre else -10
            c.line([(rect.cx, rect.bottom), (rect.cx, y_add), (centre + side, y_add)])
    c.adder(centre, y_add, "+")
    y = y_add + 10 + GAP
    c.arrow(centre, y_add + 10, centre, y)
    column(c, [Node("LayerNorm", tr.shape(part("norm")), BTC, "norm", "norm",
                    note="then into encoder block 0")], centre, y)
    return Diagram(c)


__all__ = ["bert_input", "embedding_lookup"]
