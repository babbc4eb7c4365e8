"""tfbook.posttrain.dpo: DPO's sigmoid loss, equal to TRL 1.16's DPOTrainer on the same log-probs.

The formula on hand numbers; the gradient's sign; `sequence_logps` against a per-token
cross-entropy on a tfbook GPT; and TRL's own loss code: `DPOTrainer._compute_loss` called
unbound on a minimal stand-in for the trainer (beta, loss_type "sigmoid", precomputed reference
log-probs) and a stand-in model returning per-token log-probs, as TRL's fused LM head does.
Its loss and logged rewards/margins must equal ours. Then DPOTrainer's whole loss path
(tokenising, collator, fused LM head, an explicit reference model) on a random 2-layer HF Llama
against ours on tfbook GPTs holding the same weights, with an explicit reference model and with
the adapter-disabled model as reference (LoRA). Bad input gives tfbook's own errors.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
from tfbook.lora import add_lora, lora_layers
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.posttrain.dpo import adapters_disabled, dpo_loss, preference_logps, sequence_logps


def test_formula_on_hand_numbers():
    pc, pr = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    rc, rr = torch.tensor([-11.0, -5.0]), torch.tensor([-11.0, -2.0])
    out = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # pair 0: chosen log-ratio 1, rejected -1 -> margin 0.5 * 2 = 1.0
    # pair 1: chosen log-ratio 1, rejected -1 -> margin 1.0 as well
    assert out.chosen_rewards.tolist() == [0.5, 0.5]
    assert out.rejected_rewards.tolist() == [-0.5, -0.5]
    assert out.margins.tolist() == [1.0, 1.0]
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-1.0)), rel=1e-6)
    # no preference learnt yet (policy == reference): loss log 2, rewards 0
    zero = dpo_loss(rc, rr, rc, rr)
    assert zero.loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert zero.margins.abs().max().item() == 0.0


def test_gradient_sign():
    pc = torch.tensor([-10.0, -4.0], requires_grad=True)
    pr = torch.tensor([-12.0, -3.0], requires_grad=True)
    rc, rr = torch.tensor([-11.0, -5.0]), torch.tensor([-11.0, -2.0])
    out = dpo_loss(pc, pr, rc, rr)
    out.loss.backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # raise chosen, lower rejected
    # and the size: d loss / d pi_c = -beta sigmoid(-margin) / B
    expected = -0.1 * torch.sigmoid(-out.margins) / 2
    torch.testing.assert_close(pc.grad, expected)
    higher = dpo_loss(pc.detach() + 1.0, pr.detach(), rc, rr).loss
    assert higher < out.loss.detach()


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(max_len=16, vocab_size=32, n_layers=1, n_heads=2, d_model=16)).eval()


def test_sequence_logps_equals_masked_cross_entropy():
    model = _tiny_gpt()
    ids = torch.randint(0, 32, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(3, 10, dtype=torch.long)
    mask[0, 4:] = 1
    mask[1, 2:7] = 1  # right padding after the completion
    mask[2, 9] = 1
    with torch.no_grad():
        got = sequence_logps(model, ids, mask)
        logits = model(ids).logits
    labels = ids.masked_fill(mask == 0, -100)[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, 32), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(got, -nll.view(3, 9).sum(dim=1))
    # padding after the completion does not change the sum (the model is causal)
    with torch.no_grad():
        short = sequence_logps(model, ids[1:2, :7], mask[1:2, :7])
    torch.testing.assert_close(short, got[1:2], rtol=1e-5, atol=1e-5)


def _trl_compute_loss(beta, per_token, completion_mask, ref_chosen, ref_rejected):
    """TRL 1.16's DPOTrainer._compute_loss on a stand-in trainer and model.

    per_token (2B, T-1): the policy's log-prob of each next token; TRL's fused LM head returns
    0 where the label is -100, which the stand-in model reproduces.
    """
    from trl.trainer.dpo_trainer import DPOTrainer

    def model(input_ids, attention_mask, use_cache, labels, fused_lm_head):
        keep = labels[:, 1:] != -100
        return SimpleNamespace(
            log_probs=per_token * keep,
            entropy=torch.zeros_like(per_token),
            mean_logits=torch.zeros_like(per_token),
            is_top1=torch.zeros_like(keep),
        )

    model.training = True
    accel = SimpleNamespace(
        device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x
    )
    trainer = SimpleNamespace(
        model=model,
        accelerator=accel,
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=beta,
        use_weighting=False,
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    n = per_token.size(0)
    inputs = {
        "input_ids": torch.zeros(n, per_token.size(1) + 1, dtype=torch.long),
        "attention_mask": torch.ones(n, per_token.size(1) + 1, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, trainer._metrics["train"]


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_equal_to_trl_dpo_trainer_loss(beta):
    g = torch.Generator().manual_seed(2)
    B, T = 4, 12
    per_token = -torch.rand(2 * B, T - 1, generator=g) * 3  # log-probs of the next tokens
    completion_mask = torch.zeros(2 * B, T, dtype=torch.long)
    for i in range(2 * B):
        start = int(torch.randint(1, 6, (1,), generator=g))
        stop = int(torch.randint(start + 1, T + 1, (1,), generator=g))
        completion_mask[i, start:stop] = 1
    ref = -torch.rand(2 * B, generator=g) * 20
    ref_chosen, ref_rejected = ref[:B], ref[B:]
    trl_loss, metrics = _trl_compute_loss(
        beta, per_token, completion_mask, ref_chosen, ref_rejected
    )

    policy = (per_token * completion_mask[:, 1:]).sum(dim=1)  # what sequence_logps returns
    ours = dpo_loss(policy[:B], policy[B:], ref_chosen, ref_rejected, beta=beta)
    torch.testing.assert_close(ours.loss, trl_loss, rtol=1e-6, atol=1e-6)
    assert metrics["rewards/chosen"][0] == pytest.approx(
        ours.chosen_rewards.mean().item(), rel=1e-6, abs=1e-6
    )
    assert metrics["rewards/rejected"][0] == pytest.approx(
        ours.rejected_rewards.mean().item(), rel=1e-6, abs=1e-6
    )
    assert metrics["rewards/margins"][0] == pytest.approx(
        ours.margins.mean().item(), rel=1e-6, abs=1e-6
    )
    assert metrics["rewards/accuracies"][0] == (ours.margins > 0).float().mean().item()
    assert metrics["logps/chosen"][0] == pytest.approx(policy[:B].mean().item(), rel=1e-6)


def test_preference_logps_on_a_gpt():
    model = _tiny_gpt()
    c = torch.tensor([[1, 2, 3, 4, 5, 0], [7, 8, 9, 10, 0, 0]])
    r = torch.tensor([[1, 2, 3, 6, 0, 0], [7, 8, 11, 12, 13, 14]])
    cm = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0]])
    rm = torch.tensor([[0, 0, 0, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        pc, pr = preference_logps(model, c, cm, r, rm)
    torch.testing.assert_close(pc, sequence_logps(model, c, cm))
    torch.testing.assert_close(pr, sequence_logps(model, r, rm))
    # chosen identical to rejected (different right padding) is refused
    same = torch.tensor([[1, 2, 3, 4, 5, 9]])
    with pytest.raises(ValueError, match=r"pairs \[0\] have chosen identical to rejected"):
        preference_logps(model, c[:1], cm[:1], same, torch.tensor([[0, 0, 0, 1, 1, 0]]))


def test_bad_input():
    x = torch.tensor([-1.0, -2.0])
    with pytest.raises(ValueError, match="shape of policy_chosen"):
        dpo_loss(x, x, x, torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="empty"):
        dpo_loss(torch.tensor([]), torch.tensor([]), torch.tensor([]), torch.tensor([]))
    with pytest.raises(ValueError, match="finite"):
        dpo_loss(x, torch.tensor([-1.0, float("nan")]), x, x)
    with pytest.raises(ValueError, match="finite"):
        dpo_loss(x, x, torch.tensor([float("-inf"), -1.0]), x)
    for beta in (0, -0.1, float("inf"), True):
        with pytest.raises(ValueError, match="beta"):
            dpo_loss(x, x, x, x, beta=beta)
    with pytest.raises(TypeError, match="1-D floating"):
        dpo_loss([-1.0], x, x, x)
    model = _tiny_gpt()
    ids = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="shape of input_ids"):
        sequence_logps(model, ids, torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="no completion token"):
        sequence_logps(model, ids, torch.tensor([[0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="first token"):
        sequence_logps(model, ids, torch.tensor([[1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="only 0 and 1"):
        sequence_logps(model, ids, torch.tensor([[0, 2, 0, 0]]))
    with pytest.raises(ValueError, match=r"lie in \[0, 32\)"):
        sequence_logps(model, torch.tensor([[1, 2, 99, 4]]), torch.tensor([[0, 1, 1, 0]]))
    with pytest.raises(TypeError, match="integer tensor"):
        sequence_logps(model, ids.float(), torch.tensor([[0, 1, 1, 0]]))
    with pytest.raises(ValueError, match="at least one sequence"):
        sequence_logps(model, ids[:0], torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="same number of pairs"):
        preference_logps(
            model,
            torch.tensor([[1, 2, 3], [1, 2, 4]]),
            torch.tensor([[0, 1, 1], [0, 1, 1]]),
            torch.tensor([[1, 2, 5]]),
            torch.tensor([[0, 1, 1]]),
        )



def _word_tokenizer():
    """An offline HF tokenizer: one id per whitespace-separated word w0..w59."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(60)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>"
    )


