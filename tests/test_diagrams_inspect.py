"""The figures of Part VII (tfbook.diagrams.inspect): the hook points of a block and the set-up
of activation patching, held against the models they draw.

- hook_point_marks: the names and shapes are the model's (hook_names, run_with_cache), every mark
  sits on its tensor (the recorder's tensor under the mark's name equals the hook point's in
  the same pass), and the arrows are the traced dependencies;
- patching_setup: the cells it shades as "can change" are exactly the block outputs that a
  real patched run changes; its captions come from the arguments; hostile tokens stay text;
- both fit a phone's column with the book's smallest text, and in Chromium no two texts
  overlap and no line crosses a text.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import torch

import tests.diagram_helpers as helpers
import tfbook.diagrams.inspect as inspect_figures
from tfbook.diagrams import Recorder, check_edges, trace
from tfbook.diagrams.diagram import PHONE_COLUMN
from tfbook.diagrams.inspect import changed_cells, hook_point_marks, patching_setup, shown
from tfbook.diagrams.svg import SMALL
from tfbook.inspect import hook_names, hooks, patch, run_with_cache
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import llama_config, tiny_llama

SVG = "{http://www.w3.org/2000/svg}"
DESKTOP_COLUMN = 672.0  # the article column at 1,280 px
T = 7


def model(config: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


MODELS = {"gpt": lambda: model(GPTConfig.tiny()), "llama": lambda: model(tiny_llama())}


def smollm2_sized() -> GPT:
    """SmolLM2-135M's numbers of blocks, heads, key/value heads and hidden units (30, 9, 3,
    1536) on a narrow stream: the longest names and shapes the chapter can draw."""
    return model(llama_config(vocab_size=256, max_len=64, n_layers=30, d_model=72, n_heads=9,
                              n_kv_heads=3, d_ff=1536))


def ids(seed: int = 1, n: int = T) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


class Keeping(Recorder):
    """The dataflow recorder that also keeps every tensor it names, by name."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.kept: dict[str, torch.Tensor] = {}

    def name(self, tensor: torch.Tensor, name: str) -> None:
        super().name(tensor, name)
        self.kept[self.prefix + name] = tensor


def letters(label: str) -> list[str]:
    return re.match(r"\(([^)]*)\) = ", label).group(1).split(", ")


# --- hook_point_marks --------------------------------------------------------------------------

@pytest.mark.parametrize("which", MODELS)
@pytest.mark.parametrize("layer", [0, 1])
def test_names_and_shapes_are_the_models(which: str, layer: int) -> None:
    """The legend lists the block's hook names as hook_names gives them, numbered in firing
    order, each with the shape of the tensor run_with_cache keeps there."""
    m, x = MODELS[which](), ids()
    d = hook_point_marks(m, layer, x)
    names = hook_names(m, f"blocks.{layer}.*")
    assert len(names) == 11
    _, cache = run_with_cache(m, x, names=names)
    assert list(d.shape_labels) == names  # the legend, in firing order
    for name in names:
        label = d.shape_labels[name]
        assert helpers.numbers(label) == tuple(cache[name].shape), (name, label)
    texts = helpers.svg_texts(d.svg)
    found = [t for t in texts if t in names]
    assert found == names  # each name written once, in the order the points fire
    # the marks' numbers: 1..11 twice (on the block, in the legend)
    marks = [t for t in texts if t.isdigit()]
    assert sorted(marks, key=int) == [str(i) for i in range(1, 12) for _ in (0, 1)]
    # the legend letters: H_kv for grouped keys and values, F for the hidden units
    at = m.blocks[layer].attn
    kv = letters(d.shape_labels[f"blocks.{layer}.attn.k"])
    assert kv[1] == ("H_kv" if at.n_kv_heads != at.n_heads else "H")
    assert letters(d.shape_labels[f"blocks.{layer}.ff.hidden"]) == ["B", "T", "F"]
    act = m.config.activation  # the FFN's box names the model's activation
    assert (f"{act}(x W1)" if m.config.ffn == "mlp" else f"{act}(x Wgate) × x W1") in texts
    assert d.wired
    # the same figure from a trace
    assert hook_point_marks(trace(m, x), layer).svg == d.svg


