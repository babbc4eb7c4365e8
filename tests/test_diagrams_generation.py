"""tfbook.diagrams.generation: the cache diagram shows the real cache's shapes and bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.diagram_helpers import numbers, svg_texts
from tfbook.diagrams.generation import kv_cache, trace_cache
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama


def model(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(tiny_llama(), **changes)).eval()


PROMPT = torch.tensor([[5, 17, 99, 3, 42, 8]])  # (1, 6)


def test_labels_are_the_real_cache() -> None:
    m = model()
    cfg = m.config
    d = kv_cache(m, PROMPT)
    labels = d.shape_labels
    B, T0 = PROMPT.shape
    H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
    # an independent run: the prompt, then the greedy token, through a cache of our own
    cache = m.new_cache(T0 + 1)
    with torch.no_grad():
        logits = m(PROMPT, cache=cache).logits
        stored_prefill = tuple(cache.layers[0].keys[:, :, :cache.length].shape)
        m(logits[:, -1:].argmax(-1), cache=cache)
    stored = tuple(cache.layers[0].keys[:, :, :cache.length].shape)
    assert numbers(labels["prefill.q"]) == (B, H, T0, D)
    assert numbers(labels["prefill.k"]) == (B, H_kv, T0, D)
    assert numbers(labels["prefill.stored"]) == stored_prefill == (B, H_kv, T0, D)
    assert numbers(labels["prefill.weights"]) == (B, H, T0, T0)
    assert numbers(labels["decode.ids"]) == (B, 1)
    assert numbers(labels["decode.q"]) == (B, H, 1, D)  # one query row ...
    assert numbers(labels["decode.weights"]) == (B, H, 1, T0 + 1)  # ... against t keys
    assert numbers(labels["decode.stored"]) == numbers(labels["memory.layer"]) == stored
    assert labels["memory.bytes"] == f"= {cache.memory_bytes():,} bytes held"
    assert labels["memory.n_layers"] == f"× {cfg.n_layers} layers"
    assert labels["heads.n_kv_heads"].startswith(f"H_kv = {H_kv} stored heads, each read by "
                                                 f"{H // H_kv}")
    texts = svg_texts(d.svg)
    for label in d.labels:
        assert label.text in texts


def test_config_changes_the_drawing() -> None:
    base = kv_cache(model(), PROMPT).shape_labels
    mha = kv_cache(model(n_kv_heads=4), PROMPT).shape_labels
    deep = kv_cache(model(n_layers=3), PROMPT).shape_labels
    assert numbers(mha["decode.stored"])[1] == 4 != numbers(base["decode.stored"])[1]
    assert mha["heads.n_kv_heads"] != base["heads.n_kv_heads"]
    assert deep["memory.n_layers"] == "× 3 layers" != base["memory.n_layers"]
    longer = kv_cache(model(), torch.tensor([[1, 2, 3]])).shape_labels
    assert numbers(longer["decode.weights"])[-1] == 4
    # a GPT with learned positions and one key/value head per query head works the same way
    gpt = GPT(GPTConfig.tiny()).eval()
    labels = kv_cache(gpt, PROMPT).shape_labels
    assert numbers(labels["decode.stored"])[1] == gpt.config.n_heads


def test_batch_of_prompts() -> None:
    ct = trace_cache(model(), torch.randint(0, 256, (3, 5)))
    assert ct.decode.stored[0] == 3 and ct.decode.ids == (3, 1)
    assert ct.memory_bytes == 2 * ct.n_layers * 4 * 3 * ct.decode.stored[1] * 6 * \
        ct.decode.stored[3]


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="tfbook decoder"):
        kv_cache(torch.nn.Linear(2, 2), PROMPT)
    with pytest.raises(ValueError, match=r"\(B, T0\) tensor of token ids"):
        kv_cache(model(), torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"\(B, T0\) tensor of token ids"):
        kv_cache(model(), torch.tensor([1, 2, 3]))


def test_panels_fit_a_phone_column() -> None:
    """At 390 px the book's column is about 358 px: no panel's smallest legible size is wider
    (the chapter's drawing: the demo model on six byte ids)."""
    import re

    torch.manual_seed(1)
    d = kv_cache(GPT(tiny_llama()).eval(), torch.tensor([list(b"Hello ")]))
    for svg, _ in d._panels:
        narrowest = float(re.search(r"min-width:([\d.]+)px", svg).group(1))
        assert narrowest <= 350, (svg[:120], narrowest)


def test_queries_and_new_keys_both_come_from_x_and_cached_keys_are_told_apart() -> None:
    """The arrows are the two passes' dependencies: X -> Q and X -> K, V side by side (the
    queries make no keys), the new keys into the cache, the cache's keys and the queries into
    the weights; the decode step's cache shows its held positions apart from the new one."""
    import xml.etree.ElementTree as ET

    from tests.diagram_helpers import SVG

    d = kv_cache(model(), PROMPT)
    assert d.wired
    for p in ("prefill.", "decode."):
        a = f"{p}blocks.0.attn"
        assert (f"{p}{a}:x", f"{p}{a}.q") in d.edges and (f"{p}{a}:x", f"{p}{a}.k") in d.edges
        assert (f"{p}{a}.k", f"{p}{a}.keys") in d.edges
        assert (f"{p}{a}.keys", f"{p}{a}.weights") in d.edges
        assert not any(src.endswith(".q") and dst.endswith((".k", ".v", ".keys"))
                       for src, dst in d.edges)
    texts = svg_texts(d.svg)
    T0 = PROMPT.size(1)
    assert f"cache: {T0} new" in texts and f"cache: {T0} held + 1 new" in texts
    # one cell per stored key and value: this pass's tinted like the new keys, the held ones not
    svgs = [svg for svg, _ in d._panels]
    new_tint = "fill:#e07b24"
    for svg, new, held in ((svgs[0], T0, 0), (svgs[1], 1, T0)):
        cells = [r for r in ET.fromstring(svg).iter(f"{SVG}rect")
                 if r.get("rx") == "1" and r.get("width") == r.get("height")]
        assert len(cells) == 2 * (new + held)
        assert sum(new_tint in r.get("style", "") for r in cells) == 2 * new
