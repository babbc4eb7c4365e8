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
from tfbook.diagrams.diagram import PHONE_COLUMN, Diagram
from tfbook.diagrams.layout import GAP, Node, Rect, column, row, shape_label
from tfbook.diagrams.svg import MIN_SCALE, SMALL, Canvas, text_width
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
    parts = _LookupParts(tokens, ids.tolist(), used, tuple(one_hot.shape),
                         tuple(weight.shape), tuple(product.shape))
    # wide: O and X side by side, row by row, with E above X (rows of X are rows of O times
    # E; E's rows are matched to O's columns by their id and their colour, not by height)
    c = Canvas(title)
    y = heading(c, title, 0, 0)
    o, rows_top = parts.draw_o(c, 0, y + parts.e_height + 16)
    x_x = o.right + 46
    e = parts.draw_e(c, x_x, y)
    parts.draw_x(c, x_x, o.y, rows_top)
    del e
    note(c, 0, o.bottom + 20, f"only the {len(used)} columns that hold a 1; the other "
         f"{weight.size(0) - len(used):,} are all 0")
    note(c, 0, o.bottom + 38, f"E: only the {len(used)} rows they pick, of {weight.size(0):,};"
         " a colour per id")
    # narrow: O, then E, then X, one under the other
    n = Canvas(title)
    y = heading(n, title, 0, 0)
    o, _ = parts.draw_o(n, 0, y + 6)
    note(n, 0, o.bottom + 20, f"only the {len(used)} columns that hold a 1 (of "
         f"{weight.size(0):,})")
    n.text(0, o.bottom + 50, "×", 18, bold=True, anchor="start")
    e = parts.draw_e(n, 22, o.bottom + 34)
    n.text(0, e.bottom + 28, "=", 18, bold=True, anchor="start")
    parts.draw_x(n, 22, e.bottom + 12, None)
    return Diagram(c, narrow=[n])