@pytest.mark.parametrize("which", MODELS)
def test_each_mark_is_the_tensor_of_its_hook_point(which: str) -> None:
    """In one pass, the tensor the dataflow recorder names as a mark's tensor is the hook
    point's tensor, value for value, and no other hook point holds those values."""
    m, x = MODELS[which](), ids()
    d = hook_point_marks(m, 1, x)
    with Keeping(m) as rec:
        _, cache = run_with_cache(m, x, names=list(d.hook_tensors))
    for name, flow_name in d.hook_tensors.items():
        recorded = rec.kept[flow_name]
        assert torch.equal(recorded, cache[name]), (name, flow_name)
        same = [n for n in cache if cache[n].shape == recorded.shape
                and torch.equal(cache[n], recorded)]
        assert same == [name], (name, same)


@pytest.mark.parametrize("which", MODELS)
def test_marks_sit_where_the_computation_puts_their_tensors(which: str) -> None:
    """Each mark sits on a box of its tensor or on a stretch of stream that carries it, the
    drawing's arrows are the dependencies, and the reading that matters holds: the middle of
    the stream is the sum of the input and attention's output; the heads feed W_O."""
    m, x = MODELS[which](), ids()
    tr = trace(m, x)
    d = hook_point_marks(tr, 0)
    shown_tensors = {n for e in d.edges for n in e}
    for name, (kind, where) in d.hook_carriers.items():
        tensor = d.hook_tensors["blocks.0." + name]
        if kind == "edge":
            assert where in d.edges and where[0] == tensor, (name, where)
        else:
            assert where == tensor and tensor in shown_tensors, (name, where)
    assert {k for k, _ in d.hook_carriers.values()} == {"edge", "box"}
    assert d.hook_carriers["residual_mid"][0] == "edge"  # on the stream, after the add
    t = {n.split(".", 2)[-1]: f for n, f in d.hook_tensors.items()}
    check_edges(d.edges, tr.flow, within="blocks.0")  # every arrow, every dependency drawn
    # the sum: both the stream and attention's output go straight into residual_mid
    check_edges([(t["residual_pre"], t["residual_mid"]), (t["attn.out"], t["residual_mid"])],
                tr.flow, omit=[(t["residual_pre"], t["attn.out"])], within="blocks.0")
    assert (t["attn.out"], t["residual_mid"]) in d.edges
    assert (t["attn.heads"], t["attn.out"]) in d.edges  # A V -> W_O
    assert (t["attn.weights"], t["attn.heads"]) in d.edges
    assert (t["attn.v"], t["attn.heads"]) in d.edges and (t["attn.v"], t["attn.weights"]) \
        not in d.edges  # V goes around the softmax
    with pytest.raises(ValueError, match="disagree"):  # residual_mid is not attention's input
        check_edges([(t["residual_mid"], t["attn.q"])], tr.flow, within="blocks.0")


def test_a_mark_on_the_wrong_tensor_is_refused(monkeypatch) -> None:
    """Swap what two hook points are said to hold: the figure refuses to draw."""
    table = dict(inspect_figures.HOOK_TENSORS)
    table["residual_mid"], table["residual_post"] = table["residual_post"], table["residual_mid"]
    monkeypatch.setattr(inspect_figures, "HOOK_TENSORS", table)
    with pytest.raises(RuntimeError, match="mark of residual|disagree with the computation"):
        hook_point_marks(MODELS["gpt"](), 0, ids())
    table = dict(inspect_figures.HOOK_TENSORS)
    table["attn.q"] = table["attn.k"]  # two marks on one tensor: the arrows alone allow it
    monkeypatch.setattr(inspect_figures, "HOOK_TENSORS", table)
    with pytest.raises(RuntimeError, match="two hook points of blocks.0 are said to hold"):
        hook_point_marks(MODELS["gpt"](), 0, ids())


