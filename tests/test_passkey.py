"""tfbook.passkey: the prompt is exact in tokens with the needle where it was asked for; bad
input is refused; SmolLM2 retrieves a key from a 1,024-token prompt, and the one-pass score
agrees with greedy decoding and with the full logits; the stored sweep of
scripts/passkey_smollm2.py is whole and agrees with itself and with today's prompt builder."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

from tests.modules import load_module
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
from tfbook.generate.search import generate
from tfbook.passkey import (
    FILLER,
    INSTRUCTION,
    KEY_DIGITS,
    NEEDLE,
    QUESTION,
    last_positions_only,
    min_passkey_length,
    passkey_prompt,
    random_passkey,
    score_passkey,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "passkey_smollm2.py"


@pytest.fixture(scope="module")
def tok():
    return load_smollm2_tokenizer()


@pytest.fixture(scope="module")
def model():
    return load_smollm2(attention="torch")


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


@pytest.fixture(scope="module")
def stored(script):
    return json.loads(script.OUT.read_text(encoding="utf-8"))


# --- the prompt ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [0, 1, 34, 447, 1981])  # filler tokens
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompt_is_exact_and_the_needle_sits_at_the_depth(tok, extra, depth):
    key = "48213"
    length = min_passkey_length(tok, key) + extra
    p = passkey_prompt(tok, length, key, depth)
    encode = tok.encode_ordinary
    instruction, filler, needle, question = (encode(t) for t in (
        INSTRUCTION, FILLER, NEEDLE.format(key=key), QUESTION))
    assert len(p.ids) == p.length == length
    assert p.ids[:len(instruction)] == instruction
    assert p.ids[length - len(question):] == question
    assert p.ids[p.needle_start:p.needle_end] == needle
    assert p.answer_ids == encode(key) and len(p.answer_ids) == KEY_DIGITS
    # the filler around the needle is the filler passage repeated, cut once at the needle
    around = p.ids[len(instruction):p.needle_start] + p.ids[p.needle_end:length - len(question)]
    assert around == (filler * (len(around) // len(filler) + 1))[:len(around)]
    assert p.filler_before == p.needle_start - len(instruction)
    assert p.filler_before + p.filler_after == len(around)
    # at a sentence boundary (an end of the filler, or right after a ".")...
    before = p.ids[p.needle_start - 1]
    assert p.filler_before in (0, len(around)) or tok.decode([before]) == "."
    # ...and no boundary is nearer to the depth asked for
    boundaries = [0, len(around)] + [i + 1 for i, t in enumerate(around[:-1])
                                     if tok.decode([t]) == "."]
    best = min(abs(b - depth * len(around)) for b in boundaries)
    assert abs(p.filler_before - depth * len(around)) == best
    assert abs(p.needle_depth - depth) <= len(filler) / max(len(around), 1)


def test_keys_change_only_the_needle(tok):
    a, b = (passkey_prompt(tok, 400, key, 0.5) for key in ("11111", "98765"))
    assert a.needle_start == b.needle_start and a.needle_end == b.needle_end
    differ = [i for i, (x, y) in enumerate(zip(a.ids, b.ids, strict=True)) if x != y]
    assert differ and all(a.needle_start <= i < a.needle_end for i in differ)


def test_random_passkey_is_seeded_five_digits():
    keys = [random_passkey(random.Random(7)) for _ in range(2)]
    assert keys[0] == keys[1] and len(keys[0]) == 5 and keys[0].isdigit() and keys[0][0] != "0"
    assert len({random_passkey(random.Random(s)) for s in range(20)}) > 15


def test_bad_input_is_refused(tok):
    shortest = min_passkey_length(tok)
    passkey_prompt(tok, shortest, "12345", 0.5)  # no filler at all: allowed
    with pytest.raises(ValueError, match=f"too short.*{shortest} tokens"):
        passkey_prompt(tok, shortest - 1, "12345", 0.5)
    for depth in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"depth .*\[0, 1\].*got"):
            passkey_prompt(tok, 500, "12345", depth)
    for depth in (float("nan"), "0.5", None):
        with pytest.raises(TypeError, match="depth must be a number"):
            passkey_prompt(tok, 500, "12345", depth)
    for key in ("1234", "123456", "1234a", "12 34", "١٢٣٤٥"):  # the last: Arabic-Indic digits
        with pytest.raises(ValueError, match="5 decimal digits"):
            passkey_prompt(tok, 500, key, 0.5)
    with pytest.raises(TypeError, match="string of 5 digits"):
        passkey_prompt(tok, 500, 12345, 0.5)
    for length in (500.0, True, "500"):
        with pytest.raises(TypeError, match="length must be an int"):
            passkey_prompt(tok, length, "12345", 0.5)
    with pytest.raises(TypeError, match="tfbook Tokenizer"):
        passkey_prompt("gpt2", 500, "12345", 0.5)
    with pytest.raises(TypeError, match="random.Random"):
        random_passkey(7)
    with pytest.raises(TypeError, match="PasskeyPrompt"):
        score_passkey(torch.nn.Linear(2, 2), [1, 2, 3])
    with pytest.raises(TypeError, match="norm_f"):
        with last_positions_only(torch.nn.Linear(2, 2), 3):
            pass


# --- SmolLM2, live ---------------------------------------------------------------------------

def test_smollm2_retrieves_the_key_from_1024_tokens(model, tok):
    key = random_passkey(random.Random(2026))
    prompt = passkey_prompt(tok, 1024, key, 0.5)
    score = score_passkey(model, prompt, tok)
    assert score.predicted == key and score.exact and score.digit_accuracy == 1.0
    assert all(lp <= 0 for lp in score.token_logprob)
    assert math.isclose(score.logprob, sum(score.token_logprob))
    assert score.logprob > math.log(0.5)  # the key, as a whole, is more likely than not


def test_one_pass_score_is_greedy_decoding_and_the_full_logits(model, tok):
    """On a short prompt: the sliced output layer gives the full forward's logits, and its
    argmax digits are the tokens greedy decoding writes (exact <=> greedy writes the key)."""
    prompt = passkey_prompt(tok, 160, "70431", 0.3)
    score = score_passkey(model, prompt, tok)
    idx = torch.tensor([prompt.ids + prompt.answer_ids[:-1]])
    with torch.inference_mode():
        full = model(idx).logits[0, -KEY_DIGITS:]  # (5, V)
        with last_positions_only(model, KEY_DIGITS):
            sliced = model(idx).logits[0]  # (5, V)
    assert sliced.shape == full.shape
    bound = 1e-5 * full.abs().max().item()  # the same sums; only the last matmul's blocking
    assert (sliced - full).abs().max().item() <= bound
    logprobs = full.log_softmax(-1)
    for i, t in enumerate(prompt.answer_ids):
        assert abs(score.token_logprob[i] - logprobs[i, t].item()) <= 1e-4
    run = generate(model, [prompt.ids], KEY_DIGITS)  # greedy
    written = run.new_tokens[0].tolist()
    assert (written == prompt.answer_ids) == score.exact
    assert score.exact  # this short prompt is easy
    assert tok.decode(written) == score.predicted


def test_script_models_share_the_weights_under_a_scaled_config(script, model):
    """The sweep's models: SmolLM2's own weight tensors (not copies), the scaling asked for,
    and room for the prompt (the unscaled one too: only the length guard is lifted)."""
    for name, scaling in script.SCALINGS.items():
        scaled = script.model_for(model, scaling, 12_292)
        assert scaled.config.rope_scaling == scaling and scaled.config.max_len == 12_292
        assert scaled.config == type(model.config)(**{
            **{f: getattr(model.config, f) for f in model.config.__dataclass_fields__},
            "max_len": 12_292, "rope_scaling": scaling}), name
        for (key, ours), theirs in zip(scaled.state_dict().items(),
                                       model.state_dict().values(), strict=True):
            assert ours.data_ptr() == theirs.data_ptr(), key  # the same memory
        assert scaled.lm_head.weight is scaled.tok_emb.weight and not scaled.training
    assert script.model_for(model, None, 100).config.max_len == model.config.max_len


# --- the stored sweep ------------------------------------------------------------------------

def test_stored_sweep_is_whole_and_consistent(script, stored, tok):
    grid = stored["grid"]
    assert grid == json.loads(json.dumps(script.grid_record()))  # the script's grid today
    assert stored["prompt"] == {"instruction": INSTRUCTION, "filler": FILLER, "needle": NEEDLE,
                                "question": QUESTION}
    ids = {f"{c['length']}/{c['depth']}/{c['scaling']}" for c in stored["cells"]}
    expected = {f"{n}/{d}/{s}" for n in grid["lengths"] for d in grid["depths"]
                for s in grid["scalings"]}
    assert stored["complete"] and stored["missing"] == [] and ids == expected
    assert len(stored["cells"]) == len(expected)
    assert max(grid["lengths"]) > grid["trained_context"] > min(grid["lengths"])
    keys = script.grid_keys()
    for c in stored["cells"]:
        assert c["key"] == keys[(c["length"], c["depth"])]  # same key for every scaling
        assert 0.0 <= c["digit_accuracy"] <= 1.0
        assert len(c["token_correct"]) == len(c["token_logprob"]) == KEY_DIGITS
        assert c["digit_accuracy"] == sum(c["token_correct"]) / KEY_DIGITS
        assert c["exact"] == all(c["token_correct"])
        assert all(lp <= 0 for lp in c["token_logprob"])
        assert math.isclose(c["logprob"], sum(c["token_logprob"]))
        assert c["exact"] == (c["predicted"] == c["key"])  # the argmax tokens, decoded
        # the prompt the script ran is the one passkey_prompt builds today
        prompt = passkey_prompt(tok, c["length"], c["key"], c["depth"])
        assert (c["needle_start"], c["needle_depth"]) == (prompt.needle_start,
                                                          prompt.needle_depth)
        assert c["cpu_seconds"] >= 0 and (c["cpu_seconds"] > 0) == ("same_as" not in c)
    by_id = {(c["length"], c["depth"], c["scaling"]): c for c in stored["cells"]}
    fields = ("predicted", "token_correct", "token_logprob")
    for (length, depth, scaling), c in by_id.items():
        none = by_id[(length, depth, "none")]
        if "same_as" in c:  # reused only where dynamic NTK changes nothing
            assert scaling == "dynamic" and c["same_as"] == "none"
            assert length + KEY_DIGITS - 1 <= grid["trained_context"]
            assert length != grid["dynamic_check_length"]
            assert all(c[f] == none[f] for f in fields)
        if scaling == "dynamic" and length == grid["dynamic_check_length"]:
            assert "same_as" not in c and all(c[f] == none[f] for f in fields)  # measured
    for row in stored["summary"]:
        group = [c for c in stored["cells"]
                 if (c["length"], c["scaling"]) == (row["length"], row["scaling"])]
        assert row["cells"] == len(group) == len(grid["depths"]) and row["complete"]
        assert math.isclose(row["digit_accuracy"],
                            sum(c["digit_accuracy"] for c in group) / len(group))
        assert math.isclose(row["exact_rate"], sum(c["exact"] for c in group) / len(group))
        assert 0.0 <= row["digit_accuracy"] <= 1.0 and 0.0 <= row["exact_rate"] <= 1.0
    for record in [stored["machine"]] + [run["machine"] for run in stored["runs"]]:
        assert {"cpu", "threads", "torch", "load_average_1min", "omp_wait_policy"} <= set(record)
    assert stored["machine"] == stored["runs"][-1]["machine"]
    assert stored["attention"] == "torch"
