"""The helpers of bench/bench_decode.py, whose stored run book/fast/decoding_speed.md quotes:
checked on a tiny Llama-style model against counts and generation done another way."""

import json

import pytest
import torch

from tests.modules import load_module
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT
from tfbook.models.llama import tiny_llama
from tfbook.packing import pack_for_decoding
from tfbook.paths import BOOK_ROOT
from tfbook.quantize import quantise_linears

bench = load_module(BOOK_ROOT.parent / "bench" / "bench_decode.py")


def tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_llama()).eval()


def test_intensity_is_flops_over_bytes():
    # (3072, 576) float32, one row: 2 O K flops over 4 (O K + O + K) bytes
    assert bench.intensity(1, 3072, 576) == pytest.approx(2 * 3072 * 576 / (4 * (3072 * 576
                                                                               + 3072 + 576)))
    assert bench.intensity(8, 64, 64) == pytest.approx(8 * bench.intensity(1, 64, 64), rel=0.2)
    assert bench.intensity(1, 10, 10, nbytes=2) == pytest.approx(2 * bench.intensity(1, 10, 10))


@pytest.mark.parametrize("bad", [0, -1, 2.0, "1"])
def test_intensity_refuses_bad_sizes(bad):
    with pytest.raises(ValueError, match="positive int rows"):
        bench.intensity(bad, 10, 10)


def test_summary_is_work_over_time():
    s = bench.summary([2.0, 1.0, 4.0], work=8.0)
    assert s == {"median": 4.0, "min": 2.0, "max": 8.0}
    with pytest.raises(ValueError, match="positive times"):
        bench.summary([], 1.0)
    with pytest.raises(ValueError, match="positive times"):
        bench.summary([1.0, 0.0], 1.0)


def test_timed_runs_every_candidate_every_round_in_turn():
    order = []
    t = bench.timed({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                    repeats=3, warmup=1)
    assert order == ["a", "b"] * 4  # in turn, warm-up included
    assert {k: len(v) for k, v in t.items()} == {"a": 3, "b": 3}


def test_threads_busy_counts_at_least_the_calling_thread():
    busy = bench.threads_busy(lambda: sum(range(10_000)), seconds=0.05)
    assert busy is None or busy >= 1


def test_step_bytes_counts_the_tied_matrix_once_and_each_sequences_cache():
    m = tiny()
    c = m.config
    assert m.lm_head.weight is m.tok_emb.weight
    params = sum(p.numel() for p in m.parameters())  # the tied matrix once
    kv = 2 * c.n_layers * c.n_kv_heads * (c.d_model // c.n_heads) * 4
    assert bench.step_bytes(m, 10) == {"weights": 4 * params, "kv_cache": 10 * kv,
                                       "total": 4 * params + 10 * kv}
    assert bench.step_bytes(m, 10, batch=3)["kv_cache"] == 30 * kv
    with pytest.raises(ValueError, match="context >= 0"):
        bench.step_bytes(m, -1)
    with pytest.raises(ValueError, match="batch >= 1"):
        bench.step_bytes(m, 1, batch=0)


def test_step_bytes_of_an_int8_model_counts_codes_and_scales():
    m = quantise_linears(tiny())
    linears = [x for x in tiny().modules() if isinstance(x, torch.nn.Linear)]
    codes = sum(x.weight.numel() for x in linears)
    scales = sum(x.out_features for x in linears)
    norms = sum(p.numel() for name, p in m.named_parameters() if name != "tok_emb.weight")
    assert bench.step_bytes(m, 0)["weights"] == codes + 4 * scales + 4 * norms


def test_decoder_makes_generates_greedy_tokens():
    m, prompt = tiny(), [5, 7, 11, 13]
    step = bench.decoder(m, prompt, steps=6)
    for _ in range(6):
        step()
    made = torch.cat(step.tokens, 1)[0].tolist()  # the prompt's token, then one a step
    assert made == generate(m, torch.tensor([prompt]), 7).new_tokens[0].tolist()


@pytest.mark.parametrize(("make", "count", "kind"), [
    (lambda: tiny(), 7 * 2 + 1, "float"),
    (lambda: pack_for_decoding(tiny()), 4 * 2 + 1, "float"),
    (lambda: pack_for_decoding(quantise_linears(tiny())), 4 * 2 + 1, "int8"),
])
def test_record_products_sees_every_product_of_a_step(make, count, kind):
    m, linear, int8_matmul = make(), bench.F.linear, bench.quantize.int8_matmul
    records = bench.record_products(m, [1, 2, 3])
    assert len(records) == count and {r[0] for r in records} == {kind}
    assert (bench.F.linear, bench.quantize.int8_matmul) == (linear, int8_matmul)  # undone
    # the recorded operands give the step's products: the last one is the output layer
    x, w = records[-1][1], records[-1][2]
    assert w.shape[0] == m.config.vocab_size and x.shape[-1] == m.config.d_model


def test_stored_run_was_written_by_this_script():
    stored = json.loads((BOOK_ROOT / "fast" / "data" / "decoding_speed.json").read_text())
    assert set(stored["layouts"]) == set(bench.SHAPES)
    assert stored["protocol"]["rounds"] == bench.ROUNDS
    assert stored["protocol"]["steps_per_round"] == bench.STEPS
    assert [p["rows"] for p in stored["roofline"]["points"][::2]] == list(bench.ROOF_ROWS)
    assert list(stored["batch"]["tokens_per_s"]) == [str(b) for b in bench.BATCHES]
    for key in ("cpu_model", "blas", "threads", "load_average_1min",
                "load_average_1min_at_end"):
        assert key in stored["machine"]
