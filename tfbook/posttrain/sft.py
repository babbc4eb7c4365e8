"""Supervised fine-tuning: the loss on the assistant's tokens only, padding, packing, truncation.

A conversation becomes one sequence of ids (`tfbook.posttrain.chat.chat_ids`); the model reads
all of it but is graded only where the assistant writes (`chat.assistant_mask`): the answers
and each answer's closing <|im_end|>, never the system prompt, the user's turns or the
template's own markers.

The shift. A causal model's position t predicts token t + 1 (`GPT.forward`). So the label
at position t is ids[t + 1] when token t + 1 is the assistant's, and `IGNORE_INDEX` otherwise;
the last position predicts nothing (IGNORE_INDEX):

    labels[t] = ids[t + 1] if mask[t + 1] == 1 else IGNORE_INDEX,  labels[T - 1] = IGNORE_INDEX

(Hugging Face keeps labels unshifted, labels = ids masked, and shifts inside the loss; the
two give the same pairs (position, target), tested against TRL's SFTTrainer.)

- `sft_example`: one conversation -> `SFTExample(ids, labels, truncated, n_targets)`; a
  conversation longer than `max_len` keeps its first `max_len` ids and says so
  (`truncated=True`, and `n_targets` counts what is left to learn; it can be 0).
- `collate`: examples -> a right-padded batch; padded labels are IGNORE_INDEX and padded
  positions are hidden from attention, so padding changes no loss (tested).
- `pack`: examples laid end to end in rows of at most `max_len` ids, whole examples only, no
  padding inside a row. What changes: attention is NOT reset at example boundaries (a token
  may attend to the earlier conversations of its row) and positions run on through the row;
  the labels stay each example's own (an example's last position is IGNORE_INDEX, so no
  position is graded on the next conversation's first token). The loss therefore differs
  from padding's, and not by little: a later conversation reads the earlier ones (the chat
  chapter measures one conversation's loss falling by more than half). Resetting needs a
  block-diagonal mask and positions restarted at 0 per example: TRL's default packing
  restarts `position_ids` per conversation and hands the boundaries to a variable-length
  (FlashAttention) kernel.
- `sft_loss`: the mean of -log p over every assistant token of the batch (a per-token mean
  over the batch, as TRL's SFTTrainer computes on one device). A batch with no assistant
  token has nothing to average: `sft_loss` raises a ValueError (plain cross-entropy would
  give 0 / 0 = NaN; TRL 1.16's own per-token loss path divides by the count clamped to 1,
  which gives 0).
- `batch_sampler`: the `next_batch` of the book's training loop over a list of examples.
- `load_instructions` / `follows_format`: the book's instruction set (every reply one line
  starting "Answer: ") and the check of a generated reply against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import torch
from torch import Tensor, nn

from tfbook.generate.search import generate
from tfbook.losses import IGNORE_INDEX, cross_entropy
from tfbook.posttrain.chat import assistant_mask, chat_ids, check_conversation


@dataclass(frozen=True)
class SFTExample:
    """One conversation ready for training. ids and labels have the same length; labels are
    already shifted (labels[t] is the target of position t)."""

    ids: list[int]
    labels: list[int]
    truncated: bool = False  # True when the conversation had more than max_len ids
    n_targets: int = 0  # positions graded (labels != IGNORE_INDEX)


def shifted_labels(ids: list[int], mask: list[int]) -> list[int]:
    """labels[t] = ids[t + 1] where mask[t + 1] == 1, else IGNORE_INDEX; last = IGNORE_INDEX."""
    return [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)] + [
        IGNORE_INDEX
    ]


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r:.40}")


def sft_example(tokenizer, messages: list[dict[str, str]], max_len: int) -> SFTExample:
    """A conversation as ids and shifted labels (the assistant's tokens only), at most max_len.

    Refuses bad conversations as `chat.check_conversation` does (unknown roles, turns that do
    not alternate, ...) and a max_len below 2 (one position cannot predict anything).
    """
    _check_int("max_len", max_len, 2)
    ids = chat_ids(tokenizer, messages)
    mask = assistant_mask(tokenizer, messages)
    truncated = len(ids) > max_len
    ids, mask = ids[:max_len], mask[:max_len]
    labels = shifted_labels(ids, mask)
    return SFTExample(ids, labels, truncated, sum(y != IGNORE_INDEX for y in labels))


def _check_examples(examples: list[SFTExample]) -> None:
    if not isinstance(examples, list | tuple) or not examples:
        raise ValueError(f"examples must be a non-empty list of SFTExample, got {examples!r:.60}")
    for k, ex in enumerate(examples):
        if not isinstance(ex, SFTExample):
            raise TypeError(f"example {k} must be an SFTExample (sft_example), got "
                            f"{type(ex).__name__}")
        if not ex.ids or len(ex.ids) != len(ex.labels):
            raise ValueError(f"example {k} has {len(ex.ids)} ids and {len(ex.labels)} labels: "
                             f"they must be the same, non-zero length")


def collate(examples: list[SFTExample], pad_id: int) -> dict[str, Tensor]:
    """Right-pad to the longest example: {"ids", "labels", "attention_mask"}, each (B, T).

    Padded ids are pad_id (any valid id: they are hidden from attention and never graded),
    padded labels IGNORE_INDEX, attention_mask 1 on real tokens and 0 on padding.
    """
    _check_examples(examples)
    _check_int("pad_id", pad_id, 0)
    T = max(len(ex.ids) for ex in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    for b, ex in enumerate(examples):
        n = len(ex.ids)
        ids[b, :n] = torch.tensor(ex.ids)
        labels[b, :n] = torch.tensor(ex.labels)
        attention[b, :n] = 1
    return {"ids": ids, "labels": labels, "attention_mask": attention}


def pack(examples: list[SFTExample], max_len: int) -> list[SFTExample]:
    """Lay whole examples end to end, in order, in rows of at most max_len ids.

    A new row starts when the next example would not fit. Attention is not reset between the
    examples of a row, and positions run on (see the module's docstring); each label stays the
    example's own. Feed the rows to `collate` (a row shorter than the batch's longest is padded). An
    example longer than max_len is refused: truncate it with `sft_example(..., max_len)`.
    """
    _check_examples(examples)
    _check_int("max_len", max_len, 2)
    rows: list[SFTExample] = []
    ids: list[int] = []
    labels: list[int] = []
    truncated = False
    for k, ex in enumerate(examples):
        if len(ex.ids) > max_len:
            raise ValueError(f"example {k} has {len(ex.ids)} ids, more than max_len={max_len}: "
                             f"truncate it first (sft_example(..., max_len))")
        if len(ids) + len(ex.ids) > max_len:
            rows.append(SFTExample(ids, labels, truncated,
                                   sum(y != IGNORE_INDEX for y in labels)))
            ids, labels, truncated = [], [], False
        ids = ids + ex.ids
        labels = labels + ex.labels
        truncated = truncated or ex.truncated
    rows.append(SFTExample(ids, labels, truncated, sum(y != IGNORE_INDEX for y in labels)))
    return rows


def sft_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over every assistant token in the batch (labels != IGNORE_INDEX).

    A per-token mean: a batch's long answers weigh more than its short ones, as in TRL's
    SFTTrainer on one device. Raises ValueError when no label is graded (a batch without an
    assistant token, e.g. every answer truncated away), rather than returning NaN.
    `label_smoothing` is passed to `tfbook.losses.cross_entropy` (0 by default, as TRL); the
    argument makes sft_loss a loss_fn of `tfbook.train.loop.train`.
    """
    if not isinstance(batch, dict) or not {"ids", "labels"} <= batch.keys():
        raise TypeError(f"batch must be a dict with 'ids' and 'labels' (collate), got "
                        f"{batch!r:.60}")
    ids, labels = batch["ids"], batch["labels"]
    if not isinstance(ids, Tensor) or not isinstance(labels, Tensor) or ids.shape != labels.shape:
        raise ValueError(f"batch['ids'] and batch['labels'] must be tensors of the same shape, "
                         f"got {getattr(ids, 'shape', ids)!r:.40} and "
                         f"{getattr(labels, 'shape', labels)!r:.40}")
    n = int((labels != IGNORE_INDEX).sum())
    if n == 0:
        raise ValueError("the batch has no assistant token to learn (every label is "
                         "IGNORE_INDEX): its mean loss would be 0 / 0; drop the batch (or "
                         "raise max_len if truncation removed the answers)")
    logits = model(ids, attention_mask=batch.get("attention_mask")).logits  # (B, T, V)
    return cross_entropy(logits, labels, label_smoothing=label_smoothing)


def batch_sampler(examples: list[SFTExample], batch_size: int, pad_id: int
                  ) -> Callable[[torch.Generator], dict[str, Tensor]]:
    """next_batch for `tfbook.train.loop.train`: batch_size examples drawn without replacement
    (from the loop's seeded generator), right-padded by `collate`."""
    _check_examples(examples)
    _check_int("batch_size", batch_size, 1)
    _check_int("pad_id", pad_id, 0)
    if batch_size > len(examples):
        raise ValueError(f"batch_size ({batch_size}) exceeds the {len(examples)} examples")
    examples = list(examples)

    def next_batch(generator: torch.Generator) -> dict[str, Tensor]:
        picked = torch.randperm(len(examples), generator=generator)[:batch_size].tolist()
        return collate([examples[k] for k in picked], pad_id)

    return next_batch


# The book's instruction set (tfbook/posttrain/data/instructions.json): every assistant reply
# is one short line that starts with "Answer: ". SmolLM2-135M-Instruct does not answer so
# (it writes full sentences, some over several lines), so the effect of SFT can be measured.
INSTRUCTIONS = "instructions.json"


def load_instructions() -> dict[str, Any]:
    """The book's instruction set: {"description", "prefix", "train", "test"}, each
    conversation checked (`chat.check_conversation`) and ending on an assistant turn."""
    data = json.loads(files("tfbook.posttrain").joinpath("data", INSTRUCTIONS).read_text())
    for split in ("train", "test"):
        for k, conversation in enumerate(data[split]):
            messages = conversation["messages"]
            check_conversation(messages)
            if messages[-1]["role"] != "assistant":
                raise ValueError(f"{INSTRUCTIONS}: {split} conversation {k} must end on an "
                                 f"assistant turn")
    return data


def follows_format(reply: str, prefix: str = "Answer: ", end: str = "<|im_end|>") -> bool:
    """Does a generated reply (decoded, its end token included) follow the instruction set's
    format: it starts with `prefix`, ends with `end` (it finished) and is one line?

    follows_format("Answer: 12.<|im_end|>") -> True
    follows_format("To add 7 and 5, ...") -> False
    """
    for name, value in (("reply", reply), ("prefix", prefix), ("end", end)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not prefix or not end:
        raise ValueError("prefix and end must be non-empty strings")
    return (reply.startswith(prefix) and reply.endswith(end) and "\n" not in reply
            and len(reply) > len(prefix) + len(end))


@torch.no_grad()
def greedy_replies(model: nn.Module, tokenizer, conversations: list[list[dict[str, str]]],
                   max_new_tokens: int) -> list[str]:
    """The model's greedy reply to each conversation (ending on a user turn), decoded with its
    closing "<|im_end|>" when it finished within max_new_tokens (`tfbook.generate`, batched,
    left-padded), in eval mode."""
    _check_int("max_new_tokens", max_new_tokens, 1)
    if not isinstance(conversations, list | tuple) or not conversations:
        raise ValueError(f"conversations must be a non-empty list of conversations, got "
                         f"{conversations!r:.60}")
    for k, messages in enumerate(conversations):
        check_conversation(messages)
        if messages[-1]["role"] != "user":
            raise ValueError(f"conversation {k} must end on a user turn (the reply is the "
                             f"model's), got a {messages[-1]['role']} turn")
    end = tokenizer.token_to_id("<|im_end|>")
    prompts = [chat_ids(tokenizer, m, add_generation_prompt=True) for m in conversations]
    was_training = model.training
    model.eval()
    out = generate(model, prompts, max_new_tokens, end_ids=end,
                   pad_id=tokenizer.token_to_id("<|endoftext|>"))
    model.train(was_training)
    replies = []
    for row in out.new_tokens.tolist():
        replies.append(tokenizer.decode(row[: row.index(end) + 1] if end in row else row))
    return replies


__all__ = ["SFTExample", "batch_sampler", "collate", "follows_format", "greedy_replies",
           "load_instructions",
           "pack", "sft_example", "sft_loss", "shifted_labels"]