# --- patching_setup -----------------------------------------------------------------------

CLEAN = ["When", " Mary", " and", " John", " went", ",", " John", " gave", " a", " drink",
         " to"]
CORRUPTED = [" Anne" if t == " Mary" else t for t in CLEAN]

PATCHES = [  # (point, layer, position, head)
    ("residual_pre", 0, 3, None), ("residual_pre", 0, 1, None), ("residual_pre", 1, 3, None),
    ("residual_pre", 1, 0, None), ("attn.k", 0, 3, 1), ("attn.k", 1, 3, 0),
    ("attn.v", 1, 2, None), ("attn.q", 1, 3, 1), ("attn.weights", 0, 4, 2),
    ("attn.heads", 0, None, 3), ("attn.heads", 1, 5, None), ("attn.out", 0, 2, None),
    ("residual_mid", 1, 2, None), ("ff.hidden", 0, 3, None), ("ff.hidden", 1, 5, None),
    ("ff.out", 1, 6, None), ("residual_post", 0, 4, None), ("residual_post", 1, 1, None),
]


def patched_outputs(m: GPT, x: torch.Tensor, name: str, source, position, head) -> torch.Tensor:
    """Every block's output (L, T, C) of m(x) with `name` patched from `source`."""
    posts = hook_names(m, "*.residual_post")
    copy = patch(source, positions=position, heads=head)
    keep: dict[str, torch.Tensor] = {}

    def hook(t: torch.Tensor, n: str) -> torch.Tensor | None:
        out = copy(t, n) if n == name else None
        if n in posts:
            keep[n] = (t if out is None else out).clone()
        return out

    with hooks(m, dict.fromkeys({*posts, name}, hook)):
        m(x)
    return torch.stack([keep[n][0] for n in posts])


@pytest.mark.parametrize("which", MODELS)
def test_the_shaded_cells_are_the_ones_a_real_copy_changes(which: str) -> None:
    """Patch a real run: the blocks' outputs that change are exactly the cells shaded, for
    copies at every kind of point, before, at and after the differing tokens (two of them)."""
    m = MODELS[which]()
    clean = ids(2, T)
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 1) % 256
    corrupted[0, 4] = (clean[0, 4] + 7) % 256
    tokens = [str(i) for i in clean[0].tolist()]
    other = [str(i) for i in corrupted[0].tolist()]
    posts = hook_names(m, "*.residual_post")
    for point, layer, position, head in PATCHES:
        name = f"blocks.{layer}.{point}"
        _, source = run_with_cache(m, clean, names=[name])
        _, own = run_with_cache(m, corrupted, names=[name])

        # the same hook in both runs, so the same kernels (watched weights take the reference
        # kernel): the baseline copies the corrupted run's own activation
        after = patched_outputs(m, corrupted, name, source, position, head)
        before = patched_outputs(m, corrupted, name, own, position, head)
        changed = {(lay, t) for lay in range(len(posts)) for t in range(T)
                   if not torch.equal(after[lay, t], before[lay, t])}
        d = patching_setup(m, tokens, other, ("1", "2"), layer, position, head, point)
        assert d.changed == changed, (point, layer, position, head)
        assert d.hook == name and d.wired
    # nothing changes before the first differing token, and something changes after it
    assert not changed_cells("residual_pre", 1, {1}, {2, 4}, 2, T)
    assert changed_cells("residual_pre", 1, {2}, {2, 4}, 2, T)


