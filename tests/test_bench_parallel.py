"""The helpers of bench/bench_parallel.py and the layout of its stored run, which the sharding
chapter quotes (book/learning/data/sharding_speed.json). No process group is started here."""

import json

import pytest

from tests.modules import load_module
from tfbook.paths import BOOK_ROOT

bench = load_module(BOOK_ROOT.parent / "bench" / "bench_parallel.py")
STORED = BOOK_ROOT / "learning" / "data" / "sharding_speed.json"
ROW_FIELDS = {"name", "ours", "torch", "ours_s", "torch_s", "ratio", "ratio_min", "ratio_max",
              "cpu_ours_s", "cpu_torch_s", "cpu_ratio", "wall_per_rank_s", "cpu_per_rank_s",
              "rounds", "steps_per_timed_call", "max_abs_diff", "tolerance", "checked"}


def test_compare_takes_the_slower_rank_the_cpu_sum_and_per_round_ratios():
    # rows: (wall rank 0, wall rank 1, CPU rank 0, CPU rank 1) of each timed call of 2 steps
    times = {"a": [(2.0, 4.0, 1.0, 1.0), (2.0, 2.0, 1.0, 3.0), (6.0, 2.0, 2.0, 2.0)],
             "b": [(8.0, 8.0, 2.0, 2.0), (2.0, 2.0, 1.0, 1.0), (12.0, 6.0, 4.0, 4.0)]}
    labels = {"a": "ours", "b": "theirs"}
    row = bench.compare("x", times, "a", "b", labels, {"max_abs_diff": 0.0}, per=2, extra=1)
    assert row["ours_s"] == 2.0 and row["torch_s"] == 4.0  # medians of max(wall) / 2
    assert row["ratio"] == 2.0 and row["ratio_min"] == 1.0 and row["ratio_max"] == 2.0
    assert row["cpu_ours_s"] == 2.0 and row["cpu_torch_s"] == 2.0  # CPU summed over ranks
    assert row["cpu_ratio"] == 2.0  # per round: 4/2, 2/4, 8/4
    assert row["wall_per_rank_s"] == {"ours": [1.0, 1.0], "torch": [4.0, 3.0]}
    assert row["ours"] == "ours" and row["torch"] == "theirs" and row["extra"] == 1
    assert ROW_FIELDS - {"tolerance", "checked"} <= row.keys()


def test_different_computations_are_not_timed():
    assert bench.checked("same", 0.0, 0.0)["max_abs_diff"] == 0.0
    with pytest.raises(RuntimeError, match="differ by"):
        bench.checked("weights", 1e-3, 0.0)
    with pytest.raises(RuntimeError, match="differ by"):
        bench.checked("weights", float("nan"), 1.0)


def test_the_stored_run_has_the_documented_layout():
    run = json.loads(STORED.read_text())
    assert {"machine", "settings", "results", "timeline", "ring_work"} <= run.keys()
    m = run["machine"]
    assert m["processes"] == 2 and m["threads_per_process"] == 1 and m["backend"] == "gloo"
    assert "load_average_1min" in m and "load_average_1min_at_end" in m
    names = {row["name"] for row in run["results"]}
    assert {"ddp_gpt_4x256", "ddp_overlap_gain_gpt_4x256", "zero_step", "zero_train_step",
            "fsdp_float32", "fsdp_bf16", "pipeline_gpipe", "pipeline_1f1b",
            "tensor_parallel_vs_unsplit", "ring_zigzag", "ring_contiguous"} <= names
    for row in run["results"]:
        assert ROW_FIELDS <= row.keys(), row["name"]
        assert row["max_abs_diff"] <= row["tolerance"], row["name"]
        assert row["ours_s"] > 0 and row["torch_s"] > 0 and row["ratio"] > 0
    # zig-zag deals every rank the same score blocks; contiguous gives the last rank 2 of 3
    work = run["ring_work"]
    assert work["zigzag"]["max_over_mean_scores"] == 1.0
    assert work["contiguous"]["max_over_mean_scores"] == pytest.approx(4 / 3)
    # the timeline: every gradient in exactly one bucket, launched in order
    ddp = next(r for r in run["results"] if r["name"] == "ddp_gpt_4x256")
    for rank in run["timeline"]["ranks"]:
        buckets = rank["overlap"]["buckets"]
        assert sum(b["numel"] for b in buckets) == ddp["params"]
        assert [b["bucket"] for b in buckets] == list(range(len(buckets)))
        assert all(b["during_backward"] for b in buckets)
        assert not any(b["during_backward"] for b in rank["no_overlap"]["buckets"])
