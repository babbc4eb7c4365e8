"""tfbook.posttrain.grpo: group advantages and GRPO's clipped loss, equal to TRL 1.16.

Hand numbers for advantages and the three normalisations; per-token gradients from autograd
against the analytic gradient of the clipped objective (clipped tokens: zero); TRL's own code:
`GRPOTrainer._compute_loss` called unbound on a minimal stand-in trainer whose
`_get_per_token_logps_and_entropies` returns fixed per-token log-probs (float32, i.e. bf16=False
semantics), for grpo, bnpo and dr_grpo, with and without the KL term; advantages against TRL's
`nanstd` and its 1e-4. Bad input gives tfbook's own errors.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tests.test_posttrain_dpo import _tiny_llama, _word_tokenizer
from tfbook.posttrain.grpo import group_advantages, grpo_loss


def test_advantages_on_hand_numbers():
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 2.0, 2.0], group_size=2)
    # group (1, 0): mean 0.5, unbiased std sqrt(0.5); group (2, 2): std 0 -> advantages 0
    s = math.sqrt(0.5) + 1e-4
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, 0, 0]))
    dr = group_advantages(torch.tensor([3, 0, 0, 1]), group_size=4, scale=False)
    assert dr.tolist() == [2.0, -1.0, -1.0, 0.0]


def test_advantages_equal_trl_nanstd():
    from trl.trainer.utils import nanstd

    torch.manual_seed(0)
    rewards = torch.randint(0, 3, (12,)).float()
    g = 4
    # TRL 1.16 GRPOTrainer._generate_and_score_completions, scale_rewards="group"
    mean = torch.nanmean(rewards.view(-1, g), dim=1).repeat_interleave(g, dim=0)
    std = nanstd(rewards.view(-1, g), dim=1).repeat_interleave(g, dim=0)
    trl_adv = (rewards - mean) / (std + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, g), trl_adv)  # float32 rounding
    torch.testing.assert_close(group_advantages(rewards, g, scale=False), rewards - mean)


def _batch():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.0, -4.0]])
    old = torch.tensor([[-1.0, -2.5, -0.2], [-0.3, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    return logps, old, adv, mask


def test_normalisations_on_hand_numbers():
    logps, old, adv, mask = _batch()
    r = torch.exp(logps - old)
    # seq 0, A = +1: -min(r, clip(r)) ; seq 1, A = -1: -min(-r, -clip(r)) = max(r, clip(r))
    l0 = [-min(x, min(max(x, 0.8), 1.2)) for x in r[0].tolist()]
    l1 = [max(x, min(max(x, 0.8), 1.2)) for x in r[1].tolist()[:2]]
    assert l0[1] == pytest.approx(-1.2)  # r = e^0.5 = 1.65 clipped at 1.2
    # r = e^-0.5 = 0.61 with A < 0: the pessimistic max keeps the clipped 0.8 (zero gradient)
    assert l1[1] == pytest.approx(0.8)
    grpo = (sum(l0) / 3 + sum(l1) / 2) / 2
    bnpo = (sum(l0) + sum(l1)) / 5
    dr = (sum(l0) + sum(l1)) / (2 * 4)
    assert grpo_loss(logps, old, adv, mask).item() == pytest.approx(grpo, rel=1e-6)
    got = grpo_loss(logps, old, adv, mask, loss_type="bnpo")
    assert got.item() == pytest.approx(bnpo, rel=1e-6)
    got = grpo_loss(logps, old, adv, mask, loss_type="dr_grpo", max_completion_length=4)
    assert got.item() == pytest.approx(dr, rel=1e-6)


def test_normalisations_on_policy():
    # on-policy (ratio 1): every token's loss is -A; a 3-token sequence with A = 2, a 1-token
    # sequence with A = -1
    logps = torch.full((2, 3), -1.0)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert grpo_loss(logps, logps, adv, mask).item() == -0.5  # (-2 + 1) / 2
    assert grpo_loss(logps, logps, adv, mask, loss_type="bnpo").item() == -1.25  # (-6 + 1) / 4
    dr = grpo_loss(logps, logps, adv, mask, loss_type="dr_grpo", max_completion_length=5)
    assert dr.item() == -0.5  # (-6 + 1) / (2 * 5)


def test_per_token_gradient_matches_analytic():
    torch.manual_seed(1)
    B, T = 4, 6
    old = -torch.rand(B, T) * 3
    logps = (old + torch.randn(B, T) * 0.4).requires_grad_(True)
    adv = torch.tensor([1.5, -0.7, 0.3, -2.0])
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    loss = grpo_loss(logps, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28, loss_type="bnpo")
    (grad,) = torch.autograd.grad(loss, logps)
    r = torch.exp(logps.detach() - old)
    a = adv.unsqueeze(1)
    clipped = ((r > 1.28) & (a > 0)) | ((r < 0.8) & (a < 0))
    assert clipped.any() and (~clipped & mask.bool()).any()  # both kinds of token present
    expected = torch.where(clipped, torch.zeros_like(r), -r * a) * mask / mask.sum()
    torch.testing.assert_close(grad, expected)
    assert (grad[clipped] == 0).all()


def _trl_loss(logps, old, adv, mask, loss_type, beta=0.0, ref=None, max_len=None):
    """TRL 1.16's GRPOTrainer._compute_loss on a stand-in trainer (float32: bf16=False)."""
    from trl import GRPOTrainer

    def fixed_logps(model, input_ids, attention_mask, logits_to_keep, **kw):
        return logps, torch.zeros_like(logps), None

    accel = SimpleNamespace(
        reduce=lambda x, reduction="sum": x, gather=lambda x: x, gather_for_metrics=lambda x: x
    )
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=fixed_logps,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=True, delta=None),
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        accelerator=accel,
    )
    B, T = logps.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return GRPOTrainer._compute_loss(trainer, None, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_equals_trl_compute_loss(loss_type, beta):
    torch.manual_seed(2)
    B, T, max_len = 6, 7, 9
    old = -torch.rand(B, T) * 4
    logps = old + torch.randn(B, T) * 0.3
    ref = old + torch.randn(B, T) * 0.2
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, group_size=3)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0
    mask[3, 2:] = 0
    ratio, a = torch.exp(logps - old), adv.unsqueeze(1)
    clipped = (((ratio > 1.28) & (a > 0)) | ((ratio < 0.8) & (a < 0))) & mask.bool()
    assert clipped.any() and (~clipped & mask.bool()).any()  # the clip is exercised
    ref_arg = ref if beta else None
    ours_in = logps.clone().requires_grad_(True)
    trl_in = logps.clone().requires_grad_(True)
    ours = grpo_loss(
        ours_in, old, adv, mask, epsilon_high=0.28, beta=beta, ref_logps=ref_arg,
        loss_type=loss_type, max_completion_length=max_len,
    )
    trl = _trl_loss(trl_in, old, adv, mask, loss_type, beta=beta, ref=ref_arg, max_len=max_len)
    torch.testing.assert_close(ours, trl, rtol=1e-6, atol=1e-7)
    (g_ours,) = torch.autograd.grad(ours, ours_in)
    (g_trl,) = torch.autograd.grad(trl, trl_in)
    torch.testing.assert_close(g_ours, g_trl, rtol=1e-6, atol=1e-8)


