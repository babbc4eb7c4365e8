"""One training loop for every model in the book: sample a batch, loss, backward, clip, step.

    for step t = 0 .. steps - 1:
        batch   = next_batch(generator)                # e.g. random (B, T) windows
        loss    = loss_fn(model, batch)                # cross-entropy (+ label smoothing)
        grads   = d loss / d weights                   # loss.backward()
        grads  *= min(1, clip / ||grads||)             # optim.clip_grad_norm
        lr      = base lr * schedule(t)                # schedules.warmup_cosine
        weights = AdamW(weights, grads, lr)            # optim.adamw
        every eval_every steps: mean loss on held-out batches, in eval mode

A seeded generator draws the batches and torch's global generator drives dropout; both are
saved in each checkpoint, so a run resumed from step k continues exactly as if it had never
stopped. A tqdm bar shows the loss and the tokens per second.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from tfbook.config import check_choice, check_positive, is_int, is_number
from tfbook.losses import IGNORE_INDEX, cross_entropy
from tfbook.moe import MoEFeedForward, load_balancing_loss
from tfbook.train.checkpoint import load_checkpoint, save_checkpoint
from tfbook.train.optim import adamw, clip_grad_norm, global_grad_norm
from tfbook.train.schedules import inverse_sqrt, warmup_cosine, warmup_linear

SCHEDULES = ("cosine", "linear", "inverse_sqrt", "constant")
Batch = Any  # whatever next_batch returns and loss_fn reads; (x, y) for a language model


@dataclass(frozen=True)
class TrainConfig:
    """How to train: the optimiser, the schedule, and how often to evaluate and save."""

    steps: int = 1000  # optimiser steps in the whole run
    lr: float = 3e-3  # peak learning rate
    schedule: str = "cosine"  # warmup then "cosine" or "linear" decay; "inverse_sqrt"; "constant"
    warmup: int = 0  # steps of linear warmup
    min_lr_ratio: float = 0.1  # the cosine / linear decay ends at min_lr_ratio * lr
    weight_decay: float = 0.1  # AdamW's decoupled decay, on matrices only
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW's moment decay rates
    clip: float | None = 1.0  # max global gradient norm; None = no clipping
    label_smoothing: float = 0.0  # eps of the smoothed targets, in [0, 1)
    eval_every: int = 0  # evaluate every N steps (and at the end); 0 = only at the end
    checkpoint_every: int = 0  # save every N steps into checkpoint_dir; 0 = only at the end
    seed: int = 0  # seeds the batch generator and torch's global generator (dropout)

    def __post_init__(self) -> None:
        check_positive(self, "steps")
        check_choice(self, "schedule", SCHEDULES)
        for name in ("warmup", "eval_every", "checkpoint_every", "seed"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"TrainConfig: {name} must be an int >= 0, got {value!r}")
        if self.warmup > self.steps:
            raise ValueError(f"TrainConfig: warmup ({self.warmup}) cannot exceed steps "
                             f"({self.steps})")
        if self.schedule == "inverse_sqrt" and self.warmup < 1:
            raise ValueError("TrainConfig: the inverse_sqrt schedule needs warmup >= 1, got 0")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"TrainConfig: {name} must be a finite number >= 0, "
                                 f"got {value!r}")
        if not is_number(self.min_lr_ratio) or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"TrainConfig: min_lr_ratio must lie in [0, 1], "
                             f"got {self.min_lr_ratio!r}")
        if not is_number(self.label_smoothing) or not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"TrainConfig: label_smoothing must lie in [0, 1), "
                             f"got {self.label_smoothing!r}")
        if self.clip is not None and (not is_number(self.clip) or not self.clip > 0):
            raise ValueError(f"TrainConfig: clip must be a number > 0 or None, got {self.clip!r}")
        if self.seed >= 2**64:
            raise ValueError(f"TrainConfig: seed must lie in [0, 2**64) (a torch.Generator "
                             f"seed), got {self.seed!r}")
        if not isinstance(self.betas, tuple | list) or len(self.betas) != 2:
            raise TypeError(f"TrainConfig: betas must be a pair (beta1, beta2) of numbers, got "
                            f"{type(self.betas).__name__} {self.betas!r}")
        if not all(is_number(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"TrainConfig: betas must be two numbers in [0, 1), "
                             f"got {self.betas!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step `step` (0-based)."""
        if not is_int(step) or step < 0:
            raise ValueError(f"step must be an int >= 0 (steps count from 0), got {step!r}")
        if self.schedule == "cosine":
            return self.lr * warmup_cosine(step, self.steps, self.warmup, self.min_lr_ratio)
        if self.schedule == "linear":
            return self.lr * warmup_linear(step, self.steps, self.warmup, self.min_lr_ratio)
        if self.schedule == "inverse_sqrt":  # scaled so that its peak (step W - 1) is lr
            return self.lr * inverse_sqrt(step, 1, self.warmup) * math.sqrt(self.warmup)
        return self.lr


