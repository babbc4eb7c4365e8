"""tfbook.diagrams.learning: LoRA, the training loop, the ring and the parallel schemes,
every label read from the real objects."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from torch import nn

from tests.diagram_helpers import numbers, svg_texts
from tfbook.diagrams.learning import (
    data_parallel,
    lora_layer,
    model_parallel,
    ring_steps,
    training_loop,
)
from tfbook.lora import LoRALinear
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.train.loop import TrainConfig


def all_labels_drawn(d) -> None:
    texts = svg_texts(d.svg)
    for label in d.labels:
        assert label.text in texts, label


def gpt(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(GPTConfig.tiny(), **changes))


# --- LoRA -------------------------------------------------------------------------------------

def test_lora_labels_are_the_layers_tensors() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(40, 24), r=4, alpha=8)
    x = torch.randn(2, 3, 40)
    d = lora_layer(layer, x)
    labels = d.shape_labels
    assert numbers(labels["x"]) == tuple(x.shape)
    assert numbers(labels["W"]) == tuple(layer.base.weight.shape) == (24, 40)
    assert numbers(labels["A"]) == tuple(layer.lora_A.shape) == (4, 40)
    assert numbers(labels["B"]) == tuple(layer.lora_B.shape) == (24, 4)
    assert numbers(labels["down"]) == (2, 3, 4)
    assert numbers(labels["h"]) == tuple(layer(x).shape)
    assert numbers(labels["merge.merged"]) == tuple(layer.merged().weight.shape)
    texts = svg_texts(d.svg)
    assert f"× α/r = 8/4 = {layer.scaling:g}" in texts
    n_trained = layer.lora_A.numel() + layer.lora_B.numel()
    assert any(f"trained: {n_trained:,} numbers" in t for t in texts)
    all_labels_drawn(d)
    # the arrows are the call's: x into W and into A, the scaled B A branch added to x W^T
    assert d.wired and {("x", "base"), ("x", "down"), ("down", "scaled"),
                        ("scaled", "output"), ("base", "output")} <= set(d.edges)
    # the bottleneck is drawn narrow: its waist narrower than the trapezoids' wide edges
    import re

    polygons = re.findall(r'<polygon class="bx" points="([^"]+)"', d.svg)
    assert len(polygons) == 2
    xs = [[float(p.split(",")[0]) for p in poly.split()] for poly in polygons]
    a_top, a_bottom = xs[0][1] - xs[0][0], xs[0][2] - xs[0][3]
    assert a_bottom < a_top / 3  # A narrows C_in numbers to r
    assert not any("trained" in t for t in texts if t.startswith("(B, T, C_out)"))


def test_lora_rank_changes_the_drawing() -> None:
    x = torch.randn(1, 2, 16)
    a = lora_layer(LoRALinear(nn.Linear(16, 16), r=2, alpha=4), x)
    b = lora_layer(LoRALinear(nn.Linear(16, 16), r=8, alpha=4), x)
    assert numbers(a.shape_labels["A"]) == (2, 16) and numbers(b.shape_labels["A"]) == (8, 16)
    assert "× α/r = 4/8 = 0.5" in svg_texts(b.svg)


def test_lora_bad_input() -> None:
    with pytest.raises(TypeError, match="LoRALinear"):
        lora_layer(nn.Linear(4, 4), torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        lora_layer(LoRALinear(nn.Linear(4, 4), r=2, alpha=2), torch.randn(1, 5))


# --- the ring ---------------------------------------------------------------------------------

def ring_by_sets(p: int) -> list[list[list[frozenset[int]]]]:
    """The ring all-reduce played on sets of ranks (independent of the tensors' version)."""
    held = [[frozenset([r]) for _ in range(p)] for r in range(p)]
    states = [[row[:] for row in held]]
    for phase in ("rs", "ag"):
        for s in range(p - 1):
            msgs = []
            for r in range(p):
                c = (r - s) % p if phase == "rs" else (r + 1 - s) % p
                msgs.append(((r + 1) % p, c, held[r][c]))
            for dest, c, chunk in msgs:
                held[dest][c] = held[dest][c] | chunk if phase == "rs" else chunk
            states.append([row[:] for row in held])
    return states


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_labels_are_the_algorithms_chunks(p: int) -> None:
    d = ring_steps(p)
    labels = {lb.key: lb.text for lb in d.labels if lb.key}
    expected = ring_by_sets(p)
    assert len(d._panels) == len(expected) + 1 == 2 * p  # the ring, then one panel a step
    for i, state in enumerate(expected):
        for r in range(p):
            for c in range(p):
                ranks = state[r][c]
                text = "Σ" if len(ranks) == p else "+".join(str(k) for k in sorted(ranks))
                assert labels[f"{i}.{r}.{c}"] == text
    # after reduce-scatter rank r holds the sum of chunk r + 1; at the end everyone has all
    assert all(labels[f"{p - 1}.{r}.{(r + 1) % p}"] == "Σ" for r in range(p))
    assert all(labels[f"{2 * p - 2}.{r}.{c}"] == "Σ" for r in range(p) for c in range(p))
    all_labels_drawn(d)
    # the ring's arrows are the run's sends, each rank to the next; the caption is said once
    from tfbook.train.distributed import ring_all_reduce_steps

    sends = {(a, b) for st in ring_all_reduce_steps([torch.ones(p)] * p) for a, b, _ in st.sends}
    arrows = {tuple(int(n) for n in re.findall(r"\d+", why)) for why in d._other_arrows}
    assert arrows == sends == {(r, (r + 1) % p) for r in range(p)}
    assert sum("outlined" in t for t in svg_texts(d.svg)) <= 1
    # the outline of a sent chunk stays inside its own cell: it touches no neighbour
    step = d._panels[2][0]  # reduce-scatter 1: the first panel that sends
    cells = [float(w) for w in re.findall(r'<rect class="bx" x="[-\d.]+" y="[-\d.]+" '
                                          r'width="([\d.]+)"', step)]
    outlines = [float(w) for w in re.findall(r'<rect class="bx dash" x="[-\d.]+" '
                                             r'y="[-\d.]+" width="([\d.]+)"', step)]
    assert len(outlines) == p and all(w <= min(cells) + 8 for w in outlines)


@pytest.mark.parametrize("p", [1, 9, "4", True, 4.0])
def test_ring_bad_p(p: object) -> None:
    with pytest.raises(ValueError, match="p must be an int from 2 to 8"):
        ring_steps(p)


# --- data, tensor and pipeline parallelism ----------------------------------------------------

def test_data_parallel_shards_and_replicas() -> None:
    model = gpt(d_model=64)
    x = torch.randint(0, 256, (12, 10))
    n = sum(p.numel() for p in model.parameters())
    for p in (2, 3, 4):
        d = data_parallel(model, (x, x), p)
        labels = d.shape_labels
        assert numbers(labels["global"]) == (12, 10)
        for r in range(p):
            assert numbers(labels[f"shard{r}"]) == (12 // p, 10)
            assert numbers(labels[f"grad{r}"]) == (n,)
            # the arrows are a step played in one process: shard -> loss -> g_r -> the mean
            assert {("batch", f"shard{r}"), (f"shard{r}", f"loss{r}"),
                    (f"loss{r}", f"grad{r}"), (f"grad{r}", "mean")} <= set(d.edges)
        assert f"shard{p}" not in labels and d.wired and ("mean", "step") in d.edges
        assert "gradient g0" in svg_texts(d.svg) and "gradient g_r" not in svg_texts(d.svg)
    with pytest.raises(ValueError, match="world_size must be an int from 2 to 4"):
        data_parallel(model, (x, x), 5)
    with pytest.raises(ValueError):
        data_parallel(model, (x[:5], x[:5]), 2)  # 5 rows do not split over 2 ranks
    with pytest.raises(TypeError, match="torch.nn.Module"):
        data_parallel("model", (x, x), 2)


def test_model_parallel_splits_the_real_weights() -> None:
    model = gpt(n_layers=4)
    F, C = model.blocks[0].ff.fc_in.weight.shape
    for ranks in (2, 4):
        d = model_parallel(model, ranks, micro_batches=3)
        labels = d.shape_labels
        for r in range(ranks):
            assert numbers(labels[f"tensor.w1.{r}"]) == (F // ranks, C)
            assert numbers(labels[f"tensor.w2.{r}"]) == (C, F // ranks)
        stages = [lb.shape for lb in d.labels if lb.key.startswith("pipeline.stage")]
        assert stages[0][0] == 0 and stages[-1][1] == 3  # every block (from 0), in order, once
        assert all(b[0] == a[1] + 1 for a, b in zip(stages, stages[1:], strict=False))
        idle, total = next(lb.shape for lb in d.labels if lb.key == "pipeline.bubble")
        # GPipe: each stage waits (ranks - 1) slots before its forwards and after its backwards
        assert idle == 2 * ranks * (ranks - 1)
        assert total == ranks * 2 * (3 + ranks - 1)
        all_labels_drawn(d)
        # the split FFN, played on a small one: x -> each rank's rows of W_1 -> its columns of
        # W_2 -> the sum (which equals the whole FFN's output, or the drawing is refused)
        assert d.wired and {("tensor.x", f"tensor.w1.{r}") for r in range(ranks)} | {
            (f"tensor.w2.{r}", "tensor.sum") for r in range(ranks)} <= set(d.edges)
    with pytest.raises(ValueError, match="ranks must be an int from 2"):
        model_parallel(model, 5)
    with pytest.raises(TypeError, match="GPT"):
        model_parallel(nn.Linear(2, 2))


# --- the training loop ------------------------------------------------------------------------

def test_training_loop_shapes_and_config() -> None:
    model = gpt(dropout=0.1).train()
    x = torch.randint(0, 256, (4, 16))
    config = TrainConfig(steps=100, lr=1e-3, warmup=10, clip=0.5)
    torch.manual_seed(1)
    d = training_loop(model, (x, x), config, step=50)
    after = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(after, torch.rand(3))  # drawing consumed no random numbers
    assert model.training  # and left the model's mode alone
    labels = d.shape_labels
    assert numbers(labels["batch"]) == (4, 16)
    with torch.no_grad():
        assert numbers(labels["logits"]) == tuple(model.eval()(x).logits.shape)
    assert numbers(labels["grads"]) == (sum(p.numel() for p in model.parameters()),)
    texts = svg_texts(d.svg)
    assert f"learning rate of step 50: {config.lr_at(50):.3g}" in texts
    assert "if the norm > 0.5, scale to 0.5" in texts
    assert "mean over B·T = 64 targets" in texts
    unclipped = training_loop(model, (x, x), replace(config, clip=None))
    assert "off (clip=None)" in svg_texts(unclipped.svg)
    # the arrows are those of a real step, recorded on a copy of the model: the targets go
    # to the loss past the forward pass, the rate is no tensor of the step (it says so)
    assert d.wired and {("idx", "lm_head"), ("lm_head", "loss"), ("targets", "loss"),
                        ("loss", "grads"), ("grads", "clipped"),
                        ("clipped", "params")} <= set(d.edges)
    assert not any("lr" in e for edge in d.edges for e in edge)
    before = [p.detach().clone() for p in model.parameters()]
    training_loop(model, (x, x), config, step=50)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    all_labels_drawn(d)


def test_training_loop_bad_input() -> None:
    model, x = gpt(), torch.randint(0, 256, (2, 8))
    config = TrainConfig(steps=10)
    with pytest.raises(TypeError, match="TrainConfig"):
        training_loop(model, (x, x), {"steps": 10})
    with pytest.raises(ValueError, match=r"two \(B, T\) tensors"):
        training_loop(model, (x, x[:1]), config)
    with pytest.raises(ValueError, match=r"step must be an int in \[0, 10\)"):
        training_loop(model, (x, x), config, step=10)
