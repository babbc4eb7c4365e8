"""Direct preference optimisation (DPO, Rafailov et al. 2023): a loss from Bradley-Terry.

From Bradley-Terry to the loss. A person shown two completions y_w (chosen) and y_l (rejected)
for a prompt x prefers y_w with probability

    p(y_w > y_l | x) = exp r(x, y_w) / (exp r(x, y_w) + exp r(x, y_l))
                     = sigmoid(r(x, y_w) - r(x, y_l))

for some reward r. RLHF maximises E[r(x, y)] - beta KL(pi || pi_ref); the maximiser is
pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x), so every reward can be written through
its optimal policy as r(x, y) = beta log(pi(y|x) / pi_ref(y|x)) + beta log Z(x). In the
difference r(x, y_w) - r(x, y_l) the partition function Z(x) cancels, and the negative
log-likelihood of the preferences becomes a loss on the policy alone (eq. 7 of the paper):

    loss = -mean log sigmoid( beta [ (log pi(y_w|x) - log pi_ref(y_w|x))
                                    - (log pi(y_l|x) - log pi_ref(y_l|x)) ] )

The two bracketed log-ratios times beta are the implicit rewards (chosen_rewards,
rejected_rewards); their difference is the margin. This is TRL's default loss_type="sigmoid"
without label smoothing; it equals `trl.DPOTrainer`'s loss and reward metrics (trl 1.16, tested).

Each log pi(y|x) is a sum over the completion's tokens (`sequence_logps`), never a mean.

From text to a training step: `load_preferences` reads the book's preference set (checked),
`preference_example` turns one (prompt, chosen, rejected) into SmolLM2 chat ids with the
assistant's tokens marked (empty texts and chosen == rejected refused), `collate_pairs` pads a
batch, and `DPOLossFn` is the loss_fn of the book's one training loop (tfbook.train.loop.train),
with the reference log-probs precomputed in the batch or computed from the adapter-disabled
model, and every step's rewards, margins and log-probs recorded.
Shape legend: B batch (pairs), T sequence, V vocab.
"""

import json
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.lora import lora_layers
from tfbook.losses import IGNORE_INDEX
from tfbook.posttrain.chat import assistant_mask, chat_ids

PREFERENCES_PATH = Path(__file__).resolve().parent / "data" / "preferences.json"
SPLITS = ("train", "held_out")


class DPOOutput(NamedTuple):
    """The DPO loss and the quantities TRL logs; rewards and margins are detached, shape (B,)."""

    loss: Tensor  # () mean of -log sigmoid(margin) over the pairs
    chosen_rewards: Tensor  # (B,) beta (log pi(y_w) - log pi_ref(y_w))
    rejected_rewards: Tensor  # (B,) beta (log pi(y_l) - log pi_ref(y_l))
    margins: Tensor  # (B,) chosen_rewards - rejected_rewards


def _check_ids_and_mask(
    input_ids: Tensor, completion_mask: Tensor, name: str = "input_ids"
) -> None:
    if (
        not isinstance(input_ids, Tensor)
        or input_ids.dtype.is_floating_point
        or input_ids.dtype in (torch.bool, torch.complex64, torch.complex128)
        or input_ids.dim() != 2
    ):
        given = (
            f"{input_ids.dtype} of shape {tuple(input_ids.shape)}"
            if isinstance(input_ids, Tensor)
            else type(input_ids).__name__
        )
        raise TypeError(f"{name} must be an integer tensor of shape (B, T), got {given}")
    if not isinstance(completion_mask, Tensor):
        raise TypeError(
            f"completion_mask must be a tensor of 0/1 of shape (B, T), got "
            f"{type(completion_mask).__name__}"
        )
    if completion_mask.shape != input_ids.shape:
        raise ValueError(
            f"completion_mask must have the shape of {name} {tuple(input_ids.shape)}, "
            f"got {tuple(completion_mask.shape)}"
        )
    if input_ids.size(0) == 0 or input_ids.size(1) < 2:
        raise ValueError(
            f"{name} must hold at least one sequence of at least 2 tokens, got shape "
            f"{tuple(input_ids.shape)}"
        )
    if completion_mask.dtype.is_floating_point or completion_mask.is_complex():
        raise TypeError(
            f"completion_mask must be a bool or integer tensor of 0/1, got {completion_mask.dtype}"
        )
    if not ((completion_mask == 0) | (completion_mask == 1)).all():
        raise ValueError("completion_mask must hold only 0 and 1")
    if completion_mask[:, 0].any():
        raise ValueError(
            "completion_mask marks the first token, which nothing predicts: a completion "
            "must follow at least one prompt token"
        )
    empty = (completion_mask.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"rows {empty} of completion_mask mark no completion token: a pair needs a "
            f"non-empty completion"
        )


