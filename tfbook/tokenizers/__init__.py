"""Tokenizers from scratch: byte-level BPE, WordPiece and Unigram, plus real vocabularies.

Modules in teaching order: `base` (the shared interface), `pretokenize` (regex and BERT
splitting), `bpe`, `wordpiece`, `unigram`, `pretrained` (GPT-2, cl100k, MiniLM loaders).
"""

from tfbook.tokenizers.base import Tokenizer
from tfbook.tokenizers.bpe import BPETokenizer, MergeStep
from tfbook.tokenizers.pretokenize import (
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    bert_pretokenize,
    regex_split,
)
from tfbook.tokenizers.pretrained import load_cl100k, load_gpt2, load_minilm_wordpiece
from tfbook.tokenizers.unigram import UnigramTokenizer
from tfbook.tokenizers.wordpiece import WordPieceTokenizer

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "BPETokenizer",
    "MergeStep",
    "Tokenizer",
    "UnigramTokenizer",
    "WordPieceTokenizer",
    "bert_pretokenize",
    "load_cl100k",
    "load_gpt2",
    "load_minilm_wordpiece",
    "regex_split",
]