@dataclass
class History:
    """What a run measured: per step, and at each evaluation."""

    step: list[int] = field(default_factory=list)  # optimiser step, 0-based
    loss: list[float] = field(default_factory=list)  # training loss of that step's batch
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)  # before clipping
    tokens: list[int] = field(default_factory=list)  # tokens seen so far
    eval_step: list[int] = field(default_factory=list)  # steps after which we evaluated
    eval_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock time spent in the loop (all sessions of a resumed run)


def count_tokens(batch: Batch) -> int:
    """Tokens that count in the loss: targets that are not IGNORE_INDEX."""
    targets = batch["labels"] if isinstance(batch, dict) else batch[1]
    return int((targets != IGNORE_INDEX).sum())


def lm_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    """Next-token cross-entropy of a language model on a batch (x (B, T), y (B, T))."""
    x, y = batch
    logits = model(x).logits  # (B, T, V)
    return cross_entropy(logits, y, label_smoothing=label_smoothing)


class MoELoss:
    """lm_loss plus `coef` times the load-balancing loss of every mixture-of-experts block
    (tfbook.moe), the loss Mixtral trains with (Hugging Face's router_aux_loss_coef; 0.02 in
    Mixtral-8x7B's config). Use it as `train(..., loss_fn=MoELoss(0.02))`. Every token of x
    counts in the balance (a language-model batch has no padding)."""

    def __init__(self, coef: float = 0.02) -> None:
        if not is_number(coef) or not coef >= 0:
            raise ValueError(f"MoELoss: coef must be a number >= 0, got {coef!r}")
        self.coef = float(coef)

    def __call__(self, model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
        x, y = batch
        logits = model(x).logits  # (B, T, V); each MoE block keeps its router logits (N, E)
        moes = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
        if not moes:
            raise ValueError("MoELoss needs a model with mixture-of-experts blocks (ffn='moe'), "
                             f"got a {type(model).__name__} without one")
        balance = load_balancing_loss([m.router_logits for m in moes], moes[0].n_experts,
                                      moes[0].top_k)
        return cross_entropy(logits, y, label_smoothing=label_smoothing) + self.coef * balance


def seq2seq_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0
                 ) -> Tensor:
    """Cross-entropy of an encoder-decoder on a `data.seq2seq_batch` dict: the decoder reads
    the target shifted right (teacher forcing) and predicts every target token at once."""
    logits = model(batch["src"], batch["tgt_in"], src_mask=batch.get("src_mask"),
                   tgt_mask=batch.get("tgt_mask")).logits  # (B, T, V)
    return cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Sequence[Batch],
             loss_fn: Callable[..., Tensor] = lm_loss) -> float:
    """Mean loss per counted token over fixed batches, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    for batch in batches:
        tokens = count_tokens(batch)
        total += float(loss_fn(model, batch)) * tokens
        n += tokens
    model.train(was_training)
    if n == 0:
        raise ValueError("evaluate needs at least one batch with a counted target, got none")
    return total / n


def _rng_states(generator: torch.Generator) -> dict[str, Tensor]:
    return {"data": generator.get_state(), "torch": torch.get_rng_state()}


def train(
    model: nn.Module,
    next_batch: Callable[[torch.Generator], Batch],
    config: TrainConfig,
    *,
    eval_batches: Sequence[Batch] | None = None,
    loss_fn: Callable[..., Tensor] = lm_loss,
    optimizer: torch.optim.Optimizer | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    stop_at: int | None = None,
    on_eval: Callable[[int, nn.Module, History], None] | None = None,
    progress: bool = True,
) -> History:
    """Train `model` in place for config.steps optimiser steps; return the History.

    next_batch(generator) -> batch draws one batch; loss_fn(model, batch, label_smoothing)
    -> scalar loss. With `checkpoint_dir`, saves there every config.checkpoint_every steps and
    at the end; `resume=True` continues from the checkpoint found there (if any). `stop_at`
    ends the session after that many steps (a run to be resumed later). on_eval(step, model,
    history) runs after each evaluation (e.g. to print a sample).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if stop_at is not None and (not is_int(stop_at) or not 0 < stop_at <= config.steps):
        raise ValueError(f"stop_at must be an int in [1, {config.steps}], got {stop_at!r}")
    if (resume or config.checkpoint_every) and checkpoint_dir is None:
        raise ValueError("resume and checkpoint_every need a checkpoint_dir")
    optimizer = optimizer or adamw(model, config.lr, config.betas, config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    history, start = History(), 0
    if resume and (Path(checkpoint_dir) / "state.json").exists():
        loop, rng = load_checkpoint(checkpoint_dir, model, optimizer)
        if loop.get("config") != _as_json(config):
            raise ValueError(f"the checkpoint in {checkpoint_dir} was written by another "
                             f"TrainConfig: {loop.get('config')}")
        start, history = _resume_state(loop, config, checkpoint_dir)
        if stop_at is not None and stop_at <= start:
            raise ValueError(f"stop_at ({stop_at}) must come after the checkpoint's step "
                             f"({start}): the session would train nothing")
        _restore_rng(rng, generator, checkpoint_dir)

    def save(step: int) -> None:
        state = {"step": step, "config": _as_json(config), "history": asdict(history)}
        save_checkpoint(checkpoint_dir, model, optimizer, state, _rng_states(generator))

    def run_eval(step: int) -> None:
        if eval_batches:
            history.eval_step.append(step)
            history.eval_loss.append(evaluate(model, eval_batches, loss_fn))
        if on_eval is not None:
            on_eval(step, model, history)

    end = config.steps if stop_at is None else stop_at
    model.train()
    seen = history.tokens[-1] if history.tokens else 0
    began = time.perf_counter()
    bar = tqdm(total=config.steps, initial=start, disable=not progress, file=sys.stderr,
               mininterval=1.0, dynamic_ncols=False, ncols=78, desc="train")
    for step in range(start, end):
        if step == 0 and eval_batches:
            run_eval(-1)  # the loss at initialisation, before any update (step -1)
        lr = config.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = next_batch(generator)
        if count_tokens(batch) == 0:
            raise ValueError(f"the batch of step {step} has no counted target (every target "
                             f"is IGNORE_INDEX = {IGNORE_INDEX}): there is no loss to minimise")
        loss = loss_fn(model, batch, config.label_smoothing)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the loss became {loss.item()} at step {step}: lower "
                                     f"the learning rate (now {lr:.3g}) or clip gradients")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = clip_grad_norm(params, config.clip) if config.clip else global_grad_norm(params)
        optimizer.step()
        seen += count_tokens(batch)
        history.step.append(step)
        history.loss.append(loss.item())
        history.lr.append(lr)
        history.grad_norm.append(float(norm))
        history.tokens.append(seen)
        elapsed = history.seconds + time.perf_counter() - began
        bar.update(1)
        bar.set_postfix({"loss": f"{history.loss[-1]:.3f}",
                         "tokens/s": f"{seen / max(elapsed, 1e-9):,.0f}"}, refresh=False)
        last = step + 1 == config.steps
        if (config.eval_every and (step + 1) % config.eval_every == 0) or last:
            run_eval(step)
        every = config.checkpoint_every
        if checkpoint_dir is not None and (step + 1 == end or (every and (step + 1) % every == 0)):
            history.seconds += time.perf_counter() - began
            began = time.perf_counter()
            save(step + 1)
    bar.close()
    history.seconds += time.perf_counter() - began
    return history