def test_kl_term_on_hand_numbers():
    logps = torch.tensor([[-1.0, -2.0]])
    same = logps.clone()
    ref = torch.tensor([[-1.5, -1.0]])
    zero_adv = torch.tensor([0.0])
    mask = torch.ones(1, 2, dtype=torch.long)
    q = ref - logps
    k3 = torch.exp(q) - q - 1
    got = grpo_loss(logps, same, zero_adv, mask, beta=0.1, ref_logps=ref, loss_type="bnpo")
    assert got.item() == pytest.approx(0.1 * k3.mean().item(), rel=1e-6)
    assert (k3 > 0).all()
    # off-policy, TRL's default weighs k3 by the ratio; kl_ratio=False is the paper's plain k3
    old = logps - 0.1
    ratio = torch.exp(logps - old)
    got = grpo_loss(logps, old, zero_adv, mask, beta=0.1, ref_logps=ref, loss_type="bnpo")
    assert got.item() == pytest.approx(0.1 * (ratio * k3).mean().item(), rel=1e-6)
    plain = grpo_loss(
        logps, old, zero_adv, mask, beta=0.1, ref_logps=ref, loss_type="bnpo", kl_ratio=False
    )
    assert plain.item() == pytest.approx(0.1 * k3.mean().item(), rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        ({"rewards": [1.0, 0.0], "group_size": 1}, ValueError, "group_size must be >= 2"),
        ({"rewards": [1.0, 0.0, 1.0], "group_size": 2}, ValueError, "multiple of"),
        ({"rewards": [1.0, float("nan")], "group_size": 2}, ValueError, "finite"),
        ({"rewards": [1.0, "2"], "group_size": 2}, TypeError, "real numbers"),
        ({"rewards": [1.0, None], "group_size": 2}, TypeError, "real numbers"),
        ({"rewards": torch.tensor([True, False]), "group_size": 2}, TypeError, "real numbers"),
        ({"rewards": [], "group_size": 2}, ValueError, "multiple of"),
    ],
)
def test_advantages_bad_input(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        group_advantages(**kwargs)


def test_loss_bad_input():
    logps, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="old_logps must have shape"):
        grpo_loss(logps, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages must have shape"):
        grpo_loss(logps, old, adv[:1], mask)
    with pytest.raises(ValueError, match="completion_mask must have shape"):
        grpo_loss(logps, old, adv, mask[:, :2])
    with pytest.raises(ValueError, match="loss_type must be one of"):
        grpo_loss(logps, old, adv, mask, loss_type="dapo")
    empty = mask.clone()
    empty[1] = 0
    with pytest.raises(ValueError, match=r"no token for sequence\(s\) \[1\]"):
        grpo_loss(logps, old, adv, empty)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logps, old, adv, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(logps, old, adv, mask, beta=0.1)
    with pytest.raises(TypeError, match="completion_mask must be a bool or integer"):
        grpo_loss(logps, old, adv, mask.float())
    with pytest.raises(TypeError, match="logps must be a floating-point"):
        grpo_loss(logps.long(), old, adv, mask)
    with pytest.raises(ValueError, match="advantages must be finite"):
        grpo_loss(logps, old, torch.tensor([1.0, float("nan")]), mask)


# --- the real GRPOTrainer on fixed rollouts: bf16=False equals ours, bf16=True moves the loss --


def _real_grpo_losses(tmp_path, model, inputs, bf16: bool, loss_type: str):
    """GRPOTrainer(trl 1.16, CPU)._compute_loss on fixed rollouts, the model prepared by its
    accelerator as training would (bf16=True wraps forward in bfloat16 autocast): the loss with
    the given old log-probs, and on-policy (no old log-probs: TRL uses its own, detached)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / f"bf16_{bf16}"), per_device_train_batch_size=4,
        num_generations=2, max_completion_length=5, bf16=bf16, use_cpu=True, report_to=[],
        save_strategy="no", max_steps=1, beta=0.0, epsilon_high=0.28, loss_type=loss_type,
    )  # fmt: skip  (beta > 0 would load a reference model by name; the loss reads the
    # reference's log-probs from the inputs, so beta is set on the trainer below)
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["w1 w2 w3", "w4 w5 w6"]}),
        processing_class=_word_tokenizer(),
    )  # fmt: skip
    trainer.beta = 0.04
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop
    prepared = trainer.accelerator.prepare_model(trainer.model)
    assert trainer.args.bf16 is bf16
    on_policy = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}
    return trainer._compute_loss(prepared, inputs), trainer._compute_loss(prepared, on_policy)


def test_real_trainer_bf16_false_equals_ours_and_bf16_true_moves_the_loss(tmp_path):
    """Fixed rollouts (equal-length prompts, so no left padding), off-policy old log-probs and a
    reference: TRL's per-token log-probs and loss with bf16=False equal tfbook's
    (`completion_logps` on a tfbook GPT holding the same weights, then `grpo_loss`); TRL's CPU
    default bf16=True runs the forward in bfloat16 autocast: on this model it moves the loss by
    about 3e-3 with old log-probs from another policy, by about 3e-5 on-policy (TRL's default
    num_iterations=1, every ratio 1: only the beta KL term moves; with beta=0 nothing would)."""
    from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
    from tfbook.posttrain.rollouts import completion_logps

    loss_type = "grpo"  # the other normalisations: test_equals_trl_compute_loss
    hf = _tiny_llama(0)
    ours_model = tfbook_from_hf_llama(hf).eval()
    B, P, N = 4, 3, 5
    prompt_ids = torch.tensor([[3, 4, 5], [3, 4, 5], [6, 7, 8], [6, 7, 8]])
    g = torch.Generator().manual_seed(3)
    completion_ids = torch.randint(3, 63, (B, N), generator=g)
    completion_mask = torch.ones(B, N, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[2, 2:] = 0
    completion_ids[completion_mask == 0] = 0  # TRL pads completions with pad_token_id
    with torch.no_grad():
        logps = completion_logps(ours_model, torch.cat([prompt_ids, completion_ids], 1),
                                 torch.full((B,), P), completion_ids)  # (B, N) float32
    old = logps + 0.3 * torch.randn(B, N, generator=g)
    ref = logps + 0.2 * torch.randn(B, N, generator=g)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
    }  # fmt: skip
    ours = grpo_loss(logps, old, adv, completion_mask, epsilon_high=0.28, beta=0.04,
                     ref_logps=ref, loss_type=loss_type, max_completion_length=N)
    ours_on = grpo_loss(logps, logps, adv, completion_mask, epsilon_high=0.28, beta=0.04,
                        ref_logps=ref, loss_type=loss_type, max_completion_length=N)
    fp32, fp32_on = _real_grpo_losses(tmp_path, hf, inputs, bf16=False, loss_type=loss_type)
    torch.testing.assert_close(fp32.detach(), ours, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fp32_on.detach(), ours_on, rtol=1e-5, atol=1e-6)
    bf16, bf16_on = _real_grpo_losses(tmp_path, _tiny_llama(0), inputs, bf16=True,
                                      loss_type=loss_type)
    moved = abs(float(bf16.detach()) - float(ours))
    moved_on = abs(float(bf16_on.detach()) - float(ours_on))
    print(f"{loss_type}: bf16=True moves the loss by {moved:.1e} off-policy (old log-probs "
          f"given), by {moved_on:.1e} on-policy (ratio 1: only the KL term moves)")
    # bfloat16 keeps 8 bits of mantissa: the log-probs move by about 1e-2 here, the loss far
    # more than float32's rounding (1e-7); on-policy every ratio is exactly 1 in both, so only
    # beta * KL moves (beta = 0.04): a much smaller shift
    assert 1e-4 < moved < 2e-2
    assert 1e-7 < moved_on < moved / 5