def sequence_logps(model, input_ids: Tensor, completion_mask: Tensor) -> Tensor:
    """Summed log-probability of the completion tokens of each sequence, shape (B,).

    The model must return an object with `.logits` of shape (B, T, V) (a tfbook GPT or an HF
    causal LM). Token t is scored by the logits at position t-1, so completion_mask[:, 0] must be
    0; padding goes on the right with completion_mask 0 there (a causal model never lets a
    later pad token change an earlier position).
    """
    _check_ids_and_mask(input_ids, completion_mask)
    logits = getattr(model(input_ids), "logits", None)
    B, T = input_ids.shape
    if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[:2] != (B, T):
        raise TypeError(
            f"model(input_ids) must return an object whose .logits has shape (B, T, V) = "
            f"({B}, {T}, V), got {getattr(logits, 'shape', type(logits).__name__)}"
        )
    V = logits.size(-1)
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= V:
        raise ValueError(
            f"input_ids must lie in [0, {V}), got values in "
            f"[{int(input_ids.min())}, {int(input_ids.max())}]"
        )
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V), predicts tokens 1..T-1
    token_logps = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    keep = completion_mask[:, 1:].to(token_logps.dtype)  # (B, T-1)
    return (token_logps * keep).sum(dim=1)  # (B,)