def _tiny_llama(seed: int):
    """A random HF Llama: V 63, C 32, 2 layers, 4 heads (2 KV heads), untied head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=63, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=0.3,
    ))  # fmt: skip


def _dpo_trainer(tmp_path, model, **kwargs):
    """DPOTrainer (trl 1.16) on two in-memory pairs of different lengths, CPU, float32."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    pairs = Dataset.from_dict({
        "prompt": ["w1 w2 w3", "w4 w5"],
        "chosen": [" w6 w7", " w8 w9 w10 w11"],
        "rejected": [" w12", " w13 w14"],
    })  # fmt: skip
    args = DPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1, report_to=[],
        bf16=False, use_cpu=True, beta=0.1, save_strategy="no",
    )  # fmt: skip
    return DPOTrainer(
        model=model, args=args, train_dataset=pairs, processing_class=_word_tokenizer(), **kwargs
    )


def _check_first_batch(trainer, policy_logps, reference_logps):
    """TRL's loss and logged metrics on its first batch equal ours from the given log-prob fns."""
    batch = next(iter(trainer.get_train_dataloader()))  # rows: 2 chosen, then 2 rejected
    trl_loss = trainer.compute_loss(trainer.model, batch)
    metrics = trainer._metrics["train"]
    ids, mask = batch["input_ids"], batch["completion_mask"]
    with torch.no_grad():
        pol, ref = policy_logps(ids, mask), reference_logps(ids, mask)
    ours = dpo_loss(pol[:2], pol[2:], ref[:2], ref[2:], beta=0.1)
    assert ours.margins.abs().min() > 0.05  # a test that could tell a wrong sign or beta
    torch.testing.assert_close(ours.loss, trl_loss.detach(), rtol=1e-5, atol=1e-5)
    for key, value in (
        ("rewards/chosen", ours.chosen_rewards), ("rewards/rejected", ours.rejected_rewards),
        ("rewards/margins", ours.margins), ("logps/chosen", pol[:2]), ("logps/rejected", pol[2:]),
    ):  # fmt: skip
        assert metrics[key][0] == pytest.approx(value.mean().item(), rel=1e-5, abs=1e-5), key


