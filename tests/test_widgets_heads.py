"""The head explorer in Python: the page's bytes are the model's attention weights, scores
travel as given, the reader's text runs through `compute`, bad input is refused clearly, and
hostile text reaches the saved state without a "<". (The page itself: test_browser_heads.py.)"""

from __future__ import annotations

import base64
import json
import math
import zlib

import numpy as np
import pytest
import torch

from tests.test_widgets_attention import tiny_gpt
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
from tfbook.models.gpt import GPT
from tfbook.models.llama import tiny_llama
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.widgets import HeadExplorer
from tfbook.widgets.attention import AttentionExample, quantise_maps, truncation_note
from tfbook.widgets.base import page_text
from tfbook.widgets.heads import MAX_TEXT_CHARS, head_example
from tfbook.widgets.page_model import export_page_model, quantised_reference, token_label

HOSTILE = ["<!--<script>", "</script>", "<img src=x onerror=alert(1)>", "100% %3C"]


def causal_maps(L: int, H: int, T: int, seed: int = 0) -> torch.Tensor:
    """Random causal attention weights (L, H, T, T): each row a softmax over its prefix."""
    scores = torch.randn(L, H, T, T, generator=torch.Generator().manual_seed(seed)) * 3
    return torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf), -1)


def example(name: str = "a", L: int = 3, H: int = 2, T: int = 5, seed: int = 0) -> AttentionExample:
    return AttentionExample(name, [f"t{i}" for i in range(T)], causal_maps(L, H, T, seed))


def unpacked(widget: HeadExplorer) -> np.ndarray:
    """The page's bytes: base64, then inflate (what DecompressionStream("deflate") does)."""
    return np.frombuffer(zlib.decompress(base64.b64decode(widget.data)), dtype=np.uint8)


def scores_of(L: int = 3, H: int = 2, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"previous-token": torch.rand(L, H, generator=g),
            "any range": torch.randn(L, H, generator=g) * 40}


def test_maps_and_scores_reach_the_page_as_given() -> None:
    examples = [example("a", T=5), example("b", T=7, seed=1)]
    scores = scores_of()
    w = HeadExplorer(scores, examples, score="any range", title="heads")
    raw = unpacked(w)
    assert w.offsets == [0, 3 * 2 * 5 * 5] and raw.size == 3 * 2 * (25 + 49)
    for e, offset in zip(examples, w.offsets, strict=True):
        T = len(e.tokens)
        got = raw[offset:offset + 6 * T * T].reshape(3, 2, T, T)
        assert np.array_equal(got, quantise_maps(e.weights))
        assert np.abs(got / 255 - e.weights.numpy()).max() <= 0.5 / 255 + 1e-6
    assert w.examples[1] == {"name": "b", "tokens": [f"t{i}" for i in range(7)], "note": "",
                             "T": 7}
    assert w.score_names == ["previous-token", "any range"] and w.score == 1
    assert w.heads == [3, 2] and w.title == "heads" and not w.can_run
    for name, values in scores.items():  # 6 significant digits
        sent = np.array(w.scores[w.score_names.index(name)])
        assert np.allclose(sent, values.double().numpy(), rtol=1e-5, atol=0)
    # the head selected first is the chosen score's largest
    flat = int(torch.argmax(scores["any range"]))
    assert (w.layer, w.head) == divmod(flat, 2)
    assert np.array_equal(w.pattern(1, 2, 1), quantise_maps(examples[1].weights)[2, 1])


