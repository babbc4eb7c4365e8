"""The sharding chapter's figures (tfbook.diagrams.sharding), each held against the code it is
drawn from: the bucket bars are a DDPOverlap's timeline, the memory bars the bytes of
tfbook.parallel.costs, the tensor-parallel shapes tensor_parallel_block's shards (and the
marks f and g count the all-reduces CollectiveCount counts), the pipeline slots schedule_order's
(idle share (p - 1)/(m + p - 1)) and the ring's blocks RingWork's; bad input refused; each fits
a phone's column and the book's, its text legible and not overlapping.

No process is started: the real DDPOverlap and tensor-parallel shard run in a process group
of one rank inside this process (gloo, an in-memory store)."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import json
import math
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from tests.diagram_helpers import SVG, numbers, svg_texts
from tfbook.diagrams.dataflow import check_edges
from tfbook.diagrams.diagram import PHONE_COLUMN
from tfbook.diagrams.sharding import (
    bucket_timeline,
    memory_parts,
    pipeline_schedules,
    ring_zigzag,
    sharding_memory,
    tensor_split,
)
from tfbook.diagrams.svg import COLOURS, HEAD_COLOURS, SMALL, text_width
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.parallel.ddp import BucketTiming

sharding_figures = importlib.import_module("tfbook.diagrams.sharding")
DESKTOP_COLUMN = 672.0


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A process group of this process alone (gloo, in-memory store): the real wrappers run,
    their collectives over one rank; torn down after, so no later test sees a group."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already set up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_runs() -> dict[str, tuple[list[BucketTiming], float]]:
    """One step of the tiny GPT in DDPOverlap with and without overlap (one rank)."""
    from tfbook.parallel.ddp import DDPOverlap

    out = {}
    with one_rank_group():
        for overlap in (True, False):
            torch.manual_seed(0)
            model = DDPOverlap(GPT(GPTConfig.tiny()), bucket_size_mb=0.25, overlap=overlap)
            x = torch.randint(0, 256, (2, 16))
            model(x, targets=x).loss.backward()
            model.finish_gradient_synchronization()
            out["on" if overlap else "off"] = (model.timeline, model.backward_seconds)
    return out


def synthetic_timeline() -> tuple[list[BucketTiming], float, list[BucketTiming], float]:
    on = [BucketTiming(0, 300000, 1200000, 0.004, 0.031, True),
          BucketTiming(1, 260000, 1040000, 0.012, 0.033, True),
          BucketTiming(2, 200000, 800000, 0.020, 0.036, True),
          BucketTiming(3, 50000, 200000, 0.027, 0.037, True)]
    off = [BucketTiming(i, b.numel, b.nbytes, 0.029, 0.035 + 0.004 * i, False)
           for i, b in enumerate(on)]
    return on, 0.028, off, 0.029


def texts(svg: str) -> str:
    return " | ".join(svg_texts(svg))


def panels(d) -> list[str]:
    return [svg for svg, _ in d._panels] or [d.svg]


def rects_of(svg: str, colour: str) -> list[tuple[float, float, float, float]]:
    """(x, y, width, height) of every rect tinted with `colour`, in drawing order."""
    out = []
    for el in ET.fromstring(svg).iter(f"{SVG}rect"):
        if f"fill:{colour}" in (el.get("style") or ""):
            out.append(tuple(float(el.get(k)) for k in ("x", "y", "width", "height")))
    return out


# --- 1. bucket timeline -----------------------------------------------------------------------

def test_bucket_bars_are_the_timeline() -> None:
    """Each bucket's bar runs from its launch to its wait on the panel's time scale (the
    backward bar gives the scale: 0 to backward_seconds), labelled with its size."""
    on, back, off, back_off = synthetic_timeline()
    d = bucket_timeline(on, back, off, back_off)
    assert d.t_max == 0.047  # the last wait of the two runs: one scale for both
    for svg, rows, seconds, colour in zip(panels(d), (on, off), (back, back_off),
                                          (COLOURS["attn"], COLOURS["head"]), strict=True):
        (bx, _, bw, _), = rects_of(svg, COLOURS["ffn"])
        unit = bw / seconds  # px per second
        assert abs(unit * d.t_max - bw * d.t_max / seconds) < 1e-9
        bars = rects_of(svg, colour)
        assert len(bars) == len(rows)
        for (x, _, w, _), b in zip(bars, rows, strict=True):
            assert abs(x - (bx + b.started * unit)) < 0.1
            assert abs(w - max((b.waited - b.started) * unit, 2.0)) < 0.1
        words = texts(svg)
        for b in rows:
            assert f"{b.bucket}: {sharding_figures._bytes_text(b.nbytes)}" in words
        during = sum(b.during_backward for b in rows)
        assert f"{during} of {len(rows)} all-reduces launched during" in words
        last = max(b.waited for b in rows) - seconds
        assert f"the last result {last * 1e3:.3g} ms after it" in words
    assert "overlap on" in texts(panels(d)[0]) and "overlap off" in texts(panels(d)[1])
    assert "1: 1016 KiB" in texts(d.svg)


def test_bucket_timeline_of_a_real_ddp_step_and_its_stored_form() -> None:
    """A DDPOverlap step's own timeline draws, and the dicts a JSON file stores of it draw the
    same figure."""
    runs = ddp_runs()
    (on, back), (off, back_off) = runs["on"], runs["off"]
    assert all(b.during_backward for b in on) and not any(b.during_backward for b in off)
    d = bucket_timeline(on, back, off, back_off)
    stored = json.loads(json.dumps({k: [dataclasses.asdict(b) for b in t]
                                    for k, (t, _) in runs.items()}))
    again = bucket_timeline(stored["on"], back, stored["off"], back_off)
    assert again.svg == d.svg
    assert [r for r, _ in d.runs] == [[dataclasses.asdict(b) for b in t] for t in (on, off)]
    labels, size = d.shape_labels, sharding_figures._bytes_text
    for b in on:
        assert labels[f"0.size.{b.bucket}"] == f"{b.bucket}: {size(b.nbytes)}"
    # every parameter in one bucket, the tied matrix once (float32)
    n = sum(p.numel() for p in GPT(GPTConfig.tiny()).parameters())
    assert sum(b.nbytes for b in on) == 4 * n
    one = bucket_timeline(on, back)  # one run alone: one panel
    assert not one._panels and "overlap on" in texts(one.svg)


def test_bucket_timeline_bad_input() -> None:
    on, back, off, back_off = synthetic_timeline()
    with pytest.raises(TypeError, match="non-empty list of tfbook.parallel.ddp.BucketTiming"):
        bucket_timeline([], back)
    with pytest.raises(TypeError, match="non-empty list"):
        bucket_timeline({"bucket": 0}, back)
    with pytest.raises(ValueError, match=r"timeline\[0\] is bucket 1: the buckets must be"):
        bucket_timeline(on[1:], back)
    with pytest.raises(ValueError, match="waited .* before it started"):
        bucket_timeline([replace(on[0], waited=0.001)], back)
    with pytest.raises(TypeError, match=r"timeline\[0\] must be a BucketTiming or a dict"):
        bucket_timeline([{"bucket": 0, "numel": 3}], back)
    with pytest.raises(ValueError, match="nbytes must be an int >= 1"):
        bucket_timeline([replace(on[0], nbytes=0)], back)
    with pytest.raises(ValueError, match="started must be a finite number"):
        bucket_timeline([replace(on[0], started=math.nan)], back)
    with pytest.raises(ValueError, match="backward_seconds must be a finite number of seconds"):
        bucket_timeline(on, 0.0)
    with pytest.raises(ValueError, match="give off_timeline and off_backward_seconds together"):
        bucket_timeline(on, back, off)
    with pytest.raises(ValueError, match="at most 16 buckets"):
        bucket_timeline([replace(on[0], bucket=i) for i in range(17)], back)
    with pytest.raises(TypeError, match="during_backward must be True or False"):
        bucket_timeline([replace(on[0], during_backward=1)], back)


# --- 2. memory per rank -----------------------------------------------------------------------

def test_memory_bars_are_the_costs_of_the_largest_rank() -> None:
    """Each bar is tfbook.parallel.costs' largest rank under its strategy, part by part, its
    total above it, and the bars' lengths are to one scale."""
    from tfbook.models.llama import smollm2_135m
    from tfbook.parallel import costs

    w = costs.Workload(smollm2_135m(), batch_size=8, seq_len=256, world_size=4)
    d = sharding_memory(w)
    assert list(d.parts) == ["one process", "DDP", "ZeRO-1", "FSDP"] and d.workload is w
    for name, parts in d.parts.items():
        rank = costs.FUNCTIONS[name](w).largest
        assert parts == memory_parts(w, name) == {
            "weights": rank.weights, "gathered": rank.gathered, "gradients": rank.gradients,
            "optimizer": rank.optimizer_state}
    assert d.parts["DDP"] == d.parts["one process"]  # DDP replicates everything
    assert d.parts["FSDP"]["weights"] < d.parts["DDP"]["weights"] / 3
    words = texts(d.svg)
    for name, parts in d.parts.items():
        assert f"{name}: {costs.format_bytes(sum(parts.values()))}" in words
    assert f"+ {costs.format_bytes(d.parts['FSDP']['gathered'])} gathered" in words
    assert f"N = {costs.n_parameters(w.config):,} parameters, float32" in words
    # the bars: segments whose lengths are proportional to the bytes
    totals = [sum(p.values()) for p in d.parts.values()]
    ys = sorted({r[1] for kind in ("embed", "ffn", "attn") for r in rects_of(d.svg,
                                                                            COLOURS[kind])
                 if r[2] > 12})
    lengths = [sum(r[2] for kind in ("embed", "ffn", "attn")
                   for r in rects_of(d.svg, COLOURS[kind]) if r[1] == y and r[2] > 12)
               for y in ys]
    gathered = d.parts["FSDP"]["gathered"] * lengths[0] / totals[0]
    lengths[-1] += gathered  # FSDP's dashed segment has no tint
    for length, total in zip(lengths, totals, strict=True):
        assert abs(length / lengths[0] - total / totals[0]) < 0.01


