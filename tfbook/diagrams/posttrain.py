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

import torch
from torch import Tensor

from tfbook.diagrams._shared import CHIP_GAP, CHIP_H
from tfbook.diagrams.dataflow import Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.inspect import shown
from tfbook.diagrams.layout import Rect, wrap_words
from tfbook.diagrams.svg import COLOURS, FONT, SANS_WIDTH, SMALL, Canvas, _num, text_width

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


# --- DPO's pair of policies ---------------------------------------------------------------

PANEL = 312.0  # the DPO figure's boxes' width: with the arrows beside them, a phone's column
# (358 px) holds it
HALF_GAP = 16.0  # between the policy's and the reference's box
SIDE = 16.0  # how far the arrows routed around the sections run beside them
MOST_QUOTED = 90  # a prompt or completion longer than this is cut with "…"
# what the policy and the reference are: the LoRA path (one model, adapters on and off) or
# an explicit reference model
REFERENCES = {"adapters": ("LoRA on, trained", "LoRA off, frozen"),
              "copy": ("trained", "a frozen copy")}
# dpo_loss's steps, by their order among the calls of one operation: the log-ratios are its
# first two subtractions, the margin inside the loss (beta times their difference) its first
# multiplication, the logged rewards the next two and the logged margin the fourth
# subtraction (named as they are made, so that what is computed from them is seen; each is
# checked to be the value, or the very tensor of DPOOutput, it is said to be)
DPO_STEPS = {"sub": (("out", "chosen_logratio"), ("out", "rejected_logratio"), None,
                     ("out", "margin")),
             "mul": (("out", "logits"), ("out", "chosen_reward"), ("out", "rejected_reward"))}


def _fmt(value: float) -> str:
    """A number as the figure writes it: 4 significant digits, a true minus sign.

    >>> _fmt(-21.37128), _fmt(0.0286954), _fmt(0.5)
    ('−21.37', '0.0287', '0.5')
    """
    return f"{value:.4g}".replace("-", "−")


