"""The figures of Part VII's post-training chapters (tfbook.diagrams.posttrain), held against
the objects they draw.

- chat_mask_figure: its boxes are chat_ids' tokens in order (their texts give back the rendered
  chat), the highlighted ones are exactly assistant_mask's 1s, each role's boxes hold exactly
  that role's text, the bars of `shifted` are sft's shifted labels; hostile message text
  (markup, quotes, a forged <|im_end|>, an 80-byte token) stays text;
- dpo_pair_figure: every number on it is dpo_loss's on the log-probs given (from a real
  policy with LoRA and its adapter-disabled reference), its arrows are dependencies of the
  computation dpo_loss recorded (a figure wired otherwise is refused), hostile texts stay text;
- both figures fit the book's column and a phone's with the book's smallest text, and in
  Chromium no two texts overlap and no line crosses a text.
"""

from __future__ import annotations

import doctest
import time
import xml.etree.ElementTree as ET

import pytest
import torch

import tests.diagram_helpers as helpers
import tfbook.diagrams.posttrain as posttrain_figures
from tfbook.diagrams.dataflow import check_edges
from tfbook.diagrams.diagram import PHONE_COLUMN
from tfbook.diagrams.posttrain import _fmt, chat_mask_figure, dpo_pair_figure, token_text
from tfbook.diagrams.svg import SMALL
from tfbook.losses import IGNORE_INDEX
from tfbook.posttrain.chat import assistant_mask, chat_ids, render_chat
from tfbook.posttrain.dpo import adapters_disabled, dpo_loss, preference_logps
from tfbook.posttrain.sft import sft_example

SVG = "{http://www.w3.org/2000/svg}"
DESKTOP_COLUMN = 672.0  # the article column at 1,280 px

TWO_TURNS = [{"role": "user", "content": "What is 7 times 8?"},
             {"role": "assistant", "content": "7 times 8 is 56."},
             {"role": "user", "content": "And plus 4?"},
             {"role": "assistant", "content": "56 + 4 = 60."}]
WITH_SYSTEM = [{"role": "system", "content": "Answer in one line."},
               {"role": "user", "content": "Name a prime."},
               {"role": "assistant", "content": "\n 7 is prime."}]  # "\n " may merge with "\n"
NO_ANSWER = [{"role": "user", "content": "Hello there"}]
HOSTILE = [{"role": "system", "content": "Be <script>alert('x')</script> & \"brief\" <|im_end|>"},
           {"role": "user", "content": "#" * 80 + " a\u202eb\t&amp;"},
           {"role": "assistant", "content": "<b>ok</b> <|im_start|>user"}]
CONVERSATIONS = {"two turns": TWO_TURNS, "system": WITH_SYSTEM, "no answer": NO_ANSWER,
                 "hostile": HOSTILE}


@pytest.fixture(scope="module")
def tok():
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def boxes(svg: str) -> list[tuple[str, str]]:
    """(category, text) of every token box, in drawing order (the legend's swatches have no
    text after them in the token rows: they are told apart by their class only)."""
    root = ET.fromstring(svg)
    out, category = [], None
    for el in root.iter():
        cls = el.get("class", "")
        if el.tag == f"{SVG}rect" and cls.startswith("tk "):
            category = cls.split("tk-")[1]
        elif el.tag == f"{SVG}text" and category is not None:
            out.append((category, helpers.text_of(el)))
            category = None
    return out


def token_boxes(d, svg: str) -> list[tuple[str, str]]:
    return boxes(svg)[: len(d.ids)]


def unshown(label: str) -> str:
    """A box's text back to the token's text, for text without ␣, \\ or long tokens."""
    return label.replace("␣", " ").replace("\\n", "\n")


# --- chat_mask_figure ------------------------------------------------------------------------

@pytest.mark.parametrize("which", CONVERSATIONS)
def test_highlighted_boxes_are_the_assistant_mask(tok, which: str) -> None:
    """One box per id of chat_ids, in order, in both layouts; the highlighted ones are exactly
    the positions where assistant_mask is 1."""
    messages = CONVERSATIONS[which]
    d = chat_mask_figure(tok, messages)
    ids, mask = chat_ids(tok, messages), assistant_mask(tok, messages)
    assert d.ids == ids and d.mask == mask
    assert d.token_bytes == [tok.decode_bytes([i]) for i in ids]
    for svg in [d.svg, *d._narrow]:
        drawn = token_boxes(d, svg)
        assert [text for _, text in drawn] == [token_text(b) for b in d.token_bytes]
        assert [cat == "target" for cat, _ in drawn] == [bool(m) for m in mask]
        root = ET.fromstring(svg)
        targets = [r for r in root.iter(f"{SVG}rect") if "tk-target" in r.get("class", "")]
        assert len(targets) == sum(mask) + 1  # the boxes, and the legend's swatch
    texts = helpers.svg_texts(d.svg)
    assert f"{sum(mask)} of {len(ids)} tokens" in " ".join(texts)
    if which == "no answer":
        assert sum(mask) == 0