def test_memory_of_a_config_a_model_measured_bytes_and_impossible_splits() -> None:
    from tfbook.parallel import costs

    config = GPTConfig.tiny()
    torch.manual_seed(0)
    d = sharding_memory(GPT(config), 2, ["DDP", "FSDP"])
    assert d.parts == sharding_memory(config, 2, ["DDP", "FSDP"]).parts
    assert d.workload.dtype == "float32" and d.workload.world_size == 2
    measured = {"FSDP": {"weights": 1000, "gradients": 1000, "optimizer": 2000}}
    d = sharding_memory(config, 2, ["DDP", "FSDP"], measured=measured)
    assert d.parts["FSDP"] == {"weights": 1000.0, "gathered": 0.0, "gradients": 1000.0,
                               "optimizer": 2000.0}
    assert d.measured == ["FSDP"] and "FSDP: 4 kB (measured)" in texts(d.svg)
    # 8 ranks cannot split 4 heads or 2 blocks: those rows say why
    d = sharding_memory(config, 8, ["DDP", "tensor", "pipeline"], activations=True)
    assert "n_heads=4 must be a multiple of world_size=8" in d.parts["tensor"]
    assert "tensor: not possible here" in texts(d.svg)
    w = d.workload
    assert d.parts["DDP"]["activations"] == costs.ddp(w).largest.activations