def preference_logps(
    model, chosen_ids: Tensor, chosen_mask: Tensor, rejected_ids: Tensor, rejected_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """`sequence_logps` of the chosen and the rejected sequences, after refusing identical pairs.

    A pair whose chosen and rejected sequences are the same tokens with the same completion
    carries no preference (its margin is 0 whatever the model does): it raises ValueError.
    """
    _check_ids_and_mask(chosen_ids, chosen_mask, "chosen_ids")
    _check_ids_and_mask(rejected_ids, rejected_mask, "rejected_ids")
    if chosen_ids.size(0) != rejected_ids.size(0):
        raise ValueError(
            f"chosen_ids and rejected_ids must hold the same number of pairs, got "
            f"{chosen_ids.size(0)} and {rejected_ids.size(0)}"
        )
    same = []
    for i in range(chosen_ids.size(0)):
        c, r = chosen_mask[i].bool(), rejected_mask[i].bool()
        # the same prompt+completion tokens, whatever the right padding after them
        nc, nr = int(c.nonzero().max()) + 1, int(r.nonzero().max()) + 1
        if (
            nc == nr
            and torch.equal(chosen_ids[i, :nc], rejected_ids[i, :nr])
            and torch.equal(c[:nc], r[:nr])
        ):
            same.append(i)
    if same:
        raise ValueError(
            f"pairs {same} have chosen identical to rejected: a preference needs two "
            f"different completions"
        )
    return sequence_logps(model, chosen_ids, chosen_mask), sequence_logps(
        model, rejected_ids, rejected_mask
    )


def _check_logps(name: str, x, shape=None) -> None:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.dim() != 1:
        given = (
            f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        )
        raise TypeError(
            f"{name} must be a 1-D floating tensor of per-sequence log-probs (B,), got {given}"
        )
    if x.numel() == 0:
        raise ValueError(f"{name} is empty: DPO needs at least one preference pair")
    if shape is not None and x.shape != shape:
        raise ValueError(
            f"{name} must have the shape of policy_chosen {tuple(shape)}, got {tuple(x.shape)}"
        )
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} must be finite log-probabilities, got {x.detach().tolist()}")


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
) -> DPOOutput:
    """DPO's sigmoid loss (Rafailov et al. 2023, eq. 7) from four (B,) summed log-probs.

    margin = beta [(pi_c - ref_c) - (pi_r - ref_r)], loss = mean(-log sigmoid(margin)).
    The reference log-probs carry no gradient in practice (compute them under torch.no_grad);
    chosen_rewards, rejected_rewards and margins are returned detached, as TRL logs them.
    """
    _check_logps("policy_chosen", policy_chosen)
    shape = policy_chosen.shape
    for name, x in (
        ("policy_rejected", policy_rejected),
        ("ref_chosen", ref_chosen),
        ("ref_rejected", ref_rejected),
    ):
        _check_logps(name, x, shape)
    if (
        isinstance(beta, bool)
        or not isinstance(beta, (int, float))
        or not math.isfinite(beta)
        or beta <= 0
    ):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    chosen_logratios = policy_chosen - ref_chosen  # (B,)
    rejected_logratios = policy_rejected - ref_rejected  # (B,)
    logits = beta * (chosen_logratios - rejected_logratios)  # (B,)
    loss = -F.logsigmoid(logits).mean()
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    return DPOOutput(loss, chosen_rewards, rejected_rewards, chosen_rewards - rejected_rewards)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, every LoRALinear of `model` computes its frozen base layer alone.

    With LoRA the reference model need not be a second copy: the policy with its adapters
    switched off is the base model it started from (what TRL does with a peft model and no
    ref_model). The adapters are switched back on on exit, even after an error. A model
    without LoRA layers raises ValueError: its "reference" would be the policy itself and
    every reward 0.
    """
    layers = lora_layers(model) if isinstance(model, nn.Module) else {}
    if not layers:
        raise ValueError(
            f"adapters_disabled needs a model with LoRA layers (tfbook.lora.add_lora), "
            f"got {type(model).__name__} without any"
        )
    saved = {name: layer.enabled for name, layer in layers.items()}
    try:
        for layer in layers.values():
            # the base layer alone, not frozen + 0 * (B A x): a NaN or inf in an adapter
            # cannot leak into the reference (0 * NaN is NaN)
            layer.enabled = False
        yield model
    finally:
        for name, layer in layers.items():
            layer.enabled = saved[name]


def check_pair(prompt: object, chosen: object, rejected: object, where: str = "the pair") -> None:
    """A preference pair is three non-empty strings with chosen != rejected (else ValueError)."""
    for name, text in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not isinstance(text, str):
            raise TypeError(f"{where}: {name} must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{where}: {name} is empty; a preference pair needs a prompt and "
                             f"two non-empty answers")
    if chosen.strip() == rejected.strip():
        raise ValueError(f"{where}: chosen and rejected are the same text {chosen!r:.60}; a "
                         f"preference needs two different answers (its margin would be 0 "
                         f"whatever the model learns)")


def contains_answer(reply: str, answer: str) -> bool:
    """True when `answer` occurs in `reply` as a whole word or phrase, ignoring case.

    contains_answer("7 + 5 = 12.", "12") -> True; contains_answer("It is 112.", "12") -> False.
    """
    if not isinstance(reply, str) or not isinstance(answer, str):
        raise TypeError(f"reply and answer must be str, got {type(reply).__name__} and "
                        f"{type(answer).__name__}")
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", reply, re.IGNORECASE) is not None


def load_preferences(split: str | None = None, path: str | Path = PREFERENCES_PATH
                     ) -> list[dict[str, str]]:
    """The book's preference set (tfbook/posttrain/data/preferences.json), checked.

    Each pair is a dict with prompt, chosen, rejected, answer (the word(s) a correct reply
    contains, see `contains_answer`; the chosen answer must contain it), kind ("wrong": the
    rejected answer states a wrong fact; "rambling": the same fact in filler) and split
    ("train" or "held_out"). `split` keeps one split; None keeps both. Prompts are unique, so
    no held-out prompt is ever trained on.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    pairs = json.loads(Path(path).read_text(encoding="utf-8")).get("pairs")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"{path} must hold a non-empty list 'pairs', got {type(pairs).__name__}")
    seen: set[str] = set()
    for k, pair in enumerate(pairs):
        where = f"pair {k} of {Path(path).name}"
        if not isinstance(pair, dict):
            raise TypeError(f"{where} must be a dict, got {type(pair).__name__}")
        check_pair(pair.get("prompt"), pair.get("chosen"), pair.get("rejected"), where)
        if pair.get("split") not in SPLITS:
            raise ValueError(f"{where}: split must be one of {SPLITS}, got {pair.get('split')!r}")
        answer = pair.get("answer")
        if not isinstance(answer, str) or not answer.strip() or not contains_answer(
                pair["chosen"], answer):
            raise ValueError(f"{where}: answer must be a non-empty str that the chosen answer "
                             f"contains as a whole word, got {answer!r:.40}")
        if pair["prompt"] in seen:
            raise ValueError(f"{where}: the prompt {pair['prompt']!r:.60} appears twice")
        seen.add(pair["prompt"])
    return [p for p in pairs if split is None or p["split"] == split]