def _quoted(text: str, width: float) -> list[str]:
    """A prompt or completion in quotes, control characters escaped, at most MOST_QUOTED
    characters, right-to-left runs isolated, wrapped to `width` (a word too long for a line
    is cut into pieces that fit)."""
    from tfbook.diagrams.inspect import _isolated

    if not isinstance(text, str):
        raise TypeError(f"a prompt or completion must be a str, got {type(text).__name__}")
    flat = "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)
    if len(flat) > MOST_QUOTED:
        flat = flat[: MOST_QUOTED - 1] + "…"
    per_line = int(width // (SMALL * SANS_WIDTH))  # characters of the widest estimate
    words = [w[k: k + per_line] for w in flat.split(" ") if w
             for k in range(0, len(w), per_line)]
    return wrap_words("“" + _isolated(" ".join(words)) + "”", width, SMALL)


def _fitted(line: str, width: float) -> list[str]:
    """A worked line "= a × (b − c) = d" on two lines, cut before its last " = ", when it is
    wider than `width` in monospace."""
    if text_width(line, SMALL, mono=True) <= width or " = " not in line:
        return [line]
    head, result = line.rsplit(" = ", 1)
    return [head, "= " + result]


def _panel(c: Canvas, x: float, y: float, w: float, kind: str,
           lines: list[tuple[str | list[str], str]], dashed: bool = False,
           height: float | None = None) -> Rect:
    """A box with lines of text centred in it; each line (text, style) where style is
    "title" (bold), "mono" (numbers) or "note". Returns its rectangle."""
    steps = {"title": FONT + 5, "mono": SMALL + 5, "note": SMALL + 5}
    flat = [(line, style) for text, style in lines
            for line in (text if isinstance(text, list) else [text])]
    # a subscript hangs below its line: the line after it starts lower
    gaps = [steps[style] + (3 if k and "_{" in flat[k - 1][0] else 0)
            for k, (_, style) in enumerate(flat)]
    need = 8 + sum(gaps)
    h = max(need, height or 0.0)
    c.box(x, y, w, h, kind, dashed=dashed)
    base = y + 6 + (h - need) / 2
    for (line, style), gap in zip(flat, gaps, strict=True):
        base += gap
        c.text(x + w / 2, base - 4, line, FONT if style == "title" else SMALL,
               mono=style == "mono", bold=style == "title", sub=True)
    return Rect(x, y, w, h)


class _Keeping(Recorder):
    """The dataflow recorder that also keeps the tensors it names."""

    def __init__(self) -> None:
        super().__init__(None)
        self.kept: dict[str, Tensor] = {}

    def name(self, tensor: Tensor, name: str) -> None:
        super().name(tensor, name)
        self.kept[self.prefix + name] = tensor


def _logps(name: str, value: object) -> Tensor:
    """A (B,) float tensor of summed log-probabilities from a number, a 0-d or a 1-d tensor."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Tensor):
        raise TypeError(f"{name} must be a summed log-probability: a number or a tensor of "
                        f"shape (B,), got {type(value).__name__}")
    t = value.detach() if isinstance(value, Tensor) else torch.tensor([float(value)],
                                                                       dtype=torch.float64)
    if not t.dtype.is_floating_point or t.dim() > 1 or t.numel() == 0:
        raise TypeError(f"{name} must be a number or a non-empty floating tensor of shape "
                        f"(B,), got {t.dtype} of shape {tuple(t.shape)}")
    t = t.reshape(-1)
    if not torch.isfinite(t).all() or (t > 0).any():
        raise ValueError(f"{name} must hold finite log-probabilities (each <= 0), got "
                         f"{t.tolist()!r:.80}")
    return t


def dpo_pair_figure(policy_chosen: Tensor | float, policy_rejected: Tensor | float,
                    ref_chosen: Tensor | float, ref_rejected: Tensor | float,
                    beta: float = 0.1, pair: int = 0, prompt: str | None = None,
                    chosen: str | None = None, rejected: str | None = None,
                    reference: str = "adapters", title: str | None = None) -> Diagram:
    """DPO's loss on one preference pair: the chosen and the rejected completion, each scored
    by the policy and by the reference, the implicit rewards, the margin and the loss.

    The four summed log-probs are numbers or (B,) tensors (`preference_logps` of the policy
    and, under `adapters_disabled` or from a reference model, of the reference); `pair`
    picks the pair drawn. `tfbook.posttrain.dpo.dpo_loss` runs on them while the figure is
    drawn: every number on it is that function's, and its arrows from the log-probs to the
    loss are held against the computation it recorded. `prompt`, `chosen` and `rejected`
    are the pair's texts, shown quoted (optional); `reference` says what the reference is:
    "adapters" (the policy with its LoRA adapters off) or "copy" (a frozen copy). The Diagram
    also carries `values` (each quantity drawn, as a float) and `flow` (the recorded
    computation).
    """
    from tfbook.posttrain.dpo import dpo_loss

    tensors = {n: _logps(n, v) for n, v in (
        ("policy_chosen", policy_chosen), ("policy_rejected", policy_rejected),
        ("ref_chosen", ref_chosen), ("ref_rejected", ref_rejected))}
    sizes = {n: t.numel() for n, t in tensors.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"the four log-probs must hold as many pairs, got {sizes}")
    B = sizes["policy_chosen"]
    if isinstance(pair, bool) or not isinstance(pair, numbers.Integral) or not 0 <= pair < B:
        raise ValueError(f"pair must be an int in [0, {B}), got {pair!r:.40}")
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {list(REFERENCES)}, got {reference!r:.40}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    one = {n: t[pair: pair + 1].clone() for n, t in tensors.items()}  # (1,) each
    with torch.no_grad(), _Keeping() as rec:
        for n, t in one.items():
            rec.name(t, n)
        with rec.steps(DPO_STEPS):
            out = dpo_loss(one["policy_chosen"], one["policy_rejected"], one["ref_chosen"],
                           one["ref_rejected"], beta=beta)
        rec.name(out.loss, "loss")
    _check_steps(rec.kept, one, beta, out)
    batch_loss = None
    if B > 1:
        batch_loss = float(dpo_loss(*tensors.values(), beta=beta).loss)
    values = {n: float(t) for n, t in one.items()}
    values |= {"chosen_reward": float(out.chosen_rewards), "beta": float(beta),
               "rejected_reward": float(out.rejected_rewards),
               "margin": float(out.margins), "loss": float(out.loss)}
    if batch_loss is not None:
        values["batch_loss"] = batch_loss
    title = title or "DPO on one preference pair: the policy and the reference score both " \
                     "completions"
    c = _dpo_canvas(title, values, prompt, chosen, rejected, REFERENCES[reference], B, pair)
    c.check_wiring(rec.flow, omit=[("chosen_logratio", "chosen_reward"),
                                   ("rejected_logratio", "rejected_reward")])
    d = Diagram(c)
    d.values, d.flow = values, rec.flow
    return d


def _check_steps(kept: dict[str, Tensor], one: dict[str, Tensor], beta: float,
                 out: object) -> None:
    """The tensors named by their step order are what DPO_STEPS says they are."""
    for name, field in (("chosen_reward", "chosen_rewards"),
                        ("rejected_reward", "rejected_rewards"), ("margin", "margins")):
        if kept.get(name) is not getattr(out, field):
            raise RuntimeError(f"dpo_loss no longer returns as {field} the step DPO_STEPS "
                               f"names {name} (its order of operations changed): update "
                               "DPO_STEPS")
    expected = {"chosen_logratio": one["policy_chosen"] - one["ref_chosen"],
                "rejected_logratio": one["policy_rejected"] - one["ref_rejected"]}
    expected["logits"] = beta * (expected["chosen_logratio"] - expected["rejected_logratio"])
    for name, value in expected.items():
        if name not in kept or not torch.equal(kept[name], value):
            raise RuntimeError(f"dpo_loss no longer computes {name} where DPO_STEPS says "
                               "(its order of subtractions and multiplications changed): "
                               "update DPO_STEPS")


def _dpo_canvas(title: str, v: dict[str, float], prompt: str | None, chosen: str | None,
                rejected: str | None, notes: tuple[str, str], B: int, pair: int) -> Canvas:
    c = Canvas(title)
    W, inner = PANEL, PANEL - 24
    cell = (W - HALF_GAP) / 2
    beta = _fmt(v["beta"])
    lines: list[tuple[str | list[str], str]] = [("prompt x", "title")]
    if prompt is not None:
        lines.append((_quoted(prompt, inner), "note"))
    top = _panel(c, 0, 0, W, "data", lines)
    y = top.bottom + 26
    rewards: list[Rect] = []
    for name, text, w in (("chosen", chosen, "w"), ("rejected", rejected, "l")):
        seq_lines: list[tuple[str | list[str], str]] = [(f"x + {name} y_{{{w}}}", "title")]
        if text is not None:
            seq_lines.append((_quoted(text, inner), "note"))
        seq = _panel(c, 0, y, W, "data", seq_lines)
        if name == "chosen":
            c.arrow(W / 2, top.bottom, W / 2, seq.y,
                    edge="the prompt and the chosen completion, one sequence")
        else:  # around the chosen section, on the right
            c.line([(W, top.cy), (W + SIDE, top.cy), (W + SIDE, seq.cy), (W, seq.cy)],
                   edge="the prompt and the rejected completion, one sequence")
        y = seq.bottom + 26
        cells = []
        for k, (model, sub, note, kind, dashed) in enumerate((
                ("policy", "θ", notes[0], "attn", False),
                ("reference", "ref", notes[1], "mask", True))):
            x = k * (cell + HALF_GAP)
            key = f"{'policy' if model == 'policy' else 'ref'}_{name}"
            cells.append(_panel(c, x, y, cell, kind, [
                (f"{model} π_{{{sub}}}", "title"), (note, "note"),
                (f"log π_{{{sub}}}(y_{{{w}}}|x)", "mono"), (f"= {_fmt(v[key])}", "mono")],
                dashed=dashed))
            c.line([(W / 2, seq.bottom), (W / 2, seq.bottom + 11), (x + cell / 2,
                    seq.bottom + 11), (x + cell / 2, y)],
                   edge=f"the {model} scores it: sequence_logps sums the log-probs of the "
                        "completion's tokens")
        y = cells[0].bottom + 26
        pc, rc = v[f"policy_{name}"], v[f"ref_{name}"]
        reward = _panel(c, 0, y, W, "ffn", [
            (f"reward r_{{{w}}} = β (log π_{{θ}} − log π_{{ref}})", "note"),
            (_fitted(f"= {beta} × ({_fmt(pc)} − ({_fmt(rc)})) = "
                     f"{_fmt(v[name + '_reward'])}", inner), "mono")])
        for cell_rect, source in zip(cells, ("policy_", "ref_"), strict=True):
            c.arrow(cell_rect.cx, cell_rect.bottom, cell_rect.cx, reward.y,
                    edge=(source + name, name + "_logratio"))
        rewards.append(reward)
        y = reward.bottom + 30
    r_w, r_l = rewards
    margin = _panel(c, 0, y, W, "head", [
        ("margin = r_{w} − r_{l}", "title"),
        (_fitted(f"= {_fmt(v['chosen_reward'])} − ({_fmt(v['rejected_reward'])}) = "
                 f"{_fmt(v['margin'])}", inner), "mono")])
    c.arrow(W / 2, r_l.bottom, W / 2, margin.y,
            edge=[("rejected_logratio", "logits"), ("rejected_reward", "margin")])
    c.line([(0, r_w.cy), (-SIDE, r_w.cy), (-SIDE, margin.cy), (0, margin.cy)],
           edge=[("chosen_logratio", "logits"), ("chosen_reward", "margin")])
    y = margin.bottom + 26
    loss = _panel(c, 0, y, W, "head", [
        ("loss = −log σ(margin)", "title"),
        (_fitted(f"= −log σ({_fmt(v['margin'])}) = {_fmt(v['loss'])}", inner), "mono")])
    c.arrow(W / 2, margin.bottom, W / 2, loss.y, edge=("logits", "loss"))
    y = loss.bottom + 8
    words = [f"β = {beta}. Each log π(y|x) is summed over the completion's tokens; the "
             "reference's box is dashed: it gets no gradient. r_{w} and r_{l} are DPO's implicit "
             "rewards.",
             "The loss falls as the margin grows: the policy raises the chosen completion "
             "against the reference more than the rejected one."]
    if B > 1:
        words.append(f"Pair {pair} of {B} (counted from 0); the batch's loss is the mean "
                     f"over its {B} pairs: {_fmt(v['batch_loss'])}.")
    for note in words:
        lines_ = wrap_words(note, W, SMALL)
        c.text(0, y + SMALL + 4, lines_, SMALL, anchor="start", sub=True)
        y += SMALL * 1.25 * len(lines_) + 10
    return c


__all__ = ["chat_mask_figure", "dpo_pair_figure", "token_roles", "token_text"]