def test_captions_come_from_the_arguments() -> None:
    m = smollm2_sized()
    d = patching_setup(m, CLEAN, CORRUPTED, (" Mary", " John"), 17, position=-1, head=4,
                       point="attn.q")
    texts = " ".join(helpers.svg_texts(d.svg))
    assert "Copy blocks.17.attn.q, head 4 of 9, at position 10 (␣to)" in texts
    assert "logit(␣Mary) − logit(␣John)" in texts and "at the last position" in texts
    assert "It reaches the last position: the metric can move." in texts
    assert d.hook == "blocks.17.attn.q" and (17, 10) in d.changed and (16, 10) not in d.changed
    # 9 query heads share 3 key/value heads: a key head is one of 3
    k = patching_setup(m, CLEAN, CORRUPTED, (" Mary", " John"), 2, head=1, point="attn.k")
    assert "key/value head 1 of 3, at every position" in " ".join(helpers.svg_texts(k.svg))
    # a copy that cannot reach the last position, and one where the runs agree
    late = patching_setup(m, CLEAN, CORRUPTED, (" Mary", " John"), 29, 4, point="ff.out")
    assert late.changed == {(29, 4)}
    assert "It cannot reach the last position" in " ".join(helpers.svg_texts(late.svg))
    early = patching_setup(m, CLEAN, CORRUPTED, (" Mary", " John"), 5, 0)
    assert early.changed == set()
    assert ("The runs agree before position 1, where the tokens first differ"
            in " ".join(helpers.svg_texts(early.svg)))
    zero = patching_setup(m, CLEAN, CORRUPTED, (" Mary", " John"), 0, 3)
    assert zero.changed == set() and "differ only at position 1: at position 3 the runs agree" \
        in " ".join(helpers.svg_texts(zero.svg))
    # the differing token is marked in both runs (an orange box behind it), the others not
    assert d.differ == {1}
    root = ET.fromstring(d.svg)
    orange = [r for r in root.iter(f"{SVG}rect") if "#e07b24" in r.get("style", "")]
    assert len(orange) == 2


HOSTILE = ["<script>alert(1)</script>", "&amp;", "שלום", "x" * 40, "a\u202eb", '"><b>', " "]


def test_hostile_tokens_stay_text() -> None:
    m = MODELS["llama"]()
    corrupted = list(HOSTILE)
    corrupted[1] = "&"
    d = patching_setup(m, HOSTILE, corrupted, ("שלום", "<i>x</i>"), 1, position=3)
    root = ET.fromstring(d.svg)  # parses: nothing broke out of its element
    assert not any(el.tag.endswith(("script", "b", "i")) for el in root.iter())
    assert "<script" not in d.svg and "<i>" not in d.svg
    texts = helpers.svg_texts(d.svg)
    assert shown(HOSTILE[0]) in texts and "&amp;" in texts and "&" in texts
    assert "x" * 11 + "…" in texts and "x" * 12 not in " ".join(texts)  # cut to 12
    assert "a\\u202eb" in texts  # the right-to-left override shown, not obeyed
    assert "␣" in texts
    # right-to-left words in a caption are isolated, so they cannot reorder it
    metric = next(t for t in texts if t.startswith("logit("))
    assert metric == "logit(\u2068שלום\u2069) − logit(<i>x</i>)"
    assert shown("\t" * 3) == "\\t\\t\\t" and shown("") == "∅"
    assert shown("\\" * 30) == "\\" * 11 + "…"


