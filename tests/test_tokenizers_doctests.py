"""The worked examples in the tokenizer docstrings are true."""

import doctest

import pytest

from tfbook.tokenizers import bpe, pretokenize, pretrained, unigram, wordpiece


@pytest.mark.parametrize("module", [pretokenize, bpe, wordpiece, unigram, pretrained],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