PER_STEP = ("step", "loss", "lr", "grad_norm", "tokens")  # History lists with one entry a step


def _resume_state(loop: dict[str, Any], config: TrainConfig, where: str | Path
                  ) -> tuple[int, History]:
    """The checkpoint's step and History, checked: a step inside the run, every History field
    and no other, one entry per step done, numbers in the lists."""
    expected = {"step", "config", "history"}
    if set(loop) != expected:
        raise ValueError(f"the loop state in {where} must have the keys {sorted(expected)}, "
                         f"got {sorted(loop)}")
    step = loop["step"]
    if not is_int(step) or not 1 <= step <= config.steps:
        raise ValueError(f"the checkpoint in {where} is at step {step!r}, outside the run "
                         f"[1, {config.steps}]")
    saved = loop["history"]
    names = {f.name for f in dataclasses.fields(History)}
    if not isinstance(saved, dict) or set(saved) != names:
        got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"the history in {where} must have the fields {sorted(names)}, "
                         f"got {got}")
    for name in names - {"seconds"}:
        values = saved[name]
        if not isinstance(values, list) or not all(is_number(v) for v in values):
            raise ValueError(f"the history in {where}: {name} must be a list of numbers, "
                             f"got {values!r:.60}")
    lengths = {name: len(saved[name]) for name in PER_STEP}
    if set(lengths.values()) != {step} or len(saved["eval_step"]) != len(saved["eval_loss"]):
        raise ValueError(f"the history in {where} does not fit step {step}: per-step lengths "
                         f"{lengths}, {len(saved['eval_step'])} eval steps and "
                         f"{len(saved['eval_loss'])} eval losses")
    if not is_number(saved["seconds"]):
        raise ValueError(f"the history in {where}: seconds must be a number, "
                         f"got {saved['seconds']!r}")
    return step, History(**saved)


def _restore_rng(rng: dict[str, Tensor], generator: torch.Generator, where: str | Path) -> None:
    """Set the batch generator and torch's global generator from a checkpoint's states."""
    if set(rng) != {"data", "torch"}:
        raise ValueError(f"the checkpoint in {where} must hold the random states 'data' and "
                         f"'torch', got {sorted(rng)}")
    try:
        generator.set_state(rng["data"])
        torch.set_rng_state(rng["torch"])
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"the random states in {where} do not fit a CPU generator: "
                         f"{error}") from None


def _as_json(config: TrainConfig) -> dict[str, Any]:
    fields = asdict(config)
    fields["betas"] = list(fields["betas"])
    return fields