def test_bad_input_is_refused() -> None:
    m = MODELS["gpt"]()
    ok = dict(model=m, clean=CLEAN, corrupted=CORRUPTED, answers=(" Mary", " John"), layer=1,
              position=2)
    with pytest.raises(ValueError, match="as many tokens, got 11 and 10"):
        patching_setup(**{**ok, "corrupted": CORRUPTED[:-1]})
    with pytest.raises(ValueError, match="nothing to patch"):
        patching_setup(**{**ok, "corrupted": CLEAN})
    with pytest.raises(TypeError, match="list of tokens"):
        patching_setup(**{**ok, "clean": "When Mary"})
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\)"):
        patching_setup(**{**ok, "layer": 2})
    with pytest.raises(ValueError, match=r"position must be in \[0, 11\)"):
        patching_setup(**{**ok, "position": 11})
    with pytest.raises(ValueError, match="has no heads"):
        patching_setup(**{**ok, "head": 0, "point": "residual_pre"})
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\)"):
        patching_setup(**{**ok, "head": 4, "point": "attn.heads"})
    with pytest.raises(ValueError, match="no hook point 'mlp.hidden'; its points are"):
        patching_setup(**{**ok, "point": "mlp.hidden"})
    with pytest.raises(ValueError, match="a position, a head, or both"):
        patching_setup(**{**ok, "position": None})
    with pytest.raises(ValueError, match="answers must differ"):
        patching_setup(**{**ok, "answers": ("a", "a")})
    with pytest.raises(TypeError, match="two tokens"):
        patching_setup(**{**ok, "answers": ("a",)})
    with pytest.raises(TypeError, match="the tfbook model patched"):
        patching_setup(**{**ok, "model": "gpt2"})
    with pytest.raises(TypeError, match="layer must be an int"):
        hook_point_marks(m, True, ids())
    with pytest.raises(TypeError, match="needs the token ids"):
        hook_point_marks(m, 0)
    with pytest.raises(ValueError, match="not both"):
        hook_point_marks(trace(m, ids()), 0, ids())
    with pytest.raises(TypeError, match="tfbook.diagrams.Trace"):
        hook_point_marks("model", 0)
    from tfbook.models.bert import Bert, BertConfig

    torch.manual_seed(0)
    bert = Bert(BertConfig(vocab_size=256, max_len=16, n_layers=1, n_heads=2, d_model=16,
                           d_ff=32)).eval()
    with pytest.raises(ValueError, match="post-LN SelfAttentionBlock"):
        hook_point_marks(bert, 0, ids())
    with pytest.raises(ValueError, match="causal decoder .* got a Bert"):
        patching_setup(**{**ok, "model": bert})


# --- sizes, and a look in Chromium --------------------------------------------------------

def drawings() -> dict[str, object]:
    big, llama = smollm2_sized(), MODELS["llama"]()
    long = [t * 5 for t in CLEAN]
    return {
        "hooks, SmolLM2 sizes": hook_point_marks(big, 29, ids(n=12)),
        "hooks, GPT": hook_point_marks(MODELS["gpt"](), 0, ids()),
        "patching, SmolLM2 sizes": patching_setup(big, CLEAN, CORRUPTED, (" Mary", " John"),
                                                  17, position=-1, head=4, point="attn.q"),
        "patching, long tokens": patching_setup(
            big, long, [" Anne" * 5 if t == " Mary" * 5 else t for t in long],
            ("x" * 30, "y" * 30), 29, position=0, point="residual_post"),
        "patching, hostile": patching_setup(llama, HOSTILE, [HOSTILE[0], "&", *HOSTILE[2:]],
                                            ("שלום", "<i>x</i>"), 0, head=1),
    }


@pytest.fixture(scope="module")
def drawn() -> dict[str, object]:
    return drawings()


def test_fits_a_phone_and_the_book_column_with_legible_text(drawn) -> None:
    for name, d in drawn.items():
        assert d._wide_min <= DESKTOP_COLUMN, (name, d._wide_min)
        assert max(d.phone_widths) <= PHONE_COLUMN, (name, d.phone_widths)
        for svg in [d.svg, *d._narrow]:
            sizes = [float(el.get("font-size")) for el in ET.fromstring(svg).iter(f"{SVG}text")]
            assert min(sizes) >= SMALL, name
    # the hooks' marks are drawn over the stream's line, not under it
    svg = drawn["hooks, GPT"].svg
    assert svg.rindex("<line") < svg.rindex("<circle")