def test_equal_to_trl_dpo_trainer_with_explicit_reference(tmp_path):
    """DPOTrainer's own path (tokenising, collator, fused LM head, an explicit ref_model) on a
    random 2-layer HF Llama; ours on tfbook GPTs holding the same weights."""
    policy, reference = _tiny_llama(0), _tiny_llama(1)  # unlike: the rewards are not 0
    ours_policy, ours_ref = tfbook_from_hf_llama(policy), tfbook_from_hf_llama(reference)
    trainer = _dpo_trainer(tmp_path, policy, ref_model=reference)
    _check_first_batch(
        trainer,
        lambda ids, mask: sequence_logps(ours_policy, ids, mask),
        lambda ids, mask: sequence_logps(ours_ref, ids, mask),
    )


def test_equal_to_trl_dpo_trainer_with_lora_reference(tmp_path):
    """The LoRA path: DPOTrainer given peft_config (a new adapter) and no ref_model uses the
    adapter-disabled model as reference; ours uses `adapters_disabled` on a tfbook GPT holding the
    same weights and adapters. (Given a PeftModel whose adapter exists, TRL instead keeps a copy
    of it as a "ref" adapter, so the reference is the adapter as it was, not the base model.)"""
    from peft import LoraConfig

    base = _tiny_llama(0)
    ours = add_lora(tfbook_from_hf_llama(base), ("q_proj", "v_proj"), r=4, alpha=8)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = _dpo_trainer(tmp_path, base, peft_config=lora)
    assert "ref" not in trainer.model.peft_config  # a new adapter: the reference is the base
    torch.manual_seed(1)
    with torch.no_grad():  # B != 0 (peft starts it at 0): the policy differs from its reference
        for name, layer in lora_layers(ours).items():
            i, proj = name.split(".")[1], name.rsplit(".", 1)[-1]
            hf = trainer.model.get_submodule(f"base_model.model.model.layers.{i}.self_attn.{proj}")
            hf.lora_B["default"].weight.normal_(0, 0.5)
            layer.lora_A.copy_(hf.lora_A["default"].weight)
            layer.lora_B.copy_(hf.lora_B["default"].weight)

    def reference_logps(ids, mask):
        with adapters_disabled(ours):
            return sequence_logps(ours, ids, mask)

    _check_first_batch(trainer, lambda ids, mask: sequence_logps(ours, ids, mask), reference_logps)
    assert all(layer.enabled and layer.scaling == 2.0 for layer in lora_layers(ours).values())
    with pytest.raises(ValueError, match="needs a model with LoRA layers"):
        with adapters_disabled(_tiny_gpt()):
            pass