@pytest.mark.parametrize("which", ["two turns", "system"])
def test_box_texts_give_back_the_rendered_chat(tok, which: str) -> None:
    """The boxes' texts, read from the SVG and joined, are render_chat's string; and each
    role's boxes hold exactly that role's text (the system prompt SmolLM2 adds included)."""
    from tfbook.checkpoints.smollm2 import DEFAULT_SYSTEM_PROMPT

    messages = CONVERSATIONS[which]
    d = chat_mask_figure(tok, messages)
    rendered = render_chat(messages)
    assert b"".join(d.token_bytes) == rendered.encode()
    assert "".join(unshown(text) for _, text in token_boxes(d, d.svg)) == rendered
    by_role = {cat: b"".join(b for b, c in zip(d.token_bytes, d.categories, strict=True)
                             if c == cat) for cat in ("system", "user", "target")}
    system = [m["content"] for m in messages if m["role"] == "system"] or [DEFAULT_SYSTEM_PROMPT]
    assert by_role["system"].decode() == "".join(system)
    assert by_role["user"].decode() == "".join(m["content"] for m in messages
                                               if m["role"] == "user")
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    # the targets: each answer and its <|im_end|>; the answer opening with "\n " shares its
    # first token "\n\n " with the role's newline, and assistant_mask marks that token
    shared = "\n" if which == "system" else ""
    assert by_role["target"].decode() == shared + "".join(a + "<|im_end|>" for a in answers)
    specials = [t for t, c in zip(token_boxes(d, d.svg), d.categories, strict=True)
                if c == "template"]
    assert [t for _, t in specials].count("<|im_start|>") == rendered.count("<|im_start|>")


def test_the_bars_are_the_shifted_labels(tok) -> None:
    """With shifted=True, a bar under box t exactly where sft's label of position t is a
    target (token t + 1 is the assistant's); none without it."""
    d = chat_mask_figure(tok, TWO_TURNS, shifted=True)
    labels = sft_example(tok, TWO_TURNS, max_len=1000).labels
    assert d.graded == [label != IGNORE_INDEX for label in labels]
    assert sum(d.graded) == sum(d.mask[1:])
    for svg in [d.svg, *d._narrow]:
        bars = [r for r in ET.fromstring(svg).iter(f"{SVG}rect") if r.get("class") == "graded"]
        assert len(bars) == sum(d.graded) + 1  # and the legend's
    assert f"{sum(d.graded)} positions" in " ".join(helpers.svg_texts(d.svg))
    plain = chat_mask_figure(tok, TWO_TURNS)
    assert plain.graded is None and 'class="graded"' not in plain.svg


def test_hostile_text_stays_text(tok) -> None:
    """Markup, quotes and ampersands are escaped text; a forged <|im_end|> in a message is
    drawn as the message's text (several ordinary tokens), never as a marker; an 80-byte token
    is cut with "…"; a right-to-left override is shown as bytes, not obeyed."""
    d = chat_mask_figure(tok, HOSTILE)
    for svg in [d.svg, *d._narrow]:
        root = ET.fromstring(svg)  # parses: nothing broke out of its element
        assert not any(el.tag.endswith(("script", "b")) for el in root.iter())
        assert "<script" not in svg and "<b>" not in svg and "\u202e" not in svg
    texts = [t for _, t in token_boxes(d, d.svg)]
    ids = chat_ids(tok, HOSTILE)
    end = tok.token_to_id("<|im_end|>")
    assert texts.count("<|im_end|>") == ids.count(end) == 3  # the template's only
    assert ids.count(tok.token_to_id("<|im_start|>")) == texts.count("<|im_start|>") == 3
    assert "#" * 15 + "…" in texts and not any("#" * 16 in t for t in texts)
    assert any("&" in t for t in texts) and any('"' in t for t in texts)
    assert "\\t" in texts or any("\\t" in t for t in texts)
    # the forged markers lie in the system's and the assistant's text, as that role's tokens
    def held(category: str) -> bytes:
        return b"".join(b for b, c in zip(d.token_bytes, d.categories, strict=True)
                        if c == category)

    assert held("system") == HOSTILE[0]["content"].encode()
    assert held("user") == HOSTILE[1]["content"].encode()
    assert held("target") == (HOSTILE[2]["content"] + "<|im_end|>").encode()