TEXTS_JS = """(box) => {
  const shown = [...box.querySelectorAll('svg')].filter((s) => s.getBoundingClientRect().width);
  const texts = [], segments = [];
  for (const svg of shown) {
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect(), m = t.getScreenCTM();
      texts.push({text: t.textContent, left: r.left, right: r.right, top: r.top,
                  bottom: r.bottom, mark: (t.getAttribute('style') || '').includes('#fff'),
                  px: parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(m.a * m.d)});
    }
    for (const d of svg.querySelectorAll('circle')) {  // the marks and the adders
      const r = d.getBoundingClientRect();
      texts.push({text: 'a disc', left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                  disc: true, mark: true, px: 99});
    }
    for (const l of svg.querySelectorAll('polyline, line')) {
      const m = l.getScreenCTM();
      const at = (k) => +l.getAttribute(k);
      const pts = l.tagName === 'line' ? [[at('x1'), at('y1')], [at('x2'), at('y2')]]
        : l.getAttribute('points').trim().split(/\\s+/).map((p) => p.split(',').map(Number));
      const s = pts.map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
      for (let i = 1; i < s.length; i++) segments.push([s[i - 1], s[i]]);
    }
  }
  return {texts, segments, scroll: box.scrollWidth, client: box.clientWidth};
}"""


def inside(a: dict, b: dict) -> bool:
    """Whether the centre of one of a disc and a text lies inside the other's rectangle."""
    disc, text = (a, b) if a.get("disc") else (b, a)
    x, y = (text["left"] + text["right"]) / 2, (text["top"] + text["bottom"]) / 2
    return disc["left"] < x < disc["right"] and disc["top"] < y < disc["bottom"]


def crosses(seg, box, inset: float = 1.5) -> bool:
    """Whether a line segment runs through a text's rectangle (shrunk by `inset`)."""
    (x0, y0), (x1, y1) = seg
    left, right = box["left"] + inset, box["right"] - inset
    top, bottom = box["top"] + inset, box["bottom"] - inset
    for k in range(41):  # sample the segment: the lines are straight and short
        x, y = x0 + (x1 - x0) * k / 40, y0 + (y1 - y0) * k / 40
        if left < x < right and top < y < bottom:
            return True
    return False


@pytest.mark.parametrize("width", [1280, 390])
def test_no_text_overlaps_and_no_line_crosses_text_in_chromium(browser, drawn, tmp_path,
                                                                width: int) -> None:
    """The figures in the book's column (672 px at 1,280 px, 358 px on a phone): nothing
    scrolls sideways, every text is at least the book's 12 px, no two texts overlap (the
    number of a mark lies on its disc only) and no line runs through a text."""
    measured = helpers.measure_in_chromium(browser, tmp_path, "inside_the_model", drawn, width,
                                           TEXTS_JS)
    for name, m in zip(drawn, measured, strict=True):
        assert m["scroll"] <= m["client"] + 1, (name, width, m["scroll"], m["client"])
        texts = m["texts"]
        assert len(texts) > 20 and min(t["px"] for t in texts) >= 12 - 0.01, (name, width)
        discs = sum(bool(t.get("disc")) for t in texts)
        assert discs == (24 if name.startswith("hooks") else 0), (name, discs)
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                if a.get("disc") != b.get("disc") and inside(a, b):
                    continue  # a disc's own number or symbol
                overlap = (min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
                           and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5)
                assert not overlap, (name, width, a["text"], b["text"], a["left"], b["left"])
        for t in texts:
            if t["mark"]:  # a mark's number sits on its disc, drawn over the stream's line
                continue
            hit = [s for s in m["segments"] if crosses(s, t)]
            assert not hit, (name, width, t["text"], hit[:2])


def test_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(inspect_figures).failed == 0


if __name__ == "__main__":  # `python -m tests.test_diagrams_inspect OUT.html`: to look at
    import sys
    from pathlib import Path

    from tests.diagram_gallery import page

    Path(sys.argv[1]).write_text(page([("inside_the_model", n, d)
                                       for n, d in drawings().items()]))
