"""Bad input to Part VI's decoding code (speculative decoding, static and continuous batching)
and to the checks `generate` shares with them: each is refused with tfbook's own TypeError or
ValueError saying what was expected and what was given, never a silent answer or an error
from inside Python or torch."""

import math

import pytest
import torch

from tfbook.generate.scheduler import contiguous_bytes, generate_paged, generate_static
from tfbook.generate.search import as_end_ids, generate
from tfbook.generate.speculative import (
    _Rule,
    acceptance_probability,
    early_exit_model,
    emitted_distribution,
    prompt_lookup,
    residual_distribution,
    speculative_generate,
    verify,
)
from tfbook.models.gpt import GPT, GPTConfig


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(max_len=32, vocab_size=16, n_layers=2, n_heads=2, d_model=16)).eval()


GREEDY = _Rule(0.0, None, None, None)
SAMPLED = _Rule(1.0, None, None, torch.Generator().manual_seed(0))


# --- verify ------------------------------------------------------------------------------

def test_verify_needs_one_logit_row_per_draft_token_plus_one():
    logits = torch.randn(2, 5)
    for rule in (GREEDY, SAMPLED):
        for tokens in ([1, 2], [1, 2, 3]):  # 2 rows would answer only 1 draft token
            with pytest.raises(ValueError, match=rf"{len(tokens)} tokens need "
                                                 rf"{len(tokens) + 1} rows, got 2"):
                verify(logits, tokens, None, rule)
    assert len(verify(logits, [1], None, GREEDY)) in (1, 2)  # the right size is answered
    with pytest.raises(ValueError, match=r"draft ids must lie in \[0, V=5\), got 7"):
        verify(logits, [7], None, GREEDY)
    with pytest.raises(TypeError, match="tokens must be a list of int draft ids"):
        verify(logits, [1.0], None, GREEDY)
    with pytest.raises(TypeError, match="tokens must be a list of int draft ids"):
        verify(logits, "1", None, GREEDY)
    with pytest.raises(TypeError, match=r"logits must be a floating tensor \(n \+ 1, V\), got "
                                        r"a torch.int64 tensor of shape \(2, 5\)"):
        verify(torch.ones(2, 5, dtype=torch.long), [1], None, GREEDY)
    with pytest.raises(TypeError, match="logits must be a floating tensor"):
        verify(torch.randn(5), [], None, GREEDY)
    with pytest.raises(ValueError, match=r"q must be None or the draft's distributions \(n, V\) "
                                         r"= \(1, 5\), got \(2, 5\)"):
        verify(logits, [1], torch.full((2, 5), 0.2), SAMPLED)
    with pytest.raises(ValueError, match=r"verify: q must hold finite probabilities >= 0, "
                                         r"got nan at index \(0, 1\)"):
        verify(logits, [1], torch.tensor([[0.5, math.nan, 0.5, 0.0, 0.0]]), SAMPLED)
    with pytest.raises(TypeError, match="rule must be the loop's _Rule, got str"):
        verify(logits, [1], None, "greedy")


# --- the acceptance rule -----------------------------------------------------------------

@pytest.mark.parametrize("function", [acceptance_probability, residual_distribution,
                                      emitted_distribution])
def test_distributions_over_different_vocabularies_are_refused(function):
    p, q = torch.full((5,), 0.2), torch.full((4,), 0.25)
    name = function.__name__ if function is not emitted_distribution else (
        "acceptance_probability")
    with pytest.raises(ValueError, match=rf"{name}: p and q must be distributions over the "
                                         r"same tokens \(the same shape\), got p \(5,\) and q "
                                         r"\(4,\)"):
        function(p, q)
    with pytest.raises(ValueError, match="got p \\(2, 5\\) and q \\(5,\\)"):  # no broadcasting
        function(torch.full((2, 5), 0.2), torch.full((5,), 0.2))
    with pytest.raises(TypeError, match=r"q must be a floating tensor \(\.\.\., V\) of "
                                        r"probabilities, got list"):
        function(p, [0.2] * 5)
    with pytest.raises(TypeError, match="p must be a floating tensor .* got a torch.int64 "
                                        "tensor of shape \\(5,\\)"):
        function(torch.ones(5, dtype=torch.long), q)
    for bad in (math.nan, math.inf, -0.1):
        with pytest.raises(ValueError, match=rf"p must hold finite probabilities >= 0, got "
                                             rf"{bad} at index \(0,\)"):
            function(torch.tensor([bad, 0.5, 0.5, 0.0, 0.0]), torch.full((5,), 0.2))
    assert function(p, torch.full((5,), 0.2)).shape == (5,)  # the right sizes are answered


# --- the drafts and the loop -------------------------------------------------------------

