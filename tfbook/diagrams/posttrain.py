"""Figures of Part VII (after pre-training): the assistant mask over a conversation, and DPO's
pair of policies.

    from tfbook.diagrams.posttrain import chat_mask_figure, dpo_pair_figure
    chat_mask_figure(tokenizer, messages)           # every token of the chat, by role and mask
    dpo_pair_figure(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=0.1)

`chat_mask_figure` draws a conversation as SmolLM2's chat template lays it out
(`tfbook.posttrain.chat.chat_ids`): one box per token, a new row after every token that ends
in a newline (so the rows follow the rendered text) and wherever the column is full. Each box
shows its token as a reader can see it (a space as ␣, a newline as \\n, a special token such as
<|im_start|> as itself, a long token cut with "…"), tinted by what it is: the template's own
tokens (special tokens, role names, newlines), the system's text, the user's text, and, drawn
strongest, the training targets, the ids where `assistant_mask` is 1. With `shifted=True` a bar
under a box marks a position whose label is a target (`tfbook.posttrain.sft.shifted_labels`:
position t is graded on token t + 1). Roles are read from the ids (a turn opens at the
<|im_start|> id, its role runs to the first newline); a forged "<|im_end|>" in a message is
ordinary text, and is drawn as the message's text, not as a marker.

`dpo_pair_figure` draws DPO's loss for one preference pair (Rafailov et al. 2023): the prompt
with its chosen and its rejected completion, each scored by the policy (LoRA adapters on,
trained) and by the reference (the same model with its adapters off, frozen), the four summed
log-probabilities, the implicit rewards beta (log pi - log pi_ref) of the chosen and the
rejected completion, their margin and the loss -log sigmoid(margin). The numbers are the ones
`tfbook.posttrain.dpo.dpo_loss` computes from the four log-probabilities given (it is run
while the figure is drawn, under a dataflow recorder), and the arrows from the log-probs to
the loss are held against that recorded computation.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from tfbook.diagrams._shared import CHIP_GAP, CHIP_H
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.inspect import shown
from tfbook.diagrams.layout import wrap_words
from tfbook.diagrams.svg import COLOURS, SMALL, Canvas, _num, text_width

# --- the assistant mask over a conversation -------------------------------------------------

MOST_CHARS = 16  # a token longer than this is cut with "…" (<jupyter_output> still fits)
WIDE = 620.0  # the token rows' width in the book's column (672 px at 1,280 px)
NARROW = 340.0  # and in a phone's (358 px)
BAR_H = 4.0  # the bar under a graded position
MOST_TOKENS = 400  # the figure refuses longer conversations: draw a part of one instead

# what a token is, and how its box is tinted: (colour, fill opacity, stroke width)
CATEGORIES = ("template", "system", "user", "target")
STYLES = {"template": (COLOURS["mask"], 0.16, 1.0), "system": (COLOURS["norm"], 0.16, 1.0),
          "user": (COLOURS["attn"], 0.16, 1.0), "target": (COLOURS["ffn"], 0.42, 2.2)}
LEGEND = {
    "template": "the template's own tokens: <|im_start|>, the role, newlines, <|im_end|>",
    "system": "the system prompt (read, not graded)",
    "user": "the user's text (read, not graded)",
}


def _token_rect(c: Canvas, x: float, y: float, w: float, h: float, category: str) -> None:
    """One token's box, tinted by its category (class "tk tk-<category>" for the tests)."""
    colour, opacity, stroke = STYLES[category]
    c.parts.append(f'<rect class="tk tk-{category}" x="{_num(x)}" y="{_num(y)}" '
                   f'width="{_num(w)}" height="{_num(h)}" rx="3" style="fill:{colour};'
                   f'fill-opacity:{opacity:g};stroke:{colour};stroke-width:{stroke:g}"/>')
    c._extend(x, y, x + w, y + h)


def _bar(c: Canvas, x: float, y: float, w: float) -> None:
    """The mark under a graded position: a short solid bar in the targets' colour."""
    colour = STYLES["target"][0]
    c.parts.append(f'<rect class="graded" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
                   f'height="{_num(BAR_H)}" rx="1" style="fill:{colour};stroke:none"/>')
    c._extend(x, y, x + w, y + BAR_H)