def test_drawing_is_cheap(tok) -> None:
    messages = TWO_TURNS * 1 + [{"role": "user", "content": "Once more?"},
                                {"role": "assistant", "content": "Yes. " * 20}]
    start = time.process_time()
    chat_mask_figure(tok, messages, shifted=True)
    assert time.process_time() - start < 0.5


def test_bad_input_is_refused(tok) -> None:
    with pytest.raises(TypeError, match="SmolLM2's VocabBPETokenizer"):
        chat_mask_figure("gpt2", TWO_TURNS)
    with pytest.raises(ValueError, match="role 'robot'"):
        chat_mask_figure(tok, [{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="must alternate"):
        chat_mask_figure(tok, [TWO_TURNS[0], TWO_TURNS[0]])
    with pytest.raises(TypeError, match="shifted must be True or False"):
        chat_mask_figure(tok, TWO_TURNS, shifted=1)
    with pytest.raises(ValueError, match="draws at most max_tokens=20"):
        chat_mask_figure(tok, TWO_TURNS, max_tokens=20)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        chat_mask_figure(tok, TWO_TURNS, max_tokens=0)
    with pytest.raises(TypeError, match="title must be a str"):
        chat_mask_figure(tok, TWO_TURNS, title=3)
    with pytest.raises(TypeError, match="a token must be bytes"):
        token_text("x")


# --- dpo_pair_figure -------------------------------------------------------------------------

def policy_and_pairs():
    """A tiny tfbook GPT with LoRA adapters (B moved off zero, so policy != reference) and two
    preference pairs of ids with their completion masks."""
    from tfbook.lora import add_lora, lora_layers
    from tfbook.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = add_lora(GPT(GPTConfig(max_len=16, vocab_size=32, n_layers=1, n_heads=2,
                                   d_model=16)).eval(), r=2, alpha=4)
    for layer in lora_layers(model).values():
        torch.nn.init.normal_(layer.lora_B, std=0.3)
    g = torch.Generator().manual_seed(1)
    chosen, rejected = torch.randint(0, 32, (2, 9), generator=g), torch.randint(0, 32, (2, 9),
                                                                                generator=g)
    mask = torch.zeros(2, 9, dtype=torch.long)
    mask[:, 4:] = 1
    return model, chosen, mask, rejected, mask.clone()


def texts_of(d) -> str:
    return " ".join(helpers.svg_texts(d.svg))


def test_the_numbers_are_dpo_loss_on_a_real_policy_and_its_reference() -> None:
    """Log-probs of a LoRA policy and of the same model with its adapters off: every number
    the figure writes is dpo_loss's, for the pair drawn and (its note) for the batch."""
    model, *batch = policy_and_pairs()
    with torch.no_grad():
        pc, pr = preference_logps(model, *batch)
        with adapters_disabled(model):
            rc, rr = preference_logps(model, *batch)
    assert not torch.equal(pc, rc)  # the adapters change the scores
    for pair in (0, 1):
        d = dpo_pair_figure(pc, pr, rc, rr, beta=0.5, pair=pair)
        out = dpo_loss(pc[pair:pair + 1], pr[pair:pair + 1], rc[pair:pair + 1],
                       rr[pair:pair + 1], beta=0.5)
        expected = {"policy_chosen": pc[pair], "policy_rejected": pr[pair],
                    "ref_chosen": rc[pair], "ref_rejected": rr[pair],
                    "chosen_reward": out.chosen_rewards[0],
                    "rejected_reward": out.rejected_rewards[0], "margin": out.margins[0],
                    "loss": out.loss, "batch_loss": dpo_loss(pc, pr, rc, rr, beta=0.5).loss}
        for name, value in expected.items():
            assert d.values[name] == float(value), name  # bit for bit: the same function
        texts = texts_of(d)
        v = {n: _fmt(float(x)) for n, x in expected.items()}
        for side in ("chosen", "rejected"):
            assert f"= {v['policy_' + side]}" in texts and f"= {v['ref_' + side]}" in texts
            assert (f"= 0.5 × ({v['policy_' + side]} − ({v['ref_' + side]})) = "
                    f"{v[side + '_reward']}") in texts
        assert f"= {v['chosen_reward']} − ({v['rejected_reward']}) = {v['margin']}" in texts
        assert f"= −log σ({v['margin']}) = {v['loss']}" in texts
        assert f"Pair {pair} of 2" in texts and f"its 2 pairs: {v['batch_loss']}." in texts
        assert d.wired


def test_arrows_are_the_dependencies_dpo_loss_computes() -> None:
    """The arrows from the log-probs to the loss are the recorded dependencies of dpo_loss:
    each reward from its own two log-probs only, the margin from both, the loss from the
    margin; an arrow wired otherwise is refused."""
    d = dpo_pair_figure(-4.2, -6.8, -4.5, -6.6)
    data = [e for e in d.edges]
    assert ("policy_chosen", "chosen_logratio") in data and ("ref_chosen",
                                                             "chosen_logratio") in data
    assert ("policy_rejected", "rejected_logratio") in data
    assert ("logits", "loss") in data and ("chosen_reward", "margin") in data
    assert d.flow.sources("chosen_logratio") == {"policy_chosen", "ref_chosen"}
    assert d.flow.depends("loss", "policy_rejected")
    assert not d.flow.depends("chosen_reward", "policy_rejected")
    omit = [("chosen_logratio", "chosen_reward"), ("rejected_logratio", "rejected_reward")]
    check_edges(data, d.flow, omit=omit)
    for wrong in [("policy_rejected", "chosen_logratio"), ("chosen_reward", "loss"),
                  ("policy_chosen", "logits")]:
        with pytest.raises(ValueError, match="disagree with the computation"):
            check_edges([*data, wrong], d.flow, omit=omit)
    with pytest.raises(ValueError, match="missing: chosen_logratio -> logits"):
        check_edges([e for e in data if e != ("chosen_logratio", "logits")], d.flow,
                    omit=omit)


def test_a_step_named_wrongly_is_refused(monkeypatch) -> None:
    """If dpo_loss's steps were not where DPO_STEPS says (swap the two log-ratios), the figure
    refuses to draw instead of labelling one tensor with another's name."""
    steps = dict(posttrain_figures.DPO_STEPS)
    first, second, *rest = steps["sub"]
    steps["sub"] = (second, first, *rest)
    monkeypatch.setattr(posttrain_figures, "DPO_STEPS", steps)
    with pytest.raises(RuntimeError, match="update DPO_STEPS"):
        dpo_pair_figure(-4.2, -6.8, -4.5, -6.6)


def test_both_rewards_falling_and_the_reference_kinds() -> None:
    """When the policy lowers both completions below the reference, both rewards are negative
    and the figure says so with minus signs; an explicit reference is worded as a copy."""
    d = dpo_pair_figure(-30.0, -45.0, -20.0, -25.0, beta=0.1)
    assert d.values["chosen_reward"] < 0 and d.values["rejected_reward"] < 0
    assert d.values["margin"] > 0  # and yet the margin grew: the loss falls
    texts = texts_of(d)
    assert "= 0.1 × (−30 − (−20)) = −1" in texts and "= 0.1 × (−45 − (−25)) = −2" in texts
    assert "LoRA on, trained" in texts and "LoRA off, frozen" in texts
    copy = texts_of(dpo_pair_figure(-30.0, -45.0, -20.0, -25.0, reference="copy"))
    assert "a frozen copy" in copy and "LoRA" not in copy


HOSTILE_PAIR = dict(prompt="<script>alert('x')</script> & \"q\" " * 4,
                    chosen="שלום\n<b>bold</b>", rejected="x" * 200)


def test_hostile_pair_texts_stay_text() -> None:
    d = dpo_pair_figure(-12.5, -14.0, -12.0, -13.0, **HOSTILE_PAIR)
    root = ET.fromstring(d.svg)
    assert not any(el.tag.endswith(("script", "b")) for el in root.iter())
    assert "<script" not in d.svg and "<b>" not in d.svg
    texts = texts_of(d)
    assert "“<script>alert('x')</script>" in texts and '& "q"' in texts
    assert "\\n<b>bold</b>" in texts  # the newline shown, the markup as text
    assert "x" * 89 + "…" in texts.replace(" ", "") and "x" * 90 not in texts.replace(" ", "")


def test_dpo_bad_input_is_refused() -> None:
    ok = dict(policy_chosen=torch.tensor([-4.0, -5.0]), policy_rejected=torch.tensor([-6.0, -7.0]),
              ref_chosen=torch.tensor([-4.5, -5.5]), ref_rejected=torch.tensor([-6.5, -7.5]))
    with pytest.raises(ValueError, match="as many pairs"):
        dpo_pair_figure(**{**ok, "ref_rejected": torch.tensor([-1.0])})
    with pytest.raises(ValueError, match=r"pair must be an int in \[0, 2\)"):
        dpo_pair_figure(**ok, pair=2)
    with pytest.raises(ValueError, match="each <= 0"):
        dpo_pair_figure(**{**ok, "policy_chosen": torch.tensor([0.5, -1.0])})
    with pytest.raises(ValueError, match="finite log-probabilities"):
        dpo_pair_figure(**{**ok, "ref_chosen": torch.tensor([float("nan"), -1.0])})
    with pytest.raises(TypeError, match="summed log-probability"):
        dpo_pair_figure(**{**ok, "policy_chosen": True})
    with pytest.raises(TypeError, match="floating tensor of shape"):
        dpo_pair_figure(**{**ok, "policy_chosen": torch.tensor([-1, -2])})
    with pytest.raises(ValueError, match="reference must be one of"):
        dpo_pair_figure(**ok, reference="frozen")
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        dpo_pair_figure(**ok, beta=0.0)
    with pytest.raises(TypeError, match="a prompt or completion must be a str"):
        dpo_pair_figure(**ok, prompt=3)


def test_dpo_drawing_is_cheap() -> None:
    start = time.process_time()
    dpo_pair_figure(-4.2, -6.8, -4.5, -6.6, prompt="What is 7 times 8?", chosen="56.",
                    rejected="54.")
    assert time.process_time() - start < 0.5


# --- sizes, and a look in Chromium --------------------------------------------------------

def drawings(tok) -> dict[str, object]:
    return {
        "chat mask, two turns, shifted": chat_mask_figure(tok, TWO_TURNS, shifted=True),
        "chat mask, system": chat_mask_figure(tok, WITH_SYSTEM),
        "chat mask, hostile": chat_mask_figure(tok, HOSTILE, shifted=True),
        "dpo pair": dpo_pair_figure(
            torch.tensor([-4.2131, -8.0]), torch.tensor([-6.8012, -9.0]),
            torch.tensor([-4.5, -8.1]), torch.tensor([-6.62, -8.7]), beta=0.1,
            prompt="What is 7 times 8?", chosen="7 times 8 is 56.", rejected="7 times 8 is 54."),
        "dpo pair, hostile, long numbers": dpo_pair_figure(
            -12345.678, -23456.789, -12345.0, -0.000123, beta=0.001234, reference="copy",
            **HOSTILE_PAIR),
    }


@pytest.fixture(scope="module")
def drawn(tok) -> dict[str, object]:
    return drawings(tok)


def test_fits_a_phone_and_the_book_column_with_legible_text(drawn) -> None:
    for name, d in drawn.items():
        assert d.wired, name
        assert d._wide_min <= DESKTOP_COLUMN, (name, d._wide_min)
        assert max(d.phone_widths) <= PHONE_COLUMN, (name, d.phone_widths)
        for svg in [d.svg, *d._narrow]:
            sizes = [float(el.get("font-size")) for el in ET.fromstring(svg).iter(f"{SVG}text")]
            assert min(sizes) >= SMALL, name


@pytest.mark.parametrize("width", [1280, 390])
def test_no_text_overlaps_and_no_line_crosses_text_in_chromium(browser, drawn, tmp_path,
                                                                width: int) -> None:
    """The figures in the book's column (672 px at 1,280 px, 358 px on a phone): nothing
    scrolls sideways, every text is at least the book's 12 px, no two texts overlap and no
    line runs through a text (the measuring script and the tests are the inspect figures')."""
    from tests.diagram_helpers import measure_in_chromium
    from tests.test_diagrams_inspect import TEXTS_JS, crosses

    measured = measure_in_chromium(browser, tmp_path, "posttrain", drawn, width, TEXTS_JS)
    for name, m in zip(drawn, measured, strict=True):
        assert m["scroll"] <= m["client"] + 1, (name, width, m["scroll"], m["client"])
        texts = [t for t in m["texts"] if not t.get("disc")]
        assert len(texts) > 20 and min(t["px"] for t in texts) >= 12 - 0.01, (name, width)
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                overlap = (min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
                           and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5)
                assert not overlap, (name, width, a["text"], b["text"], a["left"], b["left"])
        for t in texts:
            hit = [s for s in m["segments"] if crosses(s, t)]
            assert not hit, (name, width, t["text"], hit[:2])


def test_docstring_examples() -> None:
    assert doctest.testmod(posttrain_figures).failed == 0


if __name__ == "__main__":  # `python -m tests.test_diagrams_posttrain OUT.html`: to look at
    import sys
    from pathlib import Path

    from tests.diagram_gallery import page
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    Path(sys.argv[1]).write_text(page([("posttrain", n, d) for n, d in
                                       drawings(load_smollm2_tokenizer()).items()]))
