"""tfbook.posttrain.evaluate against lm-evaluation-harness 0.4.13 on SmolLM2, offline.

The reference is lm_eval's `HFLM(pretrained=<LlamaForCausalLM>, tokenizer=<fast tokenizer>)`:
the HF Llama built from the shipped GGUF and a fast tokenizer built from the GGUF's own
vocabulary (tests/inspect_reference.py), with the hub switched off so nothing is downloaded.
Checked: the context/continuation split (trailing spaces moved, empty context), the summed
log-likelihoods and is_greedy of tfbook's code on tfbook's SmolLM2 (a derived float32 bound),
and acc, acc_norm and acc_bytes of lm_eval's own multiple-choice task built on the book's
questions (its prompts, requests and `process_results`).
"""

from __future__ import annotations

import pytest
import torch

from tests import inspect_reference as ref
from tfbook.checkpoints.smollm2 import (
    HF_RELATIVE_BOUND,
    hf_llama_from_gguf,
    load_smollm2,
    load_smollm2_tokenizer,
    read_smollm2_gguf,
)
from tfbook.posttrain.evaluate import (
    encode_pair,
    load_mc_questions,
    loglikelihoods,
    mc_predictions,
    mc_prompt,
    mc_requests,
)

# free-form requests: trailing space in the context, a continuation of several words, an
# empty context (scored after the prefix token), a continuation glued to its context
FREE_REQUESTS = [
    ("The capital of France is ", "Paris"),
    ("The capital of France is", " Paris, a city on the Seine."),
    ("", "Water boils at one hundred degrees."),
    ("One, two, three, four", ", five"),
]
N_QUESTIONS = 4  # the first questions of the book's set, 4 options each


@pytest.fixture(scope="module")
def models():
    """lm_eval's HFLM around the HF Llama (with and without BOS), tfbook's SmolLM2, tokenizers."""
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    fast = ref.smollm2_fast_tokenizer()  # add_bos_token=True: encode() puts BOS in front
    with ref.offline_hub():
        from lm_eval.models.huggingface import HFLM

        harness = {
            True: HFLM(pretrained=hf, tokenizer=fast, batch_size=8),
            False: HFLM(pretrained=hf, tokenizer=fast, batch_size=8, add_bos_token=False),
        }
    return harness, load_smollm2(layout="hf"), load_smollm2_tokenizer()


def harness_loglikelihoods(lm, requests):
    from lm_eval.api.instance import Instance

    with ref.offline_hub():
        instances = [Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)]
        return lm.loglikelihood(instances, disable_tqdm=True)


def bound_and_margins(model, tok, requests, add_bos):
    """The float32 bound on one token's log-likelihood and, per request, the smallest gap
    between a continuation token's logit and the best other logit (is_greedy's deciding sign).

    tfbook's logits equal HF's within HF_RELATIVE_BOUND * max |logit| (tested for every layout
    and kernel); a log-softmax moves at most twice as much as its logits (logsumexp is
    1-Lipschitz in the max norm), so a continuation of m tokens moves at most
    m * 2 HF_RELATIVE_BOUND max |logit|. One right-padded batch, as `score_ids` runs it.
    """
    pairs = [encode_pair(tok, c, x, add_bos) for c, x in requests]
    rows = [ctx + cont[:-1] for ctx, cont in pairs]
    batch = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        all_logits = model(batch).logits  # (B, T, V)
    per_token, margins = [], []
    for i, (row, (_, cont)) in enumerate(zip(rows, pairs, strict=True)):
        logits = all_logits[i, len(row) - len(cont) : len(row)]  # (m, V)
        per_token.append(2 * HF_RELATIVE_BOUND * float(logits.abs().max()))
        index = torch.tensor(cont)[:, None]
        target = logits.gather(-1, index).squeeze(-1)  # (m,)
        others = logits.scatter(-1, index, float("-inf")).max(-1).values  # (m,)
        margins.append(float((target - others).abs().min()))
    return per_token, margins


@pytest.mark.parametrize("add_bos", [False, True])
def test_split_equals_harness(models, add_bos):
    harness, _, tok = models
    lm = harness[add_bos]
    for context, continuation in FREE_REQUESTS + mc_requests(load_mc_questions()):
        ours = encode_pair(tok, context, continuation, add_bos)
        if context:
            theirs = lm._encode_pair(context, continuation)
            assert ours == (list(theirs[0]), list(theirs[1])), (context, continuation)
        else:  # lm_eval's loglikelihood: the prefix token, then the continuation alone
            assert ours == (
                [lm.prefix_token_id],
                lm.tok_encode(continuation, add_special_tokens=False),
            )
    # the trailing space moved: "is " + "Paris" is scored as "is" + " Paris"
    assert encode_pair(tok, *FREE_REQUESTS[0]) == encode_pair(
        tok, "The capital of France is", " Paris"
    )