def token_text(token: bytes) -> str:
    """A token's bytes as the figure writes them: decoded (a stray byte as \\xNN), spaces as ␣,
    newlines as \\n, at most MOST_CHARS characters.

    >>> token_text(b"<|im_start|>"), token_text(b" the"), token_text(b"\\n"), token_text(b"\\xf0")
    ('<|im_start|>', '␣the', '\\\\n', '\\\\xf0')
    """
    if not isinstance(token, bytes):
        raise TypeError(f"a token must be bytes, got {type(token).__name__}: {token!r:.40}")
    return shown(token.decode("utf-8", errors="backslashreplace"), MOST_CHARS)


def token_roles(tokenizer: object, ids: Sequence[int]) -> list[str]:
    """The category of each id of a chat: "template" (special tokens, each turn's role and its
    newline, the newline after <|im_end|>), or the role whose text holds it ("system",
    "user", "assistant"). A token that holds the role's newline and the first bytes of the
    text (SmolLM2 can merge "\\n" with a following space) counts as the text's.

    Read from the ids alone: a turn opens at the <|im_start|> id and its role runs to the first
    newline byte; it closes at the <|im_end|> id.
    """
    return [category for category, _ in _read_turns(tokenizer, ids)]


def _read_turns(tokenizer: object, ids: Sequence[int]) -> list[tuple[str, str | None]]:
    """(category, the role of the turn it lies in, None between turns) of each id."""
    start, end = (tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>"))
    specials = set(tokenizer.special_tokens.values())
    out: list[tuple[str, str | None]] = []
    in_turn = False
    role: str | None = None  # the open turn's role, once its header "role\n" is read
    header = b""  # the header's bytes read so far
    for token_id in ids:
        if token_id == start:
            in_turn, header, role = True, b"", None
            out.append(("template", None))
        elif token_id == end:
            out.append(("template", role if in_turn else None))
            in_turn = False
        elif token_id in specials or not in_turn:  # other markers; the newline between turns
            out.append(("template", None))
        elif role is None:  # still in the header
            data = tokenizer.decode_bytes([token_id])
            cut = data.find(b"\n")
            if cut < 0:
                header += data
                out.append(("template", None))
                continue
            role = (header + data[:cut]).decode("utf-8", errors="replace")
            out.append((role if cut + 1 < len(data) else "template", role))
        else:
            out.append((role, role))
    return out


def _rows(labels: list[str], breaks: list[bool], width: float) -> list[list[tuple[int, float]]]:
    """The tokens' boxes in rows no wider than `width`: a new row after each token of `breaks`
    (one that ends a line of the text) and wherever the row is full. Each entry is (index,
    box width)."""
    rows: list[list[tuple[int, float]]] = [[]]
    used = 0.0
    for i, label in enumerate(labels):
        w = max(text_width(label, SMALL, mono=True) + 12, 22.0)
        if rows[-1] and used + CHIP_GAP + w > width:
            rows.append([])
            used = 0.0
        used += (CHIP_GAP if rows[-1] else 0.0) + w
        rows[-1].append((i, w))
        if breaks[i] and i + 1 < len(labels):
            rows.append([])
            used = 0.0
    return [r for r in rows if r]


def _mask_canvas(title: str, labels: list[str], breaks: list[bool], categories: list[str],
                 graded: list[bool] | None, width: float, n_targets: int) -> Canvas:
    c = Canvas(title)
    rows = _rows(labels, breaks, width)
    pitch = CHIP_H + CHIP_GAP + (BAR_H + 3 if graded is not None else 0)
    y = 0.0
    for r in rows:
        x = 0.0
        for i, w in r:
            _token_rect(c, x, y, w, CHIP_H, categories[i])
            c.text(x + w / 2, y + CHIP_H / 2 + 4.5, labels[i], SMALL, mono=True,
                   key=f"token.{i}")
            if graded is not None and graded[i]:
                _bar(c, x + 3, y + CHIP_H + 2, w - 6)
            x += w + CHIP_GAP
        y += pitch
    # the legend: one swatch and its words per category present, then the bars
    y += 10
    total = len(labels)
    entries = [(cat, LEGEND[cat]) for cat in ("template", "system", "user") if cat in categories]
    entries.append(("target", f"the assistant's tokens, the training targets (assistant_mask "
                              f"= 1): {n_targets} of {total} tokens"))
    if graded is not None:
        n_graded = sum(graded)
        entries.append(("bar", f"a position graded: its label is the next token, a target "
                               f"(labels shifted by one): {n_graded} positions"))
    sw, gap = 22.0, 8.0
    for cat, words in entries:
        lines = wrap_words(words, width - sw - gap, SMALL)
        if cat == "bar":
            _bar(c, 0, y + 7, sw)
        else:
            _token_rect(c, 0, y + 1, sw, 14, cat)
        c.text(sw + gap, y + 12, lines, SMALL, anchor="start")
        y += SMALL * 1.25 * len(lines) + 8
    return c


def chat_mask_figure(tokenizer: object, messages: list[dict[str, str]], shifted: bool = False,
                     title: str | None = None, max_tokens: int = MOST_TOKENS) -> Diagram:
    """A conversation in SmolLM2's chat template, one box per token, the training targets
    (`assistant_mask` = 1) drawn strongest; `shifted` also marks the positions whose label
    is a target (`shifted_labels`: position t predicts token t + 1).

    `tokenizer` is SmolLM2's (`load_smollm2_tokenizer()`), `messages` a conversation
    `chat_ids` accepts. On a phone the rows wrap at its column. The Diagram also carries `ids`,
    `mask` (the assistant mask), `categories` (each box's: "template", "system", "user" or
    "target"), `token_bytes` (each box's token) and `graded` (with `shifted`: the positions
    whose label is a target).
    """
    from tfbook.losses import IGNORE_INDEX
    from tfbook.posttrain.chat import assistant_mask, chat_ids
    from tfbook.posttrain.sft import shifted_labels

    if not isinstance(shifted, bool):
        raise TypeError(f"shifted must be True or False, got {shifted!r:.40}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) \
            or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r:.40}")
    ids = chat_ids(tokenizer, messages)  # checks the tokenizer and the conversation
    if len(ids) > max_tokens:
        raise ValueError(f"the conversation is {len(ids)} tokens and the figure draws at most "
                         f"max_tokens={max_tokens}: draw a shorter conversation (or raise "
                         f"max_tokens)")
    mask = assistant_mask(tokenizer, messages)
    categories: list[str] = []
    for i, ((role, turn), m) in enumerate(zip(_read_turns(tokenizer, ids), mask, strict=True)):
        said = f"token {i} ({tokenizer.decode_bytes([ids[i]])!r:.40})"
        if m:  # a target: the assistant's text or the <|im_end|> that closes it
            if turn != "assistant" or role not in ("assistant", "template"):
                raise RuntimeError(f"assistant_mask marks {said} as the assistant's, but it "
                                   f"lies in a {role} part of the chat")
            categories.append("target")
        elif role == "assistant":
            raise RuntimeError(f"{said} is the assistant's text but assistant_mask does not "
                               "mark it")
        elif role in ("template", "system", "user"):
            categories.append(role)
        else:
            raise RuntimeError(f"{said} lies in a turn of the unknown role {role!r:.40}")
    token_bytes = [tokenizer.decode_bytes([i]) for i in ids]
    labels = [token_text(b) for b in token_bytes]
    graded = None
    if shifted:
        graded = [label != IGNORE_INDEX for label in shifted_labels(ids, mask)]
    breaks = [b.endswith(b"\n") for b in token_bytes]
    title = title or ("A conversation in SmolLM2's chat template: the assistant's tokens are "
                      "the training targets")
    n_targets = sum(mask)
    wide = _mask_canvas(title, labels, breaks, categories, graded, WIDE, n_targets)
    narrow = _mask_canvas(title, labels, breaks, categories, graded, NARROW, n_targets)
    d = Diagram(wide, narrow=[narrow])
    d.ids, d.mask, d.categories, d.graded = ids, mask, categories, graded
    d.token_bytes = token_bytes
    return d


__all__ = ["chat_mask_figure", "token_roles", "token_text"]
