"""The generation loop: one token at a time, each step reading the keys and values it cached.

    prefill:  logits = model(prompt)              every prompt position at once; cache filled
    step:     token  = rule(logits[:, -1])        greedy, or sampled (temperature, top-k, top-p)
              logits = model(token, cache)        one new position; attends to all cached ones
    stop:     at an end token (that row is done and is padded from then on) or after
              `max_new_tokens`

A batch of prompts of different lengths is padded on the LEFT, so every row's next token lands
in the same column; `attention_mask` hides the padding from every query and each row's
positions count its real tokens only, so a padded row computes what it would alone.
One loop serves GPT, the Llama-style decoder and the encoder-decoder (`memory=`): the model
only has to take `positions`, `attention_mask` and a `cache` (see `next_logits`).
Shape legend: B batch, T prompt length (padded), N new tokens, S source length, V vocab.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfbook.cache import KVCache
from tfbook.generate.sampling import next_token


@dataclass
class Generation:
    """What `generate` returns."""

    tokens: Tensor  # (B, T + N): the (left-padded) prompts followed by the new tokens
    attention_mask: Tensor  # (B, T + N): True at real tokens, False at padding
    prompt_length: int  # T, the column where the new tokens start
    logits: list[Tensor] = field(default_factory=list)  # N x (B, V) raw next-token scores

    @property
    def new_tokens(self) -> Tensor:
        """(B, N): only what was generated (rows that stopped early end in padding)."""
        return self.tokens[:, self.prompt_length :]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Lists of ids of different lengths -> ids (B, T) padded on the left, mask (B, T).

    left_pad([[5, 6, 7], [8]]) -> ids [[5, 6, 7], [0, 0, 8]], mask [[1, 1, 1], [0, 0, 1]]
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt must hold at least one token, got an empty prompt")
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, T - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, T - len(prompt) :] = True
    return ids, mask


def positions_from_mask(mask: Tensor) -> Tensor:
    """(B, S) real-token mask -> (B, S) positions counting real tokens only (0 at padding).

    positions_from_mask([[0, 0, 1, 1]]) -> [[0, 0, 0, 1]]
    """
    return (mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def next_logits(
    model: nn.Module, ids: Tensor, positions: Tensor, attention_mask: Tensor,
    cache: KVCache | None, memory: Tensor | None = None, memory_mask: Tensor | None = None,
) -> Tensor:
    """The scores of the token after `ids` (B, T): (B, V). The one place that calls the model."""
    if bool(attention_mask.all()):
        attention_mask = None  # nothing to hide: lets attention use its plain causal kernel
    if memory is None:  # decoder-only: GPT, Llama-style
        out = model(ids, positions=positions, attention_mask=attention_mask, cache=cache,
                    last_only=True)
    else:  # encoder-decoder: the decoder reads the source through cross-attention
        out = model.decode(ids, memory, tgt_mask=attention_mask, src_mask=memory_mask,
                           cache=cache)
    return out.logits[:, -1]  # (B, V)


def model_vocab_size(model: nn.Module) -> int:
    """V of the tokens the model writes (a decoder's vocab_size, a seq2seq's target vocab)."""
    config = model.config
    return getattr(config, "vocab_size", None) or config.tgt_vocab_size


def check_request(
    T: int, max_new_tokens: int, max_len: int, end_ids: Sequence[int], vocab_size: int
) -> None:
    """Refuse, before any work, a request the model cannot serve."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
        max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if T + max_new_tokens > max_len:
        raise ValueError(
            f"a prompt of {T} tokens plus max_new_tokens={max_new_tokens} needs "
            f"{T + max_new_tokens} positions, more than the model's context length {max_len}"
        )
    for end in end_ids:
        if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end < vocab_size:
            raise ValueError(f"end token ids must be ints in [0, {vocab_size}), got {end!r}")


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    end_ids: int | Sequence[int] = (),
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    pad_id: int = 0,
    use_cache: bool = True,
    keep_logits: bool = False,
    memory: Tensor | None = None,
    memory_mask: Tensor | None = None,
) -> Generation:
    """Continue each prompt by up to `max_new_tokens` tokens.

    prompts: ids (B, T) (with `attention_mask` (B, T) if left-padded) or lists of ids of any
    lengths (padded here). temperature 0 is greedy (the argmax); above 0 the next token is
    sampled after temperature, top-k and top-p (`tfbook.generate.sampling`), from `generator`
    or, when it is None, torch's global generator (as Hugging Face's `generate` does).
    A row stops at any of `end_ids` (the end token is kept; `pad_id` follows); the loop stops
    when every row has. use_cache=False recomputes the whole sequence at each step (the same
    tokens, slower: the KV-cache chapter measures it). `memory` (B, S, C) makes it the
    decoder of an encoder-decoder (then `prompts` is the decoder's start).
    """
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2 or prompts.size(1) == 0:
            raise ValueError(
                f"prompts must be ids of shape (B, T) with T >= 1, got {tuple(prompts.shape)}"
            )
        ids = prompts.long()
        mask = (torch.ones_like(ids, dtype=torch.bool) if attention_mask is None
                else attention_mask.bool())
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of the prompts {tuple(ids.shape)}, "
                f"got {tuple(mask.shape)}"
            )
    else:
        ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(next(model.parameters()).device), mask.to(ids.device)
    end_ids = [end_ids] if isinstance(end_ids, int) else list(end_ids)
    check_request(ids.size(1), max_new_tokens, model.config.max_len, end_ids,
                  model_vocab_size(model))
    B, T = ids.size()
    # room for exactly the positions this call can fill, not the whole context
    cache = model.new_cache(T + max_new_tokens) if use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    kept: list[Tensor] = []
    step_ids, step_positions = ids, positions_from_mask(mask)  # the prefill: all of the prompt
    for _ in range(max_new_tokens):
        logits = next_logits(model, step_ids, step_positions, mask, cache, memory, memory_mask)
        if keep_logits:
            kept.append(logits)
        token = next_token(logits, temperature, top_k, top_p, generator)  # (B,)
        token = torch.where(done, torch.full_like(token, pad_id), token)  # finished rows pad
        ids = torch.cat([ids, token[:, None]], dim=1)  # (B, T + n)
        mask = torch.cat([mask, ~done[:, None]], dim=1)  # padding after the end is not real
        if end_ids:
            done = done | torch.isin(token, torch.tensor(end_ids, device=token.device))
        if bool(done.all()):
            break
        positions = positions_from_mask(mask)  # (B, T + n)
        if use_cache:
            step_ids, step_positions = ids[:, -1:], positions[:, -1:]  # only the new token
        else:
            step_ids, step_positions = ids, positions  # everything again, for comparison
    return Generation(tokens=ids, attention_mask=mask, prompt_length=T, logits=kept)