@pytest.mark.parametrize("add_bos", [False, True])
def test_loglikelihoods_equal_harness(models, add_bos):
    harness, model, tok = models
    # with BOS the free-form requests only; without, one question's options too
    requests = FREE_REQUESTS + ([] if add_bos else mc_requests(load_mc_questions()[:1]))
    theirs = harness_loglikelihoods(harness[add_bos], requests)
    ours = loglikelihoods(model, tok, requests, add_bos=add_bos, batch_size=5)
    per_token, margins = bound_and_margins(model, tok, requests, add_bos)
    assert any(t[1] for t in theirs) and not all(t[1] for t in theirs)  # both kinds checked
    for k, (o, t) in enumerate(zip(ours, theirs, strict=True)):
        bound = o.n_tokens * per_token[k]
        assert abs(o.logprob - t[0]) <= bound, (requests[k], o.logprob, t[0], bound)
        assert margins[k] > per_token[k]  # the argmax cannot flip within the bound
        assert o.is_greedy == t[1], requests[k]


def test_multiple_choice_accuracy_equals_harness_task(models):
    """lm_eval builds the prompts and requests of a multiple_choice task on the book's
    questions, scores them with HFLM and computes acc, acc_norm and acc_bytes per question."""
    import datasets

    harness, model, tok = models
    questions = load_mc_questions()[:N_QUESTIONS]
    docs = [
        {"question": q.question, "choices": list(q.choices), "answer": q.answer} for q in questions
    ]
    with ref.offline_hub():
        from lm_eval.api.task import ConfigurableTask

        task = ConfigurableTask(
            config={
                "task": "tfbook_mc",
                "output_type": "multiple_choice",
                "test_split": "test",
                "custom_dataset": lambda **_: {"test": datasets.Dataset.from_list(docs)},
                "doc_to_text": "Question: {{question}}\nAnswer:",
                "doc_to_choice": "{{choices}}",
                "doc_to_target": "answer",
                "metric_list": [{"metric": m} for m in ("acc", "acc_norm", "acc_bytes")],
            }
        )
    requests, metrics = [], []
    for doc, q in zip(task.test_docs(), questions, strict=True):
        assert task.doc_to_text(doc) == mc_prompt(q)
        instances = task.construct_requests(doc, task.doc_to_text(doc), metadata=("mc", 0, 1))
        requests += [i.args for i in instances]
        with ref.offline_hub():
            metrics.append(
                task.process_results(
                    doc, harness[False].loglikelihood(instances, disable_tqdm=True)
                )
            )
    assert requests == mc_requests(questions)
    # MMLU's layout (the options listed, then " A", " B", ...): lm_eval builds the same requests
    with ref.offline_hub():
        lettered = ConfigurableTask(
            config={
                **task.config.to_dict(),
                "task": "tfbook_mc_letters",
                "custom_dataset": lambda **_: {"test": datasets.Dataset.from_list(docs)},
                "doc_to_text": "Question: {{question}}\n"
                + "".join(f"{x}. {{{{choices[{i}]}}}}\n" for i, x in enumerate("ABCD"))
                + "Answer:",
                "doc_to_choice": ["A", "B", "C", "D"],
            }
        )
    letter_requests = [
        i.args
        for doc in lettered.test_docs()
        for i in lettered.construct_requests(doc, lettered.doc_to_text(doc), metadata=("m", 0, 1))
    ]
    assert letter_requests == mc_requests(questions, "letters")

    scores = loglikelihoods(model, tok, requests, batch_size=8)
    per_token, _ = bound_and_margins(model, tok, requests, False)
    names = {"acc": "sum", "acc_norm": "chars", "acc_bytes": "bytes"}
    for metric, normalisation in names.items():
        picks = mc_predictions(questions, scores, normalisation)
        for k, q in enumerate(questions):
            # the decision is float-robust: the best option leads the next by more than the bound
            values = sorted(
                (
                    s.logprob / _length(c, s, normalisation),
                    s.n_tokens * per_token[4 * k + j] / _length(c, s, normalisation),
                )
                for j, (c, s) in enumerate(zip(q.choices, scores[4 * k : 4 * k + 4], strict=True))
            )
            assert values[-1][0] - values[-2][0] > values[-1][1] + values[-2][1]
            assert float(picks[k] == q.answer) == metrics[k][metric], (metric, k)
    # on these questions the normalisation changes at least one decision
    assert mc_predictions(questions, scores, "sum") != mc_predictions(questions, scores, "chars")


def _length(choice, score, normalisation):
    return {"sum": 1, "chars": len(choice), "bytes": len(choice.encode())}[normalisation]