class _LookupParts:
    """The three matrices of O E = X, each drawable anywhere: O (T, V) cell by cell (only its
    columns that hold a 1), E's rows those columns pick, X's rows; an id's colour is the same
    in all three."""

    def __init__(self, tokens: list[str], ids: list[int], used: list[int],
                 o_shape: tuple[int, ...], e_shape: tuple[int, ...],
                 x_shape: tuple[int, ...]) -> None:
        self.shown = [visible(t) for t in tokens]
        self.ids, self.used = ids, used
        self.column_of = {v: j for j, v in enumerate(used)}
        self.label_w = max(text_width(t, SMALL, mono=True) for t in self.shown) + 8
        self.cell_w = max(max(text_width(str(v), SMALL, mono=True) for v in used) / 2 + 8, 24.0)
        self.staggered = any(text_width(str(v), SMALL, mono=True) + 6 > self.cell_w
                             for v in used)
        self.shapes = {"one_hot": o_shape, "table": e_shape, "x": x_shape}
        self.labels = {k: shape_label(letters, self.shapes[k]) for k, letters in
                       (("one_hot", ("T", "V")), ("table", ("V", "C")), ("x", ("T", "C")))}
        self.e_w = max(text_width(self.labels["table"], SMALL, mono=True),
                       text_width(f"row {max(used)}", SMALL, mono=True)) + 12
        self.x_w = max(text_width(self.labels["x"], SMALL, mono=True),
                       text_width(f"E[{max(used)}]", SMALL, mono=True)) + 12
        self.e_height = 40 + len(used) * ROW

    def colour(self, v: int) -> tuple[int, float]:
        """The swatch of id v: one of eight colours, a darker shade after the first eight."""
        j = self.column_of[v]
        return j % 8, 0.35 if j < 8 else 0.7

    def rows_mid(self, top: float) -> float:
        return top + len(self.ids) * ROW / 2 + 5

    def _title(self, c: Canvas, x: float, y: float, name: str, key: str) -> None:
        c.text(x, y + 2, name, SMALL, bold=True, anchor="start")
        note(c, x, y + 20, self.labels[key], key, self.shapes[key], mono=True)

    def draw_o(self, c: Canvas, x: float, y: float) -> tuple[Rect, float]:
        """O with its token rows and id columns; -> its rectangle, the top of its first row."""
        self._title(c, x + self.label_w, y, "O: one-hot rows", "one_hot")
        y += 40
        x_o = x + self.label_w
        for j, v in enumerate(self.used):
            low = self.staggered and j % 2
            c.text(x_o + (j + 0.5) * self.cell_w, y + (28 if low else 12), str(v), SMALL,
                   mono=True, key=f"column.{j}", shape=(v,))
        y += 40 if self.staggered else 22
        top = y
        for t, v in enumerate(self.ids):
            ry = top + t * ROW
            c.text(x_o - 8, ry + ROW / 2 + 4.5, self.shown[t], SMALL, mono=True, anchor="end",
                   key=f"token.{t}")
            for j, u in enumerate(self.used):
                if u == v:
                    c.swatch(x_o + j * self.cell_w, ry, self.cell_w, ROW, *self.colour(v))
                    c.text(x_o + (j + 0.5) * self.cell_w, ry + ROW / 2 + 4.5, "1", SMALL,
                           mono=True, bold=True)
                else:
                    c.box(x_o + j * self.cell_w, ry, self.cell_w, ROW, "plain", radius=0)
        o_w = max(len(self.used) * self.cell_w, text_width(self.labels["one_hot"], SMALL, True))
        y0 = top - (80 if self.staggered else 62)
        return Rect(x, y0, x_o + o_w - x, top + len(self.ids) * ROW - y0), top

    def draw_e(self, c: Canvas, x: float, y: float) -> Rect:
        """E's rows that O picks, one per id, in O's column order."""
        self._title(c, x, y, "E: the table", "table")
        self._rows(c, x, y + 40, self.e_w, self.used, "row {}", "row", True)
        return Rect(x, y, self.e_w, 40 + len(self.used) * ROW)

    def _rows(self, c: Canvas, x: float, top: float, w: float, ids: list[int], text: str,
              key: str, with_id: bool) -> None:
        """One coloured row per id, labelled text.format(id), keyed key.<index>."""
        for k, v in enumerate(ids):
            ry = top + k * ROW
            c.swatch(x, ry, w, ROW, *self.colour(v))
            c.text(x + w / 2, ry + ROW / 2 + 4.5, text.format(v), SMALL, mono=True,
                   key=f"{key}.{k}", shape=(v,) if with_id else None)

    def draw_x(self, c: Canvas, x: float, y: float, rows_top: float | None) -> Rect:
        """X's rows, each the row of E its token's id picks (level with O's rows if
        rows_top is given, else under its own title at y)."""
        if rows_top is None:
            self._title(c, x, y, "X = O E", "x")
            rows_top = y + 40
        self._rows(c, x, rows_top, self.x_w, self.ids, "E[{}]", "x", False)
        if rows_top != y + 40:  # beside O: the title sits over the rows
            self._title(c, x, rows_top - 40, "X = O E", "x")
        return Rect(x, y, self.x_w, rows_top + len(self.ids) * ROW - y)


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

    tables = {p: tuple(getattr(module, p).weight.shape) for p in ("token", "token_type",
                                                                   "position")}
    shown = [visible(t) for t in tokens]
    drawing = _BertInput(tr, part, shown, types, T, tables)
    wide, narrow = drawing.canvas(title, None), drawing.canvas(title, PHONE_COLUMN / MIN_SCALE)
    return Diagram(wide, narrow=[narrow])