def test_from_model_runs_the_model_and_the_readers_text() -> None:
    torch.manual_seed(0)
    model = GPT(tiny_llama()).eval()  # 2 layers x 4 query heads sharing 2 key/value heads
    tokenizer = BPETokenizer({})  # bytes: vocab 256
    texts = ["the cat sat", "on the mat " * 3]
    scores = {"sink": torch.rand(2, 4)}
    w = HeadExplorer.from_model(model, tokenizer, texts, scores, max_tokens=20, layer=1, head=3)
    assert w.can_run and w.page_model == "" and "class PageGPT" not in w._esm
    assert (w.layer, w.head, w.max_tokens, w.context) == (1, 3, 20, 64)
    raw = unpacked(w)
    for text, meta, offset in zip(texts, w.examples, w.offsets, strict=True):
        ids = tokenizer.encode_ordinary(text)
        kept = ids[-20:]
        with torch.no_grad():
            expected = torch.stack(model(torch.tensor([kept]), need_weights=True).attentions)[:, 0]
        T = len(kept)
        assert meta["tokens"] == [token_label(tokenizer, i) for i in kept]
        assert np.array_equal(raw[offset:offset + 8 * T * T].reshape(2, 4, T, T),
                              quantise_maps(expected))
        assert meta["note"] == (truncation_note(len(ids), 20, 64) if len(ids) > 20 else "")
    assert "its first 13 tokens were cut" in w.examples[1]["note"]
    assert "(the model reads up to 64)" in w.examples[1]["note"]
    # the reader's text, as the page asks for it: added after the given texts, then replaced
    for text in ("a b c", "hello"):
        w._on_front_end_message(w, {"type": "request", "args": {"text": text}}, [])
        assert w.error == "" and len(w.examples) == 3 and w.example == 2
        assert w.examples[2]["name"] == "your text"
        assert w.examples[2]["tokens"] == [token_label(tokenizer, i)
                                           for i in tokenizer.encode_ordinary(text)]
    assert [e["name"] for e in w.examples[:2]] == texts
    for bad, message in (("  \n", "the text box is empty"), (7, "text must be a str"),
                         ("x" * (MAX_TEXT_CHARS + 1), "takes at most")):
        w._on_front_end_message(w, {"type": "request", "args": {"text": bad}}, [])
        assert message in w.error and len(w.examples) == 3
    # the model's own context is the limit when it is the smaller: the attention map's note
    long = head_example(model, tokenizer, "x" * 70, max_tokens=100)
    assert long.note == truncation_note(70, 64) and len(long.tokens) == 64


def test_page_model_carries_the_gpt_and_its_weights() -> None:
    model, tokenizer = tiny_gpt()  # context 16
    scores = {"s": torch.rand(model.config.n_layers, model.config.n_heads)}
    w = HeadExplorer.from_model(model, tokenizer, ["the cat sat on the mat"], scores,
                                page_model=True)
    assert json.loads(w.page_model) == export_page_model(model, tokenizer, "float16")
    assert "class PageGPT" in w._esm and "class PageGPT" not in HeadExplorer._esm
    assert (w.max_tokens, w.context) == (16, 16)
    reference = quantised_reference(model, "float16")  # what the page computes with
    expected = head_example(reference, tokenizer, "the cat sat on the mat", max_tokens=16)
    T = len(expected.tokens)
    assert np.array_equal(unpacked(w).reshape(*expected.weights.shape[:2], T, T),
                          quantise_maps(expected.weights))
    with pytest.raises(ValueError, match="page_model=True puts the model in the page"):
        HeadExplorer.from_model(GPT(tiny_llama()), BPETokenizer({}), "hi", {"s": torch.rand(2, 4)},
                                page_model=True)


def test_smollm2_all_270_heads() -> None:
    """The real SmolLM2-135M: 30 x 9 heads, its own patterns (grouped keys shared by three
    query heads), a context of 8,192 cut to the explorer's 64 tokens."""
    model, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    text = "The cat sat on the mat. The cat sat on the mat."
    scores = {"random": torch.rand(30, 9, generator=torch.Generator().manual_seed(0))}
    w = HeadExplorer.from_model(model, tokenizer, text, scores)
    ids = tokenizer.encode_ordinary(text)
    with torch.no_grad():
        expected = torch.stack(model(torch.tensor([ids]), need_weights=True).attentions)[:, 0]
    assert w.heads == [30, 9] and expected.shape == (30, 9, len(ids), len(ids))
    assert np.array_equal(unpacked(w).reshape(expected.shape), quantise_maps(expected))
    assert w.examples[0]["tokens"] == [token_label(tokenizer, i) for i in ids]
    w.compute(text="one two " * 40)
    assert w.examples[1]["T"] == 64 and "(the model reads up to 8192)" in w.examples[1]["note"]
    with pytest.raises(ValueError, match="page_model=True .* this GPTConfig has position='rope'"):
        HeadExplorer.from_model(model, tokenizer, text, scores, page_model=True)


BAD_SCORES = [
    ([[0.5, 0.5]], TypeError, r"scores must be a dict \{name: \(L, H\) array\}"),
    ({}, ValueError, "scores is empty"),
    ({"s": torch.rand(3)}, ValueError, r"must be an \(L, H\) array .* got shape \(3,\)"),
    ({"s": torch.rand(3, 2, 1)}, ValueError, r"got shape \(3, 2, 1\)"),
    ({"s": [[0.5, 0.5], [1.0]]}, ValueError, "must be an \\(L, H\\) array of numbers"),
    ({"s": "high"}, ValueError, "must be an \\(L, H\\) array of numbers"),
    ({"s": torch.tensor([[0.5, math.nan]] * 3)}, ValueError, "finite, got nan at layer 0, head 1"),
    ({"s": torch.tensor([[0.5, 0.2]] * 2 + [[math.inf, 0]])}, ValueError, "inf at layer 2, head 0"),
    ({"a": torch.rand(3, 2), "b": torch.rand(2, 3)}, ValueError, "the same \\(L, H\\) shape"),
    ({"": torch.rand(3, 2)}, TypeError, "a score's name must be a non-empty str"),
    ({"s": torch.rand(4, 2)}, ValueError,
     r"has \(L, H\) = \(3, 2\) heads, the scores have \(4, 2\)"),
]