def test_prompt_lookup_and_early_exit_refuse_what_is_not_ids_or_a_model(model):
    for bad in ("abcab", [1, 2.0, 1], None, torch.tensor([[1, 2], [1, 2]]),
                torch.tensor([1.0, 2.0])):
        with pytest.raises(TypeError, match=r"context must be token ids \(a list of ints or a "
                                            r"1-D integer tensor\), got"):
            prompt_lookup(bad, 2)
    assert prompt_lookup(torch.tensor([5, 6, 7, 5]), 2) == prompt_lookup([5, 6, 7, 5], 2) == [6, 7]
    for bad in (None, "model", torch.nn.Linear(2, 2)):
        with pytest.raises(TypeError, match=r"target must be a tfbook model with "
                                            r"config.n_layers"):
            early_exit_model(bad, 1)


def test_speculative_generate_refuses_bad_end_ids_and_flags(model):
    from tfbook.generate.speculative import PromptLookupDraft

    draft = PromptLookupDraft()
    for bad in ("3", None, 2.0):
        with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence of "
                                            "them, got"):
            speculative_generate(model, [1, 2, 3], 4, draft, end_ids=bad)
    with pytest.raises(ValueError, match=r"end token ids must be ints in \[0, 16\), got 99"):
        speculative_generate(model, [1, 2, 3], 4, draft, end_ids=[99])
    with pytest.raises(TypeError, match="keep_logits must be True or False, got 'yes'"):
        speculative_generate(model, [1, 2, 3], 4, draft, keep_logits="yes")


def test_generate_refuses_bad_end_ids_and_flags(model):
    assert as_end_ids(3) == [3] and as_end_ids((3, 4)) == [3, 4]
    assert as_end_ids(torch.tensor([3, 4])) == [3, 4] and as_end_ids({5}) == [5]
    for bad in ("3", None, 2.5, torch.tensor([1.0])):
        with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence"):
            generate(model, [[1, 2]], 2, end_ids=bad)
    for name in ("use_cache", "keep_logits", "slide_context"):
        for bad in (1, "yes", None):
            with pytest.raises(TypeError, match=rf"{name} must be True or False, got {bad!r}"):
                generate(model, [[1, 2]], 2, **{name: bad})


# --- static and continuous batching ------------------------------------------------------

def test_generate_static_takes_one_budget_for_all_or_one_per_prompt(model):
    prompts = [[1, 2, 3], [4, 5], [6]]
    one, _ = generate_static(model, prompts, 3, batch_size=2)
    each, _ = generate_static(model, prompts, [3, 3, 3], batch_size=2)
    assert one == each and [len(o) for o in one] == [3, 3, 3]
    assert generate_paged(model, prompts, 3, num_blocks=8, block_size=4) == one
    for run in (lambda b: generate_static(model, prompts, b, batch_size=2),
                lambda b: generate_paged(model, prompts, b, num_blocks=8, block_size=4)):
        with pytest.raises(ValueError, match="one max_new_tokens per prompt: 3 prompts, 2 "
                                             "budgets"):
            run([3, 3])
        with pytest.raises(ValueError, match="one max_new_tokens per prompt: 3 prompts, 4 "
                                             "budgets"):
            run([3, 3, 3, 3])
        for bad in ([3, 0, 3], [3, -1, 3], [3, 2.0, 3], [3, True, 3]):
            with pytest.raises(ValueError, match=rf"max_new_tokens must be positive ints, got "
                                                 rf"{bad[1]!r} for prompt 1"):
                run(bad)
        for bad in ("3", 2.5, None):
            with pytest.raises(TypeError, match="max_new_tokens must be an int or a list of "
                                                "ints"):
                run(bad)
    with pytest.raises(TypeError, match="prompts must be a list of lists of int ids, got str"):
        generate_static(model, "abc", 3, batch_size=2)
    with pytest.raises(TypeError, match="prompts must be a list of lists of int ids, got Tensor"):
        generate_static(model, torch.tensor([[1, 2]]), 3, batch_size=2)
    with pytest.raises(ValueError, match="prompts must hold at least one prompt, got none"):
        generate_static(model, [], 3, batch_size=2)
    with pytest.raises(TypeError, match="token ids must be ints, got 'a'"):
        generate_static(model, [["a"]], 3, batch_size=2)
    with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence"):
        generate_static(model, prompts, 3, batch_size=2, end_ids="2")


def test_contiguous_bytes_checks_its_sizes(model):
    assert contiguous_bytes(model, 2, 8) == 2 * contiguous_bytes(model, 1, 8)
    for name, args in (("batch_size", (0, 8)), ("positions", (1, -4))):
        with pytest.raises(ValueError, match=rf"{name} must be >= 1, got"):
            contiguous_bytes(model, *args)
    with pytest.raises(TypeError, match="batch_size must be an int, got True"):
        contiguous_bytes(model, True, 8)
    with pytest.raises(TypeError, match="contiguous_bytes needs a tfbook model"):
        contiguous_bytes(None, 1, 8)