# --- the book's preference set, its tokenisation, and DPO as the training loop's loss_fn ---


def test_contains_answer():
    from tfbook.posttrain.dpo import contains_answer

    assert contains_answer("7 + 5 = 12.", "12") and not contains_answer("It is 112.", "12")
    assert contains_answer("It is the sun.", "Sun") and not contains_answer("Sunday", "Sun")
    assert contains_answer("Mexico City, I think", "Mexico City")
    with pytest.raises(TypeError, match="must be str"):
        contains_answer("12", 12)


def test_preference_set():
    from tfbook.posttrain.dpo import contains_answer, load_preferences

    pairs = load_preferences()
    train, held = load_preferences("train"), load_preferences("held_out")
    assert len(train) + len(held) == len(pairs) >= 60 and len(held) >= 10
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}
    assert {p["kind"] for p in pairs} == {"wrong", "rambling"}
    for split in (train, held):  # both kinds in both splits
        assert {p["kind"] for p in split} == {"wrong", "rambling"}
    for p in pairs:
        assert p["chosen"] != p["rejected"] and contains_answer(p["chosen"], p["answer"])
        # a wrong answer lacks the fact, a rambling one states it too
        assert contains_answer(p["rejected"], p["answer"]) == (p["kind"] == "rambling")
        if p["kind"] == "rambling":  # the same answer, longer
            assert len(p["rejected"]) > 2 * len(p["chosen"])
    with pytest.raises(ValueError, match="split must be one of"):
        load_preferences("test")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"chosen": "  "}, ValueError, "chosen is empty"),
        ({"rejected": ""}, ValueError, "rejected is empty"),
        ({"prompt": ""}, ValueError, "prompt is empty"),
        ({"rejected": "Paris. "}, ValueError, "chosen and rejected are the same"),
        ({"chosen": 3}, TypeError, "chosen must be a str"),
        ({"split": "dev"}, ValueError, "split must be one of"),
        ({"answer": "Lyon"}, ValueError, "answer must be a non-empty str"),
        ({"answer": "Par"}, ValueError, "answer must be a non-empty str"),
    ],
)
def test_preference_set_refuses_bad_pairs(tmp_path, change, error, match):
    import json

    from tfbook.posttrain.dpo import load_preferences

    pair = {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Lyon.",
            "answer": "Paris", "kind": "wrong", "split": "train"}
    path = tmp_path / "prefs.json"
    path.write_text(json.dumps({"pairs": [{**pair, **change}]}))
    with pytest.raises(error, match=match):
        load_preferences(path=path)
    path.write_text(json.dumps({"pairs": [pair, {**pair, "chosen": "Paris!"}]}))
    with pytest.raises(ValueError, match="appears twice"):
        load_preferences(path=path)
    path.write_text(json.dumps({"pairs": []}))
    with pytest.raises(ValueError, match="non-empty list"):
        load_preferences(path=path)