class PreferenceExample(NamedTuple):
    """One pair as ids: the chat up to the end of each answer, 1 in the mask on the answer."""

    chosen_ids: list[int]
    chosen_mask: list[int]
    rejected_ids: list[int]
    rejected_mask: list[int]


def preference_example(tokenizer, prompt: str, chosen: str, rejected: str) -> PreferenceExample:
    """(prompt, chosen, rejected) -> SmolLM2 chat ids of [user: prompt, assistant: answer].

    The mask is `chat.assistant_mask`: 1 on the answer and its closing <|im_end|>, so the
    summed log-prob is log pi(answer, end | prompt). The template's newline after <|im_end|>
    (mask 0) is dropped: nothing is scored after the answer ends.
    """
    check_pair(prompt, chosen, rejected)
    out = []
    for answer in (chosen, rejected):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        ids, mask = chat_ids(tokenizer, messages), assistant_mask(tokenizer, messages)
        end = max(t for t, m in enumerate(mask) if m) + 1
        out += [ids[:end], mask[:end]]
    return PreferenceExample(*out)


def collate_pairs(examples: Sequence[PreferenceExample], pad_id: int) -> dict[str, Tensor]:
    """Right-padded (B, T) tensors chosen_ids, chosen_mask, rejected_ids, rejected_mask.

    Also `labels` (2B, T): the answer ids, IGNORE_INDEX elsewhere (chosen rows, then rejected),
    so the training loop counts the answer tokens a step reads.
    """
    if not isinstance(examples, Sequence) or not examples or not all(
            isinstance(e, PreferenceExample) for e in examples):
        raise ValueError(f"collate_pairs needs a non-empty list of PreferenceExample, got "
                         f"{examples!r:.80}")
    batch: dict[str, Tensor] = {}
    for side in ("chosen", "rejected"):
        rows = [getattr(e, f"{side}_ids") for e in examples]
        masks = [getattr(e, f"{side}_mask") for e in examples]
        T = max(map(len, rows))
        batch[f"{side}_ids"] = torch.tensor([r + [pad_id] * (T - len(r)) for r in rows])
        batch[f"{side}_mask"] = torch.tensor([m + [0] * (T - len(m)) for m in masks])
    labels = [batch[f"{side}_ids"].masked_fill(batch[f"{side}_mask"] == 0, IGNORE_INDEX)
              for side in ("chosen", "rejected")]
    T = max(x.size(1) for x in labels)
    batch["labels"] = torch.cat([F.pad(x, (0, T - x.size(1)), value=IGNORE_INDEX)
                                 for x in labels])  # (2B, T)
    return batch


