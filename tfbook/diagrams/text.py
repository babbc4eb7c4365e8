"""The tokenizer pipeline drawn from a real tokenizer: normalise, pre-tokenise, model, ids.

    from tfbook.diagrams.text import tokenizer_pipeline, pipelines_side_by_side
    tokenizer_pipeline(load_minilm_wordpiece(), "Café au lait!")

Each stage's output is what the tokenizer's own functions produce at that stage
(`pipeline_stages` calls them), and the ids at the end are `tokenizer.encode(text)`: a
drawing that disagreed with the tokenizer would fail in `pipeline_stages`. Every string is
escaped by the canvas, so the text may be anything a reader types.

`merge_tree(tokenizer, word)` draws how a trained byte-level BPE built the tokens of one
word: the leaves are the word's bytes, each inner node a merge of the tokenizer (its id,
which is its rank, and the two tokens it joined), the roots the tokens `encode` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfbook.diagrams._shared import CHIP_H, chips, heading, note, visible
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import hstack
from tfbook.diagrams.svg import FONT, PAD, SMALL, Canvas, text_width
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.tokenizers.pretokenize import bert_normalize, bert_pretokenize, regex_split
from tfbook.tokenizers.wordpiece import WordPieceTokenizer

STAGES = ("text", "normalise", "pre-tokenise", "model", "post-process", "ids")


@dataclass(frozen=True)
class Stage:
    """One stage of a tokenizer: its name, what this tokenizer does there, and its output."""

    name: str  # one of STAGES
    note: str  # what the tokenizer does at this stage
    pieces: tuple[str, ...]  # the output, as the reader sees it (one string for the text)
    kind: str = "data"  # the tint of its chips


def _check(tokenizer: object, text: object) -> None:
    if not isinstance(tokenizer, WordPieceTokenizer | BPETokenizer):
        raise TypeError("pipeline_stages needs a WordPieceTokenizer or a BPETokenizer, got "
                        f"{type(tokenizer).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"text must hold something to tokenize, got {text!r}")


def pipeline_stages(tokenizer: WordPieceTokenizer | BPETokenizer, text: str) -> list[Stage]:
    """The output of each stage for `text`, computed by the tokenizer's own functions.

    WordPiece (BERT): `bert_normalize`, `bert_pretokenize`, `encode_word` per word, [CLS] and
    [SEP] around; byte-level BPE: no normalisation, `regex_split` with the tokenizer's
    pattern, the merges per piece, nothing added. The last stage's ids are checked against
    `tokenizer.encode(text)`.
    """
    _check(tokenizer, text)
    stages = [Stage("text", "as typed", (text,))]
    if isinstance(tokenizer, WordPieceTokenizer):
        lower, accents = tokenizer.lowercase, tokenizer.strip_accents
        what = ", ".join(w for w, on in (("lowercase", lower), ("strip accents", accents)) if on)
        stages.append(Stage("normalise", what or "clean control characters",
                            (bert_normalize(text, lower, accents),)))
        words = bert_pretokenize(text, lower, accents)
        stages.append(Stage("pre-tokenise", "cut at spaces, punctuation",
                            tuple(words), "plain"))
        per_word = [tokenizer.encode_word(w) for w in words]
        ids = [i for word_ids in per_word for i in word_ids]
        stages.append(Stage("model", "WordPiece: longest match",
                            tuple(tokenizer.vocab[i] for i in ids), "embed"))
        cls, sep = tokenizer.special_tokens["[CLS]"], tokenizer.special_tokens["[SEP]"]
        ids = [cls, *ids, sep]
        stages.append(Stage("post-process", "add [CLS] and [SEP]",
                            tuple(tokenizer.vocab[i] for i in ids), "embed"))
        encoded = tokenizer.encode(text, add_special_tokens=True)
    else:
        stages.append(Stage("normalise", "none: every byte is kept", (text,)))
        pieces = regex_split(text, tokenizer.pattern) if tokenizer.pattern else [text]
        stages.append(Stage("pre-tokenise", "regex: a space joins the next word",
                            tuple(visible(p) for p in pieces), "plain"))
        ids = [i for p in pieces for i in tokenizer.encode_ordinary(p)]
        stages.append(Stage("model", "BPE merges, piece by piece",
                            tuple(visible(tokenizer.decode_bytes([i])) for i in ids), "embed"))
        stages.append(Stage("post-process", "none: nothing added", ()))
        encoded = tokenizer.encode(text)
    if encoded != ids:  # the drawing must be the tokenizer's own result
        raise RuntimeError("the stages disagree with tokenizer.encode(text)")
    stages.append(Stage("ids", f"{len(ids)} ids", tuple(str(i) for i in ids), "head"))
    return stages


def visible_text(text: str) -> str:
    """A whole string as a reader can see it: spaces kept, control characters escaped."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text) or "∅"