@pytest.fixture(scope="module")
def smol_tokenizer():
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def test_preference_example_marks_the_answer(smol_tokenizer):
    from tfbook.posttrain.chat import chat_ids
    from tfbook.posttrain.dpo import collate_pairs, preference_example

    tok = smol_tokenizer
    ex = preference_example(tok, "What is 2 + 2?", "4.", "2 + 2 is 5, I think.")
    for ids, mask, answer in ((ex.chosen_ids, ex.chosen_mask, "4."),
                              (ex.rejected_ids, ex.rejected_mask, "2 + 2 is 5, I think.")):
        assert len(ids) == len(mask) and mask[-1] == 1  # ends on the answer's <|im_end|>
        assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == answer + "<|im_end|>"
        prompt = chat_ids(tok, [{"role": "user", "content": "What is 2 + 2?"}],
                          add_generation_prompt=True)
        assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
    batch = collate_pairs([ex, ex], pad_id=0)
    assert batch["chosen_ids"].shape == (2, len(ex.chosen_ids))
    assert batch["rejected_ids"].shape == (2, len(ex.rejected_ids))
    assert int((batch["labels"] != -100).sum()) == 2 * (sum(ex.chosen_mask) + sum(ex.rejected_mask))
    with pytest.raises(ValueError, match="chosen and rejected are the same"):
        preference_example(tok, "Hi", "Hello.", "Hello.")
    with pytest.raises(ValueError, match="chosen is empty"):
        preference_example(tok, "Hi", "", "Hello.")
    with pytest.raises(ValueError, match="non-empty list of PreferenceExample"):
        collate_pairs([], pad_id=0)


def _tiny_lora_gpt():
    model = _tiny_gpt()
    add_lora(model, ("q_proj", "v_proj"), r=2, alpha=4)
    return model


def _tiny_batch():
    from tfbook.posttrain.dpo import PreferenceExample, collate_pairs

    examples = [
        PreferenceExample([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [1, 2, 3, 6], [0, 0, 0, 1]),
        PreferenceExample([7, 8, 9, 10], [0, 0, 1, 1], [7, 8, 11, 12, 13], [0, 0, 1, 1, 1]),
    ]
    return collate_pairs(examples, pad_id=0)


def test_dpo_loss_fn_reference_and_log():
    from tfbook.posttrain.dpo import DPOLossFn, reference_logps

    model = _tiny_lora_gpt()
    batch = _tiny_batch()
    fn = DPOLossFn(beta=0.1)
    first = fn(model, batch)  # lora_B = 0: the policy is its reference
    assert first.item() == pytest.approx(math.log(2), abs=1e-6)
    torch.manual_seed(3)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.5)
    ref_c, ref_r = reference_logps(model, batch)  # the adapter-disabled model
    precomputed = {**batch, "ref_chosen": ref_c, "ref_rejected": ref_r}
    loss = fn(model, precomputed)
    torch.testing.assert_close(loss, fn(model, batch))
    with torch.no_grad():
        pol_c, pol_r = sequence_logps(model, batch["chosen_ids"], batch["chosen_mask"]), \
            sequence_logps(model, batch["rejected_ids"], batch["rejected_mask"])
    want = dpo_loss(pol_c, pol_r, ref_c, ref_r, beta=0.1)
    torch.testing.assert_close(loss.detach(), want.loss)
    assert abs(want.margins).min() > 1e-3  # the adapters moved the policy
    assert len(fn.log["loss"]) == 3
    assert fn.log["margins"][1] == pytest.approx(want.margins.mean().item(), rel=1e-5)
    assert fn.log["chosen_logps"][1] == pytest.approx(pol_c.mean().item(), rel=1e-5)
    assert fn.log["accuracy"][1] == (want.margins > 0).float().mean().item()
    # an explicit reference model gives the reference's log-probs
    other = _tiny_gpt()
    explicit = DPOLossFn(beta=0.1, reference=other)
    with torch.no_grad():
        oc = sequence_logps(other, batch["chosen_ids"], batch["chosen_mask"])
        orr = sequence_logps(other, batch["rejected_ids"], batch["rejected_mask"])
    torch.testing.assert_close(explicit(model, batch).detach(),
                               dpo_loss(pol_c, pol_r, oc, orr, beta=0.1).loss)
    with pytest.raises(ValueError, match="label smoothing"):
        fn(model, batch, 0.1)
    with pytest.raises(ValueError, match="beta"):
        DPOLossFn(beta=0.0)
    with pytest.raises(ValueError, match="LoRA layers"):
        reference_logps(_tiny_gpt(), batch)