def test_memory_bad_input() -> None:
    config = GPTConfig.tiny()
    with pytest.raises(TypeError, match="Workload, a GPTConfig or a tfbook GPT"):
        sharding_memory(1000, 4)
    with pytest.raises(ValueError, match="world_size must be an int from 2 to 1024"):
        sharding_memory(config, 1)
    with pytest.raises(ValueError, match="strategies must be a list of distinct names"):
        sharding_memory(config, 4, ["DDP", "ZeRO-2"])
    with pytest.raises(ValueError, match="strategies must be a list of distinct names"):
        sharding_memory(config, 4, ["<script>"])  # no free text reaches the drawing
    with pytest.raises(ValueError, match="measured must be a dict"):
        sharding_memory(config, 4, ["DDP"], measured={"FSDP": {}})
    with pytest.raises(ValueError, match=r"measured\['DDP'\] must be a dict of bytes"):
        sharding_memory(config, 4, ["DDP"], measured={"DDP": {"weights": -1, "gradients": 0,
                                                              "optimizer": 0}})
    with pytest.raises(ValueError, match="differs from the workload's"):
        from tfbook.parallel.costs import Workload
        sharding_memory(Workload(config, 4, 8, 2), 4)
    with pytest.raises(ValueError, match="strategy must be one of"):
        memory_parts(None, "ZeRO-3")