def wrap(text: str, per_line: int) -> list[str]:
    """Cut text into lines of at most per_line characters, after a space where one is near.

    Nothing is dropped: "".join(wrap(text, n)) == text.
    """
    lines = []
    while len(text) > per_line:
        cut = text.rfind(" ", per_line // 2, per_line) + 1 or per_line
        lines.append(text[:cut])
        text = text[cut:]
    return lines + [text] if text else lines


def _pipeline_canvas(stages: list[Stage], title: str, width: float,
                     pitch: list[float] | None = None) -> tuple[Canvas, list[float]]:
    """The stages one under the other; -> the drawing and the height each stage took. With
    `pitch`, stage k starts pitch[k] below stage k - 1 (to line up with another pipeline)."""
    c = Canvas(title)
    y = heading(c, title, 0, 0)
    heights = []
    end = y
    for k, stage in enumerate(stages):
        start = y
        if k:  # from under the last stage's output (however far the alignment put this one)
            c.arrow(10, end - 14, 10, y, edge="the next stage runs on this one's output")
        c.text(0, y + FONT, stage.name, FONT, bold=True, anchor="start", key=f"{stage.name}")
        x_note = text_width(stage.name, FONT) + 12
        if x_note + text_width(stage.note, SMALL) > width:  # no room beside: the next line
            x_note, y = 0, y + FONT + 4
        note(c, x_note, y + FONT, stage.note)
        y += FONT + 8
        if not stage.pieces:  # nothing new at this stage: room for the arrow under it
            y += 22
        elif stage.name in ("text", "normalise"):  # one string, cut into lines that fit
            per_line = max(8, int((width - 12) / text_width("x", SMALL, mono=True)))
            lines = wrap(visible_text(stage.pieces[0]), per_line)
            y = chips(c, 0, y, lines, width, stage.kind, key=stage.name).bottom + 22
        else:
            y = chips(c, 0, y, list(stage.pieces), width, stage.kind, key=stage.name).bottom + 22
        heights.append(y - start)
        end = y
        if pitch is not None:
            y = start + pitch[k]
    return c, heights


def tokenizer_pipeline(tokenizer: WordPieceTokenizer | BPETokenizer, text: str,
                       title: str | None = None, width: float = 520) -> Diagram:
    """The stages of `tokenizer` on `text`, one under the other, each with its output."""
    if not (isinstance(width, int | float) and 160 <= width <= 1200):
        raise ValueError(f"width must be a number in [160, 1200] (SVG units), got {width!r}")
    kind = "WordPiece" if isinstance(tokenizer, WordPieceTokenizer) else "byte-level BPE"
    title = title or f"{kind}: text to ids"
    return Diagram(_pipeline_canvas(pipeline_stages(tokenizer, text), title, width)[0])


def pipelines_side_by_side(tokenizers: list[tuple[str, WordPieceTokenizer | BPETokenizer]],
                           text: str, width: float = 300) -> Diagram:
    """Several tokenizers' pipelines on the same text, as panels that wrap on a narrow page."""
    if not (isinstance(tokenizers, list) and tokenizers and all(
            isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str) for t in tokenizers)):
        raise TypeError("tokenizers must be a non-empty list of (heading, tokenizer) pairs")
    if not (isinstance(width, int | float) and 160 <= width <= 1200):
        raise ValueError(f"width must be a number in [160, 1200] (SVG units), got {width!r}")
    staged = [(pipeline_stages(tok, text), name) for name, tok in tokenizers]
    # side by side, each stage starts at one height in every pipeline (compare across);
    # on a phone the pipelines stack and each keeps its own spacing
    heights = [_pipeline_canvas(stages, name, width)[1] for stages, name in staged]
    pitch = [max(h) for h in zip(*heights, strict=True)]
    panels = [_pipeline_canvas(stages, name, width, pitch)[0] for stages, name in staged]
    narrow = [_pipeline_canvas(stages, name, width)[0] for stages, name in staged]
    prefixes = [f"{i}." for i in range(len(panels))]
    side_by_side = sum(p.width + 2 * PAD for p in panels) + 24 * (len(panels) - 1)  # flex gap
    return Diagram(hstack("Tokenizer pipelines", panels, 28, prefixes), panels, narrow=narrow,
                   narrow_below=side_by_side)


@dataclass(frozen=True)
class MergeNode:
    """One token of a merge tree: a byte (a leaf) or the merge that built it."""

    token_id: int
    text: bytes  # the bytes the token stands for
    children: tuple[MergeNode, ...]  # () for a byte; (left, right) for a merge

    @property
    def height(self) -> int:
        """0 for a byte, else one more than the taller child."""
        return 1 + max(c.height for c in self.children) if self.children else 0

    def leaves(self) -> list[MergeNode]:
        return [leaf for c in self.children for leaf in c.leaves()] if self.children else [self]

    def merges(self) -> list[MergeNode]:
        """Every inner node, children before parents."""
        return [m for c in self.children for m in c.merges()] + ([self] if self.children else [])


MAX_TREE_BYTES = 16  # wider words would not fit the page's column
LEAF_PITCH = 40.0  # the least room per byte: two neighbouring merges' labels stay apart


