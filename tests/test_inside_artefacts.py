"""The cached sweeps of scripts/inside_the_model.py: their files are small and describe the
runs the script makes today, and cells the chapter does not replay recompute to the stored
values within derived float32 bounds (head scores of all 16 test sequences, patching cells of
both prompt pairs, attribution patching of the factual pair)."""

import json
from pathlib import Path

import pytest
import torch

from tests.modules import load_module
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
from tfbook.inspect import (
    KINDS,
    attribution_patching,
    head_scores,
    logit_diff,
    patch_once,
    repeated_random_tokens,
)
from tfbook.inspect.patching import PAIRS, replay_bound
from tfbook.paths import book_file
from tfbook.train.corpus_lm import load_trained_gpt

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "inside_the_model.py"


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


@pytest.fixture(scope="module")
def stored(script):
    return {name: json.loads((script.OUT / name).read_text(encoding="utf-8"))
            for name in ("head_scores.json", "patching_grids.json")}


@pytest.fixture(scope="module")
def smollm2():
    return load_smollm2(), load_smollm2_tokenizer()


def metric(pair):
    return lambda logits: logit_diff(logits, pair["answer_id"], pair["wrong_id"])


def bound(model, pair):
    """replay_bound for a stored pair: its length and both runs' logit differences."""
    return replay_bound(model.config, len(pair["clean_ids"]),
                        [pair["clean_metric"], pair["corrupted_metric"]])


def test_files_are_small_and_describe_the_scripts_runs(script, stored, smollm2):
    assert sum((script.OUT / n).stat().st_size for n in stored) < 300_000
    _, tok = smollm2
    scores, grids = stored["head_scores.json"], stored["patching_grids.json"]
    for name, shape in (("smollm2", (30, 9)), ("gpt", (2, 4))):
        test = scores[name]["test"]
        assert (test["n_tokens"], test["n_sequences"], test["seed"]) == (
            script.N_TOKENS, script.SCORE_SEQUENCES, script.SEED)
        assert scores[name]["replay"]["n_sequences"] == script.REPLAY_SEQUENCES
        for block in (scores[name]["scores"], scores[name]["replay"]["scores"]):
            assert set(block) == set(KINDS)
            assert all(torch.tensor(v).shape == shape for v in block.values())
        # the float64 comparison found rounding far below the scores' differences
        assert 0 < max(scores[name]["replay"]["rounding"].values()) < 1e-5
    assert scores["smollm2"]["test"]["bos_id"] == tok.bos_id
    assert scores["smollm2"]["test"]["exclude"] == sorted(tok.special_tokens.values())
    assert set(grids) - {"machine"} == set(PAIRS)
    for name, pair in PAIRS.items():
        g = grids[name]
        # the prompts the package names today, and their ids (equally many, one-token answers)
        assert [g[k] for k in ("clean", "corrupted", "answer", "wrong")] == [
            pair.clean, pair.corrupted, pair.answer, pair.wrong]
        assert pair.encode(tok) == (g["clean_ids"], g["corrupted_ids"], g["answer_id"],
                                    g["wrong_id"])
        T = len(g["clean_ids"])
        for method in ("activation", "attribution"):
            assert set(g[method]) == set(script.GRIDS)
            assert torch.tensor(g[method]["residual_pre"]).shape == (30, T)
            assert torch.tensor(g[method]["attn.heads"]).shape == (30, 9)
            assert torch.tensor(g[method]["attn.k"]).shape == (30, 3)  # key/value heads


def test_the_small_gpts_scores_recompute(script, stored):
    gpt, _ = load_trained_gpt(book_file("learning/data/training_gpt"))
    record = stored["head_scores.json"]["gpt"]
    test = record["test"]
    ids = repeated_random_tokens(test["vocab_size"], test["n_tokens"], test["n_sequences"],
                                 seed=test["seed"])
    live = head_scores(gpt, ids)
    bound = 10 * max(record["replay"]["rounding"].values())
    for kind in KINDS:
        assert (live[kind] - torch.tensor(record["scores"][kind])).abs().max() <= bound


def test_smollm2s_scores_of_all_16_sequences_recompute(stored, smollm2):
    model, _ = smollm2
    record = stored["head_scores.json"]["smollm2"]
    test = record["test"]
    ids = repeated_random_tokens(test["vocab_size"], test["n_tokens"], test["n_sequences"],
                                 bos_id=test["bos_id"], exclude=test["exclude"],
                                 seed=test["seed"])
    live = head_scores(model, ids)
    bound = 10 * max(record["replay"]["rounding"].values())
    for kind in KINDS:
        assert (live[kind] - torch.tensor(record["scores"][kind])).abs().max() <= bound


# cells the chapter does not replay: (pair, grid, layer, column)
CELLS = [("ioi", "attn.v", 23, 1), ("ioi", "attn.q", 17, 4), ("ioi", "attn.k", 24, 1),
         ("ioi", "residual_pre", 21, 13), ("factual", "attn.heads", 23, 4),
         ("factual", "residual_pre", 24, 9), ("factual", "attn.v", 1, 0)]


@pytest.mark.parametrize("pair_name, what, layer, column", CELLS)
def test_patching_cells_recompute(script, stored, smollm2, pair_name, what, layer, column):
    model, _ = smollm2
    pair = stored["patching_grids.json"][pair_name]
    where = {"positions": [column]} if what == "residual_pre" else {"heads": [column]}
    live = patch_once(model, pair["clean_ids"], pair["corrupted_ids"], metric(pair),
                      f"blocks.{layer}.{what}", **where)
    budget = bound(model, pair)
    assert abs(live - pair["activation"][what][layer][column]) <= budget
    # the cell is not one that any value near the corrupted run would pass
    assert abs(pair["activation"][what][layer][column] - pair["corrupted_metric"]) > 10 * budget


def test_attribution_patching_of_the_factual_pair_recomputes(script, stored, smollm2):
    model, _ = smollm2
    pair = stored["patching_grids.json"]["factual"]
    live = attribution_patching(model, pair["clean_ids"], pair["corrupted_ids"], metric(pair),
                                list(script.GRIDS))
    budget = bound(model, pair)
    for what in script.GRIDS:
        assert (live[what].values - torch.tensor(pair["attribution"][what])).abs().max() <= budget
    assert abs(live["residual_pre"].clean - pair["clean_metric"]) <= budget
    assert abs(live["residual_pre"].corrupted - pair["corrupted_metric"]) <= budget