class _BertInput:
    """BERT's input layer drawn as it runs: token and type lookups added, the positions added
    by the position embedding, then LayerNorm; above them the table of tokens, types and
    positions (cut into rows that fit `width`, on a phone)."""

    LABEL_W = text_width("position", SMALL) + 14

    def __init__(self, tr, part, shown: list[str], types: list[int], T: int,
                 tables: dict[str, tuple[int, ...]]) -> None:
        self.tr, self.part, self.shown, self.types, self.T = tr, part, shown, types, T
        self.tables = tables
        self.widths = [max(text_width(s, SMALL, mono=True) + 12, 26.0) for s in shown]

    def table(self, c: Canvas, y: float, width: float | None) -> tuple[float, float]:
        """The rows token, type, position, one column per token, cut into pieces no wider
        than `width`; -> (bottom, right)."""
        rows = (("token", self.shown, "data"), ("type", [str(g) for g in self.types], None),
                ("position", [str(t) for t in range(self.T)], "plain"))
        pieces, start, x = [], 0, self.LABEL_W
        for t, w in enumerate(self.widths):  # where each piece of the table starts
            if width is not None and t > start and x + w > width:
                pieces.append((start, t))
                start, x = t, self.LABEL_W
            x += w + 5
        pieces.append((start, self.T))
        right = 0.0
        for a, b in pieces:
            for r, (name, texts, kind) in enumerate(rows):
                ry = y + r * (CHIP_H + 6)
                c.text(self.LABEL_W - 10, ry + CHIP_H / 2 + 4.5, name, SMALL, bold=True,
                       anchor="end")
                x = self.LABEL_W
                for t in range(a, b):
                    box_kind = kind or ("attn" if self.types[t] == 0 else "ffn")  # 2 segments
                    c.box(x, ry, self.widths[t], CHIP_H, box_kind, radius=3)
                    c.text(x + self.widths[t] / 2, ry + CHIP_H / 2 + 4.5, texts[t], SMALL,
                           mono=True, key=f"{name}.{t}")
                    x += self.widths[t] + 5
                right = max(right, x - 5)
            y += 3 * (CHIP_H + 6) + 10
        return y, right

    def canvas(self, title: str, width: float | None) -> Canvas:
        tr, part, tables = self.tr, self.part, self.tables
        BTC = ("B", "T", "C")
        c = Canvas(title)
        y = heading(c, title, 0, 0)
        y, right = self.table(c, y, width)
        y += 20
        flow_in = lambda name: _input_name(tr, part(name))  # noqa: E731
        token = Node("token embedding", tr.shape(part("token")), BTC, "embed", "token_emb",
                     note="E: " + shape_label(("V", "C"), tables["token"]).replace(" = ",
                                                                                  " =\n"),
                     flow=part("token"), stack=True)
        kind = Node("type embedding", tr.shape(part("token_type")), BTC, "embed", "type_emb",
                    note=shape_label(("types", "C"), tables["token_type"]).replace(" = ",
                                                                                  " =\n"),
                    flow=part("token_type"), stack=True)
        centre = max(right, token.width + kind.width + 20) / 2
        inputs = (("ids", tr.input_shape(part("token")), "token_ids", token),
                  ("types", tr.input_shape(part("token_type")), "type_ids", kind))
        rects = row(c, [token, kind], centre, y + 42, gap=20)
        for rect, (name, shape, key, node) in zip(rects, inputs, strict=True):
            label = shape_label(("B", "T"), shape)
            c.text(rect.cx, y + 4, [name, label], SMALL, mono=True, key=key, shape=shape)
            module = "token" if node is token else "token_type"
            c.arrow(rect.cx, y + 24, rect.cx, rect.y, edge=(flow_in(module), node.flow))
        y_add = max(r.bottom for r in rects) + 26
        total = _input_name(tr, part("position"))  # token + type: the position layer's input
        for rect, node in zip(rects, (token, kind), strict=True):
            side = -10 if rect.cx < centre else 10
            c.line([(rect.cx, rect.bottom), (rect.cx, y_add), (centre + side, y_add)],
                   edge=(node.flow, total))
        c.adder(centre, y_add, "+")
        y = y_add + 10 + GAP
        c.arrow(centre, y_add + 10, centre, y, edge=(total, part("position")))
        column(c, [Node("+ position embedding", tr.shape(part("position")), BTC, "embed",
                        "pos_emb", note="P: " + shape_label(("T_max", "C"), tables["position"])
                        + ",\nrow t added at position t", flow=part("position"), stack=True),
                   Node("LayerNorm", tr.shape(part("norm")), BTC, "norm", "norm",
                        note="then into encoder block 0", flow=part("norm"), stack=True)],
               centre, y)
        c.check_wiring(tr.flow, within=part("")[:-1] or None)
        return c


def _input_name(tr, name: str) -> str:
    """The dataflow name of the first argument of module `name`'s call."""
    import inspect

    first = next(iter(inspect.signature(tr.module(name).forward).parameters))
    return f"{name}:{first}" if name else first


__all__ = ["bert_input", "embedding_lookup"]