def merge_forest(tokenizer: BPETokenizer, word: str) -> list[MergeNode]:
    """The merge trees of the tokens of `word`, from the tokenizer's own merges.

    Each token id of `tokenizer.encode_ordinary(word)` is unfolded through the merge that made
    it, down to single bytes. Raises if the leaves are not the word's bytes (they always are
    for a consistent tokenizer: the check guards the drawing).
    """
    if not isinstance(tokenizer, BPETokenizer):
        raise TypeError(f"merge_tree needs a BPETokenizer, got {type(tokenizer).__name__}")
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    raw = word.encode("utf-8")
    if not 1 <= len(raw) <= MAX_TREE_BYTES:
        raise ValueError(f"word must be 1 to {MAX_TREE_BYTES} bytes long, got {len(raw)} bytes:"
                         f" {word[:40]!r}")
    parts = {new_id: pair for pair, new_id in tokenizer.merges.items()}

    def unfold(token_id: int) -> MergeNode:
        if token_id in parts:
            left, right = parts[token_id]
            return MergeNode(token_id, tokenizer.vocab[token_id], (unfold(left), unfold(right)))
        if token_id >= 256:
            raise ValueError(f"token {token_id} is neither a byte nor a merge")
        return MergeNode(token_id, bytes([token_id]), ())

    forest = [unfold(i) for i in tokenizer.encode_ordinary(word)]
    if b"".join(leaf.text for tree in forest for leaf in tree.leaves()) != raw:
        raise RuntimeError("the merge trees do not spell the word's bytes")
    return forest


LEVEL = 62.0  # vertical room between two levels of the tree


def merge_tree(tokenizer: BPETokenizer, word: str, title: str | None = None) -> Diagram:
    """The merge trees of one word: bytes at the bottom, each merge above the two tokens it
    joined (labelled with its id, the rank at which encoding applies it), the tokens that
    `encode` returns on top. Each node's label is recorded with key f"node.{token id}"."""
    forest = merge_forest(tokenizer, word)
    title = title or f"BPE merge tree of {visible(word)!s}"
    c = Canvas(title)
    top = heading(c, title, 0, 0)
    tall = max(tree.height for tree in forest)
    base = top + 20 + tall * LEVEL  # the top of the leaves' row
    centre: dict[int, float] = {}  # id(node) -> x of its centre
    x = 0.0
    widths: dict[int, float] = {}

    def width(node: MergeNode) -> float:
        return max(text_width(visible(node.text), SMALL, mono=True) + 12, 24.0)

    for tree in forest:
        for leaf in tree.leaves():
            widths[id(leaf)] = width(leaf)
            centre[id(leaf)] = x + max(widths[id(leaf)] + 8, LEAF_PITCH) / 2
            x += max(widths[id(leaf)] + 8, LEAF_PITCH)
        x += 14  # a wider gap between two tokens' trees

    def place(node: MergeNode) -> None:
        for child in node.children:
            place(child)
        if node.children:
            centre[id(node)] = sum(centre[id(ch)] for ch in node.children) / 2
            widths[id(node)] = width(node)

    def y_of(node: MergeNode, root: bool) -> float:
        return top + 20 if root else base - node.height * LEVEL

    def draw_node(node: MergeNode, root: bool) -> None:
        cx, w, y = centre[id(node)], widths[id(node)], y_of(node, root)
        is_token = root or any(node is t for t in forest)  # a token encode() returns
        kind = "head" if is_token else ("embed" if node.children else "data")
        c.box(cx - w / 2, y, w, CHIP_H, kind, radius=3)
        c.text(cx, y + CHIP_H / 2 + 4.5, visible(node.text), SMALL, mono=True,
               key=f"node.{node.token_id}")
        if node.children:
            c.text(cx, y - 5, f"merge {node.token_id}", SMALL, key=f"merge.{node.token_id}",
                   shape=(node.token_id,))
            for side, child in zip((-1, 1), node.children, strict=True):
                cy = y_of(child, False) - (19 if child.children else 0)  # above its label
                # each part's arrow ends at its own quarter of the box: two heads never meet
                end = cx + side * w / 4
                c.line([(centre[id(child)], cy), (end, y + CHIP_H)], arrow=True, width=1.2,
                       edge=f"tokenizer.merges: token {child.token_id} is a part of merge "
                            f"{node.token_id}")

    for tree in forest:
        place(tree)
        if not tree.children:  # a byte that no merge took: leaf and token at once
            draw_node(tree, False)
            continue
        for node in tree.merges()[:-1] + tree.leaves():
            draw_node(node, False)
        draw_node(tree, True)
    note(c, 0, base + CHIP_H + 22, f"{len(word.encode('utf-8'))} bytes at the bottom; "
         f"{len(forest)} token{'s' if len(forest) > 1 else ''} on top")
    return Diagram(c)


__all__ = ["STAGES", "MergeNode", "Stage", "merge_forest", "merge_tree", "pipeline_stages",
           "pipelines_side_by_side", "tokenizer_pipeline"]