def preference_batches(examples: Sequence[PreferenceExample], batch_pairs: int, pad_id: int,
                       ref_chosen: Sequence[float] | None = None,
                       ref_rejected: Sequence[float] | None = None):
    """next_batch(generator) for the training loop: `batch_pairs` pairs drawn without
    replacement (the first of torch.randperm(len(examples), generator=generator)), collated.

    With ref_chosen / ref_rejected (one float per example, precomputed once) the batch carries
    the drawn pairs' reference log-probs as batch["ref_chosen"] / batch["ref_rejected"].
    """
    if not isinstance(batch_pairs, int) or isinstance(batch_pairs, bool) or not (
            1 <= batch_pairs <= len(examples)):
        raise ValueError(f"batch_pairs must be an int in [1, {len(examples)}] (the number of "
                         f"examples), got {batch_pairs!r}")
    if (ref_chosen is None) != (ref_rejected is None) or (
            ref_chosen is not None and not len(ref_chosen) == len(ref_rejected) == len(examples)):
        raise ValueError("ref_chosen and ref_rejected must both be given, one value per "
                         "example, or both be None")

    def next_batch(generator: torch.Generator) -> dict[str, Tensor]:
        pick = torch.randperm(len(examples), generator=generator)[:batch_pairs].tolist()
        batch = collate_pairs([examples[i] for i in pick], pad_id)
        if ref_chosen is not None:
            batch["ref_chosen"] = torch.tensor([float(ref_chosen[i]) for i in pick])
            batch["ref_rejected"] = torch.tensor([float(ref_rejected[i]) for i in pick])
        return batch

    return next_batch


@torch.no_grad()
def reference_logps(model: nn.Module, batch: dict[str, Tensor], reference: nn.Module | None = None
                    ) -> tuple[Tensor, Tensor]:
    """log pi_ref of the chosen and rejected answers (B,), B each, without gradient.

    reference=None: the policy with its LoRA adapters switched off (`adapters_disabled`).
    """
    was_training = model.training
    model.eval()
    try:
        if reference is None:
            with adapters_disabled(model):
                return preference_logps(model, batch["chosen_ids"], batch["chosen_mask"],
                                        batch["rejected_ids"], batch["rejected_mask"])
        return preference_logps(reference, batch["chosen_ids"], batch["chosen_mask"],
                                batch["rejected_ids"], batch["rejected_mask"])
    finally:
        model.train(was_training)


STEP_METRICS = ("loss", "chosen_rewards", "rejected_rewards", "margins", "accuracy",
                "chosen_logps", "rejected_logps")


class DPOLossFn:
    """DPO as the loss_fn of `tfbook.train.loop.train`: loss_fn(model, batch, label_smoothing).

    The reference log-probs come from batch["ref_chosen"] / batch["ref_rejected"] when the
    batch carries them (precomputed once), else from `reference_logps` (the adapter-disabled
    policy when reference is None). Each call appends the batch means of STEP_METRICS to
    `self.log` (accuracy: the fraction of pairs whose margin is > 0).
    """

    def __init__(self, beta: float = 0.1, reference: nn.Module | None = None) -> None:
        dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), beta)  # checks
        self.beta = beta
        self.reference = reference
        self.log: dict[str, list[float]] = {name: [] for name in STEP_METRICS}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor],
                 label_smoothing: float = 0.0) -> Tensor:
        if label_smoothing:
            raise ValueError(f"DPO's sigmoid loss has no label smoothing here; got "
                             f"label_smoothing={label_smoothing!r} (use 0.0)")
        if "ref_chosen" in batch:
            ref_c, ref_r = batch["ref_chosen"], batch["ref_rejected"]
        else:
            ref_c, ref_r = reference_logps(model, batch, self.reference)
        pol_c, pol_r = preference_logps(model, batch["chosen_ids"], batch["chosen_mask"],
                                        batch["rejected_ids"], batch["rejected_mask"])
        out = dpo_loss(pol_c, pol_r, ref_c, ref_r, self.beta)
        for name, value in (
            ("loss", out.loss.detach()), ("chosen_rewards", out.chosen_rewards),
            ("rejected_rewards", out.rejected_rewards), ("margins", out.margins),
            ("accuracy", (out.margins > 0).float()), ("chosen_logps", pol_c.detach()),
            ("rejected_logps", pol_r.detach()),
        ):  # fmt: skip
            self.log[name].append(value.mean().item())
        return out.loss