@pytest.mark.parametrize("scores, error, message", BAD_SCORES)
def test_bad_scores_are_clear_errors(scores, error, message) -> None:
    with pytest.raises(error, match=message):
        HeadExplorer(scores, [example()])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"score": "induction"}, ValueError, r"score must be one of the scores' names \['s'\]"),
    ({"layer": 3, "head": 0}, ValueError, r"layer must be an int in \[0, 3\)"),
    ({"layer": 0, "head": -1}, ValueError, r"head must be an int in \[0, 2\)"),
    ({"title": 3}, TypeError, "title must be a str"),
    ({"run": "model"}, TypeError, "run must be a function"),
    ({"max_tokens": 0}, ValueError, "max_tokens must be a positive int"),
])
def test_bad_arguments_are_clear_errors(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        HeadExplorer({"s": torch.rand(3, 2)}, [example()], **kwargs)


def test_bad_examples_and_texts_are_clear_errors() -> None:
    scores = {"s": torch.rand(3, 2)}
    for examples in ([], "text", [torch.rand(3, 2, 4, 4)]):
        with pytest.raises(TypeError, match="examples must be a list of one or more"):
            HeadExplorer(scores, examples)
    cross = AttentionExample("x", ["a", "b"], torch.full((3, 2, 2, 3), 1 / 3), ["p", "q", "r"])
    with pytest.raises(ValueError, match="shows self-attention, got cross-attention"):
        HeadExplorer(scores, [cross])
    empty = AttentionExample("empty", [], torch.zeros(3, 2, 0, 0))
    with pytest.raises(ValueError, match="has no tokens"):
        HeadExplorer(scores, [empty])
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 3\), got 3"):
        HeadExplorer(scores, [example()]).pattern(0, 3, 0)
    with pytest.raises(TypeError, match="has no model attached"):
        HeadExplorer(scores, [example()]).compute(text="hi")
    wrong = HeadExplorer(scores, [example()], run=lambda text: "not an example")
    with pytest.raises(TypeError, match="run must return an AttentionExample, got str"):
        wrong.compute(text="hi")
    model, tokenizer = GPT(tiny_llama()), BPETokenizer({})
    scores = {"s": torch.rand(2, 4)}
    with pytest.raises(ValueError, match="the text box is empty"):
        HeadExplorer.from_model(model, tokenizer, ["fine", "   "], scores)
    with pytest.raises(TypeError, match="texts must be a str or a list of str"):
        HeadExplorer.from_model(model, tokenizer, [b"bytes"], scores)
    with pytest.raises(TypeError, match="model must be a tfbook decoder"):
        HeadExplorer.from_model(torch.nn.Linear(2, 2), tokenizer, "hi", scores)
    with pytest.raises(TypeError, match="tokenizer must be a tfbook tokenizer"):
        HeadExplorer.from_model(model, "bytes", "hi", scores)
    with pytest.raises(TypeError, match="page_model must be True or False"):
        HeadExplorer.from_model(model, tokenizer, "hi", scores, page_model="yes")
    with pytest.raises(ValueError, match="dtype must be one of"):
        HeadExplorer.from_model(*tiny_gpt(), "hi", {"s": torch.rand(2, 4)}, page_model=True,
                                dtype="int4")


def test_hostile_text_reaches_the_state_without_an_angle_bracket() -> None:
    tokens = HOSTILE + ["ok"]
    e = AttentionExample(HOSTILE[0], tokens, causal_maps(3, 2, len(tokens)), note=HOSTILE[1])
    w = HeadExplorer({HOSTILE[2]: torch.rand(3, 2)}, [e], title=HOSTILE[1])
    state = w.get_state()
    del state["_esm"]  # the script (its code has "<"; the book escapes the whole state)
    assert "<" not in json.dumps(state, ensure_ascii=False)
    assert state["examples"][0]["tokens"] == [page_text(t) for t in tokens]
    assert state["examples"][0]["name"] == page_text(HOSTILE[0])
    assert state["score_names"] == [page_text(HOSTILE[2])]
    assert state["title"] == page_text(HOSTILE[1])
    assert w.examples[0]["tokens"] == tokens  # Python keeps the text itself