# --- 3. tensor parallelism --------------------------------------------------------------------

def tp_block(**changes):
    from tfbook.blocks import SelfAttentionBlock

    torch.manual_seed(0)
    config = replace(GPTConfig.tiny(), dropout=0.0, **changes).block_config()
    return SelfAttentionBlock(config).eval()


def test_tensor_shapes_are_the_real_shards() -> None:
    from tfbook.parallel.tensor import tensor_parallel_block

    world_size = 2
    block = tp_block(n_heads=6, d_model=48, d_ff=192)
    d = tensor_split(block, world_size)
    assert d.wired and d.difference < 1e-5
    words = texts(d.svg)
    for r in range(world_size):
        shard = tensor_parallel_block(block, r, world_size)
        real = {name: tuple(t.shape) for name, t in shard.named_parameters()}
        assert d.shards[r] == real
        for name, letter in (("q_proj", "W_Q"), ("k_proj", "W_K"), ("v_proj", "W_V"),
                             ("out_proj", "W_O")):
            assert f"{letter} {real[f'attn.inner.{name}.weight']}" in words
        assert f"W_1 {real['ff.inner.fc_in.weight']}" in words
        assert f"W_2 {real['ff.inner.fc_out.weight']}" in words
        h = 6 // world_size
        assert numbers(d.shape_labels[f"attn.attn.heads{r}"]) == (1, 4, h * 8)
        assert numbers(d.shape_labels[f"mlp.mlp.hidden{r}"]) == (1, 4, 192 // world_size)
        assert f"heads {r * h}–{(r + 1) * h - 1}" in words
    # the arrows are the recorded run's: x into every rank, each partial into g's sum
    for kind, layer in (("attn", "out_proj"), ("mlp", "fc_out")):
        for r in range(world_size):
            assert (f"{kind}.x", f"{kind}.{kind}{r}.{layer}:input") in d.edges
            assert (f"{kind}.{kind}{r}.{layer}", f"{kind}.{kind}.sum") in d.edges
    with pytest.raises(ValueError, match="disagree with the computation"):
        check_edges([("x", "attn0.out_proj"), ("attn0.out_proj", "attn.sum")], d.flow)


def test_the_marks_count_the_all_reduces_collective_count_counts() -> None:
    """f and g drawn once per sub-layer: 2 all-reduces forward (g) and 2 backward (f) per
    block, as CollectiveCount counts them on a real shard (a group of one rank, where each
    all-reduce is launched all the same)."""
    from tfbook.parallel.tensor import CollectiveCount, tensor_parallel_block

    block = tp_block()
    d = tensor_split(block, 2)
    assert d.marks == [("attention", "f"), ("attention", "g"), ("mlp", "f"), ("mlp", "g")]
    words = texts(d.svg)
    assert words.count("forward: identity backward: all-reduce") == 2
    assert words.count("forward: all-reduce backward: identity") == 2
    with one_rank_group(), CollectiveCount() as count:
        shard = tensor_parallel_block(block, 0, 2)
        x = torch.randn(1, 4, 64, requires_grad=True)
        out, _ = shard(x, causal=True)
        out.sum().backward()
    assert d.collectives == {"forward": count.forward, "backward": count.backward} == {
        "forward": 2, "backward": 2}


def test_tensor_split_of_a_grouped_query_swiglu_block() -> None:
    from tfbook.blocks import BlockConfig

    config = BlockConfig(d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, dropout=0.0,
                         ffn="swiglu", norm="rms", norm_first=True, bias=False,
                         rope_base=10000.0)
    d = tensor_split(config, 2)
    words = texts(d.svg)
    assert d.wired and "W_gate (64, 64)" in words and "(K, V: 1)" in words
    assert "W_K (16, 64)" in words and "y = Σ partials |" in words + " |"  # no bias


def test_tensor_split_bad_input() -> None:
    with pytest.raises(TypeError, match="SelfAttentionBlock, a BlockConfig or a GPTConfig"):
        tensor_split(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="world_size must be 2"):
        tensor_split(tp_block(), 3)
    with pytest.raises(ValueError, match="n_heads=3 must be a multiple of world_size=2"):
        tensor_split(tp_block(n_heads=3, d_model=48), 2)
    with pytest.raises(ValueError, match="needs dropout 0"):
        tensor_split(replace(GPTConfig.tiny(), dropout=0.1), 2)


# --- 4. pipeline schedules --------------------------------------------------------------------

@pytest.mark.parametrize("p, m", [(4, 6), (2, 4), (3, 2)])
def test_pipeline_slots_are_the_schedules(p: int, m: int) -> None:
    from tfbook.parallel.pipeline import bubble_fraction, peak_activations, schedule_order

    d = pipeline_schedules(p, m)
    words = texts(d.svg)
    for schedule, name in (("gpipe", "GPipe"), ("1f1b", "1F1B")):
        orders = [schedule_order(schedule, s, p, m) for s in range(p)]
        assert [[(k, i) for k, i, _, _ in ops] for ops in d.ops[schedule]] == orders
        assert d.peak[schedule] == [peak_activations(o) for o in orders]
        assert d.bubble[schedule] == pytest.approx(bubble_fraction(p, m))
        labels = {lb.key: lb.text for lb in d.labels if lb.key}
        for s in range(p):
            assert labels[f"{name}.peak.{s}"] == str(d.peak[schedule][s])
            for kind, i in orders[s]:
                assert labels[f"{name}.{kind}{i}.{s}"] == str(i)
        assert f"= {p - 1}/{m + p - 1} = {bubble_fraction(p, m):.3g}" in words
    # GPipe keeps every micro-batch alive on every stage, 1F1B at most p - s
    assert d.peak["gpipe"] == [m] * p
    assert d.peak["1f1b"] == [min(p - s, m) for s in range(p)]


def test_pipeline_idle_slots_drawn_are_the_bubble() -> None:
    """With forwards and backwards of one slot each, every stage idles 2 (p - 1) of its
    2 (m + p - 1) slots: measured on the drawing, the op boxes' widths against the row's."""
    from tfbook.parallel.pipeline import bubble_fraction

    p, m = 4, 5
    d = pipeline_schedules(p, m, 1.0, 1.0)
    for svg in d._narrow[:2]:  # GPipe's and 1F1B's timelines, each a drawing of its own
        rows = [r for r in rects_of(svg, COLOURS["mask"])]
        ops = rects_of(svg, COLOURS["attn"]) + rects_of(svg, COLOURS["head"])
        assert len(rows) == p and len(ops) == 2 * m * p
        for x, y, w, _ in rows:
            busy = [ow + 1 for ox, oy, ow, _ in ops if abs(oy - y) < 0.5]
            assert len(busy) == 2 * m and x <= min(ox for ox, *_ in ops)
            assert (w - sum(busy)) / w == pytest.approx(bubble_fraction(p, m), abs=0.002)
            assert round(w / busy[0]) == 2 * (m + p - 1)  # slots of a stage's timeline


def test_pipeline_with_measured_times_per_stage() -> None:
    """Op times per stage (as a run measures them): the stages' idle shares are simulate's,
    the slower stage idles least, and the formula is named as the equal-times case."""
    from tfbook.parallel.pipeline import bubble_fraction, simulate

    t_f, t_b = [0.010, 0.025], [0.020, 0.045]  # seconds: the last stage holds the head
    d = pipeline_schedules(2, 4, t_f, t_b)
    for schedule in ("gpipe", "1f1b"):
        sim = [s["bubble"] for s in simulate(schedule, 2, 4, t_f, t_b)]
        assert d.stage_bubble[schedule] == pytest.approx(sim)
        assert d.stage_bubble[schedule][1] < bubble_fraction(2, 4) < d.stage_bubble[schedule][0]
        for kind, _, start, stop in d.ops[schedule][1]:
            assert stop - start == pytest.approx(t_f[1] if kind == "F" else t_b[1])
    words = texts(d.svg)
    assert "per stage " + ", ".join(f"{b:.0%}" for b in d.stage_bubble["gpipe"]) in words
    assert f"(p − 1)/(m + p − 1) = {bubble_fraction(2, 4):.0%})" in words


def test_pipeline_refuses_a_drawing_simulate_disagrees_with(monkeypatch) -> None:
    import tfbook.parallel.pipeline as pipeline

    plain = pipeline.simulate

    def longer(*args, **kwargs):
        return [{**s, "span": s["span"] + 1} for s in plain(*args, **kwargs)]

    monkeypatch.setattr(pipeline, "simulate", longer)
    with pytest.raises(RuntimeError, match="disagree with simulate's"):
        pipeline_schedules(3, 4)


def test_pipeline_bad_input() -> None:
    with pytest.raises(ValueError, match="n_stages must be an int from 2 to 8"):
        pipeline_schedules(1, 4)
    with pytest.raises(ValueError, match="n_micro must be an int from 1 to 16"):
        pipeline_schedules(4, 0)
    with pytest.raises(ValueError, match="t_backward must be a finite number > 0, or 4 of"):
        pipeline_schedules(4, 4, 1.0, -2.0)
    with pytest.raises(ValueError, match="t_forward must be a finite number > 0, or 2 of"):
        pipeline_schedules(2, 4, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="n_stages must be an int"):
        pipeline_schedules(True, 4)


# --- 5. ring attention ------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_blocks_are_the_rings(p: int) -> None:
    from tfbook.parallel.ring import rank_chunks

    d = ring_zigzag(p)
    for layout in ("zigzag", "contiguous"):
        n = 2 * p if layout == "zigzag" else p
        owner = {j: r for r in range(p) for j in rank_chunks(r, p, layout)}
        pairs = d.pairs[layout]
        assert set(pairs) == {(a, b) for a in range(n) for b in range(a + 1)}  # causal
        for (a, b), (r, s, status) in pairs.items():
            assert r == owner[a] and s == (owner[a] - owner[b]) % p
            assert status == ("partial" if a == b else "full")
        labels = {lb.key: lb.text for lb in d.labels if lb.key}
        for (a, b), (_, s, _) in pairs.items():
            assert labels[f"{layout}.{layout}.{a}.{b}"] == str(s)
        for r, work in enumerate(d.work[layout]):
            assert labels[f"{layout}.{layout}.scores.{r}"] == str(work.scores)
            assert sum(work.forward) == sum(1 for v in pairs.values() if v[0] == r)
    zig = [w.scores for w in d.work["zigzag"]]
    assert len(set(zig)) == 1 and [sum(w.forward) for w in d.work["zigzag"]] == [2 * p + 1] * p
    assert zig == [(2 * p + 1) * 2 * 2] * p  # blocks of 2 x 2 scores (4p tokens)
    contiguous = [w.scores for w in d.work["contiguous"]]
    assert contiguous == [16 * (r + 1) for r in range(p)]  # rank r: r + 1 blocks of 4 x 4


def test_ring_cells_are_tinted_by_rank() -> None:
    d = ring_zigzag(3)
    svg = panels(d)[0]
    for r in range(3):
        cells = [el for el in ET.fromstring(svg).iter(f"{SVG}rect")
                 if f"fill:{HEAD_COLOURS[r]}" in (el.get("style") or "")]
        owned = sum(1 for v in d.pairs["zigzag"].values() if v[0] == r)
        assert len(cells) == owned + 1  # and the rank's legend swatch


def test_ring_bad_input() -> None:
    with pytest.raises(ValueError, match="world_size must be an int from 2 to 4"):
        ring_zigzag(5)
    with pytest.raises(ValueError, match="world_size must be an int from 2 to 4"):
        ring_zigzag(2.0)


# --- every figure: sizes, legible text, nothing overlapping, all text escaped ----------------

def drawings() -> dict[str, object]:
    on, back, off, back_off = synthetic_timeline()
    return {
        "buckets": bucket_timeline(on, back, off, back_off),
        "memory": sharding_memory(GPTConfig.tiny(), 4),
        "memory, measured, all": sharding_memory(
            GPTConfig.tiny(), 2, ["one process", "DDP", "ZeRO-1", "FSDP", "tensor", "pipeline",
                                  "ring"],
            {"ZeRO-1": {"weights": 4e6, "gradients": 4e6, "optimizer": 4e6, "activations": 1e6}},
            activations=True),
        "tensor": tensor_split(tp_block(), 2),
        "tensor, 6 heads": tensor_split(tp_block(n_heads=6, d_model=48, d_ff=192), 2),
        "pipeline": pipeline_schedules(4, 6),
        "pipeline, 8 stages": pipeline_schedules(8, 16),
        "ring": ring_zigzag(4),
    }


@pytest.fixture(scope="module")
def drawn() -> dict[str, object]:
    return drawings()


def test_drawing_is_cheap() -> None:
    start = time.process_time()
    drawings()
    assert time.process_time() - start < 3.0


def test_fits_a_phone_and_the_book_column_with_legible_text(drawn) -> None:
    for name, d in drawn.items():
        assert d.wired, name
        assert d._wide_min <= DESKTOP_COLUMN, (name, d._wide_min)
        assert max(d.phone_widths) <= PHONE_COLUMN, (name, d.phone_widths)
        for svg in [d.svg, *panels(d), *d._narrow]:
            sizes = [float(el.get("font-size")) for el in ET.fromstring(svg).iter(f"{SVG}text")]
            assert min(sizes) >= SMALL, name


def measure(svg: str) -> tuple[list[tuple], list[tuple]]:
    """The texts of a drawing as (text, left, top, right, bottom), their widths as svg.py
    estimates them (generously), and its lines as segments ((x0, y0), (x1, y1)), through the
    translations of its groups."""
    boxes, segments = [], []

    def walk(el: ET.Element, dx: float, dy: float) -> None:
        move = re.match(r"translate\(([-\d.]+),([-\d.]+)\)", el.get("transform") or "")
        if move:
            dx, dy = dx + float(move.group(1)), dy + float(move.group(2))
        if el.tag == f"{SVG}text":
            size, x, y = float(el.get("font-size")), float(el.get("x")), float(el.get("y"))
            lines = [s.text or "" for s in el] or [el.text or ""]
            mono = "m" in (el.get("class") or "").split()
            w = max(text_width(t, size, mono) for t in lines)
            left = {"start": x, "middle": x - w / 2, "end": x - w}[el.get("text-anchor")]
            boxes.append((" ".join(lines), dx + left, dy + y - 0.8 * size, dx + left + w,
                          dy + y + 0.2 * size + size * 1.25 * (len(lines) - 1)))
        elif el.tag == f"{SVG}polyline":
            pts = [tuple(float(v) for v in p.split(",")) for p in el.get("points").split()]
            segments.extend(((a[0] + dx, a[1] + dy), (b[0] + dx, b[1] + dy))
                            for a, b in zip(pts, pts[1:], strict=False))
        for child in el:
            walk(child, dx, dy)

    walk(ET.fromstring(svg), 0.0, 0.0)
    return boxes, segments


def test_no_two_texts_overlap_and_no_line_crosses_a_text(drawn) -> None:
    """Estimated in Python (text widths as generous as the layout's), so no browser starts;
    the gallery's Chromium test checks the same figures for sideways scrolling."""
    from tests.test_diagrams_inspect import crosses

    for name, d in drawn.items():
        for svg in [*panels(d), *d._narrow]:
            boxes, segments = measure(svg)
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    overlap = (min(a[3], b[3]) - max(a[1], b[1]) > 0.5
                               and min(a[4], b[4]) - max(a[2], b[2]) > 0.5)
                    assert not overlap, (name, a, b)
            for text, left, top, right, bottom in boxes:
                box = {"left": left, "top": top, "right": right, "bottom": bottom}
                hit = [seg for seg in segments if crosses(seg, box)]
                assert not hit, (name, text, hit[:2])


def test_every_text_is_escaped_and_parses(drawn) -> None:
    for d in drawn.values():
        for svg in [d.svg, *panels(d), *d._narrow]:
            root = ET.fromstring(svg)  # parses: every label escaped
            assert not any(el.tag.endswith("script") for el in root.iter())
    hostile = {"<script>": {"weights": 1, "gradients": 1, "optimizer": 1}}
    with pytest.raises(ValueError, match="measured must be a dict"):
        sharding_memory(GPTConfig.tiny(), 2, ["DDP"], measured=hostile)


def test_docstring_examples() -> None:
    assert doctest.testmod(sharding_figures).failed == 0


if __name__ == "__main__":  # `python -m tests.test_diagrams_sharding OUT.html`: to look at
    import sys
    from pathlib import Path

    from tests.diagram_gallery import page

    Path(sys.argv[1]).write_text(page([("sharding", n, d) for n, d in drawings().items()]))