def test_dpo_in_the_training_loop():
    """The one training loop with DPOLossFn: the margin grows on the pairs it trains on."""
    from tfbook.posttrain.dpo import DPOLossFn
    from tfbook.train.loop import TrainConfig, train

    model = _tiny_lora_gpt()
    batch = _tiny_batch()
    fn = DPOLossFn(beta=0.5)
    config = TrainConfig(steps=8, lr=3e-2, schedule="constant", weight_decay=0.0, seed=0)
    history = train(model, lambda g: batch, config, loss_fn=fn, progress=False)
    assert len(fn.log["loss"]) == 8 and history.loss == fn.log["loss"]
    assert fn.log["loss"][0] == pytest.approx(math.log(2), abs=1e-6)
    assert fn.log["margins"][-1] > 0.1 and fn.log["loss"][-1] < fn.log["loss"][0] - 0.05
    assert history.tokens[-1] == 8 * int((batch["labels"] != -100).sum())


def test_preference_batches():
    from tfbook.posttrain.dpo import PreferenceExample, collate_pairs, preference_batches

    examples = [PreferenceExample([1, k + 2, 3], [0, 1, 1], [1, k + 2, 4], [0, 1, 1])
                for k in range(5)]
    refs_c, refs_r = [-float(k) for k in range(5)], [-10.0 - k for k in range(5)]
    next_batch = preference_batches(examples, 3, 0, refs_c, refs_r)
    batch = next_batch(torch.Generator().manual_seed(4))
    pick = torch.randperm(5, generator=torch.Generator().manual_seed(4))[:3].tolist()
    want = collate_pairs([examples[i] for i in pick], 0)
    for key, value in want.items():
        assert torch.equal(batch[key], value), key
    assert batch["ref_chosen"].tolist() == [refs_c[i] for i in pick]
    assert batch["ref_rejected"].tolist() == [refs_r[i] for i in pick]
    assert "ref_chosen" not in preference_batches(examples, 2, 0)(torch.Generator())
    with pytest.raises(ValueError, match="batch_pairs"):
        preference_batches(examples, 6, 0)
    with pytest.raises(ValueError, match="both be given"):
        preference_batches(examples, 2, 0, refs_c, None)


def test_adapters_disabled_is_the_base_model_even_with_a_broken_adapter():
    """Switched off, a LoRA layer computes its base alone: a NaN in an adapter (a diverged
    run) cannot reach the reference log-probs through 0 * NaN; on exit the adapters are on."""
    torch.manual_seed(0)
    base = _tiny_gpt()
    policy = add_lora(copy.deepcopy(base), r=2, alpha=4)
    ids = torch.randint(0, 32, (2, 6))
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.fill_(float("nan"))
        want = base(ids).logits
        assert torch.isnan(policy(ids).logits).all()
        with adapters_disabled(policy):
            assert torch.equal(policy(ids).logits, want)
        assert torch.isnan(policy(ids).logits).all()
        with pytest.raises(RuntimeError, match="boom"), adapters_disabled(policy):
            raise RuntimeError("boom")
    assert all(layer.enabled for layer in lora_layers(policy).values())
