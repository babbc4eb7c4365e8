"""The generation loop: one token at a time, each step reading the keys and values it cached.

    prefill:  logits = model(prompt)              every prompt position at once; cache filled
    step:     logits = penalties(logits, ids)     repetition, frequency, presence (optional)
              token  = rule(logits[:, -1])        greedy, or sampled (temperature, top-k,
                                                  top-p, min-p)
              logits = model(token, cache)        one new position; attends to all cached ones
    stop:     at an end token or a stop string (that row is done and is padded from then on)
              or after `max_new_tokens`

A batch of prompts of different lengths is padded on the LEFT, so every row's next token lands
in the same column; `attention_mask` hides the padding from every query and each row's
positions count its real tokens only, so a padded row computes what it would alone.
One loop serves GPT, the Llama-style decoder and the encoder-decoder (`memory=`): the model
only has to take `positions`, `attention_mask` and a `cache` (see `next_logits`).
Shape legend: B batch, T prompt length (padded), N new tokens, S source length, V vocab.
"""

import os
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfbook.cache import KVCache
from tfbook.config import is_int
from tfbook.generate.sampling import apply_penalties, check_sampling, next_token


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


def as_prompt_ids(prompt: object, row: int) -> list[int]:
    """One prompt as a list of int ids; a string or a float is refused, never rounded."""
    if isinstance(prompt, Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise TypeError(f"prompt {row} must hold integer token ids, got a tensor of dtype "
                            f"{prompt.dtype}")
        prompt = prompt.tolist()
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
        raise TypeError(f"each prompt must be a list of int token ids, got {type(prompt).__name__}"
                        f" for prompt {row}" + (": encode text with the tokenizer first"
                                                if isinstance(prompt, (str, bytes)) else ""))
    for token in prompt:
        if not is_int(token):
            raise TypeError(f"token ids must be ints, got {token!r} of type "
                            f"{type(token).__name__} in prompt {row}")
    return [int(token) for token in prompt]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Lists of ids of different lengths -> ids (B, T) padded on the left, mask (B, T).

    left_pad([[5, 6, 7], [8]]) -> ids [[5, 6, 7], [0, 0, 8]], mask [[1, 1, 1], [0, 0, 1]]
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a (B, T) tensor of token ids or a list of lists of "
                        f"int ids, got {type(prompts).__name__}"
                        + (": encode text with the tokenizer first"
                           if isinstance(prompts, (str, bytes)) else ""))
    if not is_int(pad_id):
        raise TypeError(f"pad_id must be an int, got {pad_id!r} of type {type(pad_id).__name__}")
    prompts = [as_prompt_ids(p, row) for row, p in enumerate(prompts)]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt must hold at least one token, got an empty prompt")
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, T - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, T - len(prompt) :] = True
    return ids, mask


def prompt_batch(
    prompts: Tensor | Sequence[Sequence[int]], attention_mask: Tensor | None, pad_id: int,
    vocab_size: int,
) -> tuple[Tensor, Tensor]:
    """Prompts as ids (B, T) with a left-padding mask (B, T), or lists of ids (padded here).

    Refuses what would give wrong tokens silently: float ids, a mask that is not left padding
    (a real token after padding), a mask given with lists (they get their own), rows of
    padding only, ids outside [0, V).
    """
    if not isinstance(prompts, Tensor):
        if attention_mask is not None:
            raise ValueError("attention_mask goes with prompts given as a (B, T) tensor; lists "
                             "of ids are left-padded here and get their own mask, got both")
        ids, mask = left_pad(prompts, pad_id)
    else:
        if prompts.is_floating_point() or prompts.is_complex() or prompts.dtype == torch.bool:
            raise TypeError(f"prompts must hold integer token ids, got a tensor of dtype "
                            f"{prompts.dtype} (ids are never rounded)")
        if prompts.dim() != 2 or prompts.size(1) == 0:
            raise ValueError(
                f"prompts must be ids of shape (B, T) with T >= 1, got {tuple(prompts.shape)}"
            )
        ids = prompts.long()
        if attention_mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        else:
            if not isinstance(attention_mask, Tensor):
                raise TypeError(f"attention_mask must be a tensor (B, T) of 0/1 or bool, got "
                                f"{type(attention_mask).__name__}")
            if attention_mask.shape != ids.shape:
                raise ValueError(
                    f"attention_mask must have the shape of the prompts {tuple(ids.shape)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            if attention_mask.dtype != torch.bool and not bool(
                    ((attention_mask == 0) | (attention_mask == 1)).all()):
                raise ValueError("attention_mask must hold only 0/1 or True/False, got values "
                                 f"{sorted(set(attention_mask.flatten().tolist()))[:5]}")
            mask = attention_mask.bool()
        if not bool(mask.any(dim=1).all()):
            row = int((~mask.any(dim=1)).nonzero()[0])
            raise ValueError(f"every prompt must hold at least one token, got a row of "
                             f"padding only (row {row})")
        after_real = mask.long().cummax(dim=1).values.bool()  # (B, T): True from the 1st token
        if bool((after_real & ~mask).any()):
            row = int((after_real & ~mask).any(dim=1).nonzero()[0])
            raise ValueError(
                f"attention_mask must be left padding (padding first, then the prompt's "
                f"tokens), got row {row} = {mask[row].long().tolist()}: pad on the left "
                f"(left_pad does) so that every row's next token lands in the same column")
    outside = (ids < 0) | (ids >= vocab_size)  # padding is embedded too, so it must fit
    if bool(outside.any()):
        raise ValueError(f"token ids (padding included) must lie in [0, V={vocab_size}), got "
                         f"{int(ids[outside][0])}")
    return ids, mask


def check_model(model: object, memory: Tensor | None, use_cache: bool, caller: str) -> None:
    """Refuse, with the missing piece named, an object the decoding loops cannot drive."""
    config = getattr(model, "config", None)
    missing = []
    if not isinstance(model, nn.Module):
        missing.append("an nn.Module")
    if getattr(config, "max_len", None) is None:
        missing.append("config.max_len (its context length)")
    if not (getattr(config, "vocab_size", None) or getattr(config, "tgt_vocab_size", None)):
        missing.append("config.vocab_size")
    if use_cache and not callable(getattr(model, "new_cache", None)):
        missing.append("new_cache() (or pass use_cache=False)")
    if memory is not None and not callable(getattr(model, "decode", None)):
        missing.append("decode() (memory= makes it the decoder of an encoder-decoder)")
    if missing:
        raise TypeError(f"{caller} needs a tfbook model (GPT, a Llama-style preset, or "
                        f"Transformer with memory=) with {', '.join(missing)}; got "
                        f"{type(model).__name__}")
    if memory is None and callable(getattr(model, "decode", None)):
        raise ValueError(f"{caller} got the encoder-decoder {type(model).__name__} without "
                         f"memory: pass memory=model.encode(src)[0] (the decoder reads it)")


def _check_stop_strings(
    stop_strings: str | Sequence[str], tokenizer: object
) -> tuple[list[str], Callable[[list[int]], str] | None]:
    """Stop strings as a list, and the decode function of `tokenizer` they need."""
    strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    if any(not isinstance(s, str) or not s for s in strings):
        raise TypeError(f"stop_strings must be non-empty strings, got {stop_strings!r}")
    if not strings:
        return [], None
    decode = getattr(tokenizer, "decode", None)
    if not callable(decode):
        raise TypeError(f"stop_strings need the tokenizer that turns ids into text (an object "
                        f"with decode(list of ids) -> str), got {type(tokenizer).__name__}")
    return strings, decode


def completes_stop_string(
    ids: Sequence[int], stop_strings: Sequence[str], decode: Callable[[list[int]], str]
) -> bool:
    """True when the last id completes one of `stop_strings` in the decoded text.

    The string must overlap the last token's text (it may start in an earlier token and the
    token may run past its end), so an occurrence further back never counts twice: the rule
    of HF's `StopStringCriteria`. Only the last len(longest string) + 8 ids are decoded.
    """
    tail = list(ids[-(max(map(len, stop_strings)) + 8):])
    before, after = decode(tail[:-1]), decode(tail)
    new_from = len(os.path.commonprefix([before, after]))  # where the last token's text starts
    return any(s in after[max(0, new_from - len(s) + 1):] for s in stop_strings)


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


def as_end_ids(end_ids: object) -> list[int]:
    """End token ids as a list: one int, or a sequence (or 1-D tensor) of them. `check_request`
    then checks each against the vocabulary; a string or None is refused here."""
    if is_int(end_ids):
        return [int(end_ids)]
    if isinstance(end_ids, Tensor) and end_ids.dim() <= 1 and not (
            end_ids.is_floating_point() or end_ids.is_complex() or end_ids.dtype == torch.bool):
        return end_ids.reshape(-1).tolist()
    if isinstance(end_ids, (str, bytes)) or not isinstance(end_ids, Sequence | Set):
        raise TypeError(f"end_ids must be an int token id or a sequence of them, got "
                        f"{type(end_ids).__name__} {end_ids!r:.40}")
    return list(end_ids)


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
            f"a prompt of {T} token{'' if T == 1 else 's'} plus max_new_tokens={max_new_tokens} "
            f"needs {T + max_new_tokens} positions, more than the model's context length {max_len}"
        )
    for end in end_ids:
        if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end < vocab_size:
            raise ValueError(f"end token ids must be ints in [0, {vocab_size}), got {end!r}")


def _sampled(sampler: Callable[[Tensor], Tensor], logits: Tensor) -> Tensor:
    """The (B,) token ids a caller's sampler returns for (B, V) logits, checked."""
    token = sampler(logits)
    B, V = logits.shape
    if (not isinstance(token, Tensor) or token.shape != (B,) or token.dtype != torch.long
            or bool(((token < 0) | (token >= V)).any())):
        got = (f"{tuple(token.shape)} {token.dtype} {token.tolist()[:8]}"
               if isinstance(token, Tensor) else type(token).__name__)
        raise ValueError(f"the sampler must return a ({B},) long tensor of ids in [0, {V}), "
                         f"got {got}")
    return token.to(logits.device)


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
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    stop_strings: str | Sequence[str] = (),
    tokenizer: object = None,
    slide_context: bool = False,
    sampler: Callable[[Tensor], Tensor] | None = None,
) -> Generation:
    """Continue each prompt by up to `max_new_tokens` tokens.

    prompts: ids (B, T) (with `attention_mask` (B, T) if left-padded) or lists of ids of any
    lengths (padded here). The penalties (`repetition_penalty` on the prompt and the new
    tokens, `frequency_penalty` and `presence_penalty` on the new tokens) change the logits
    first, for greedy decoding too; then temperature 0 is greedy (the argmax), and above 0
    the next token is sampled after temperature, top-k, top-p and min-p
    (`tfbook.generate.sampling`), from `generator` or, when it is None, torch's global
    generator (as Hugging Face's `generate` does).
    A row stops at any of `end_ids` (the end token is kept; `pad_id` follows) or when its
    text completes one of `stop_strings` (decoded with `tokenizer`); the loop stops when
    every row has. use_cache=False recomputes the whole sequence at each step (the same
    tokens, slower: the KV-cache chapter measures it). slide_context=True lets a text grow
    past the model's context: each step reads only the last max_len tokens (recomputed, no
    cache, positions counted from the window's start). `memory` (B, S, C) makes it the
    decoder of an encoder-decoder (then `prompts` is the decoder's start).
    `sampler`, a function from the step's (B, V) logits (after the penalties) to the (B,) next
    tokens, replaces temperature, top-k, top-p and min-p (leave those at their defaults): the
    page's sampler (`tfbook.widgets.sampling`) rides on this loop that way.
    """
    for name, flag in (("slide_context", slide_context), ("use_cache", use_cache),
                       ("keep_logits", keep_logits)):
        if flag is not True and flag is not False:
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if slide_context and memory is not None:
        raise ValueError("slide_context is for decoder-only models; an encoder-decoder's "
                         "decoder (memory=) cannot slide its context")
    use_cache = use_cache and not slide_context
    check_model(model, memory, use_cache, "generate")
    V = model_vocab_size(model)
    ids, mask = prompt_batch(prompts, attention_mask, pad_id, V)
    ids, mask = ids.to(next(model.parameters()).device), mask.to(ids.device)
    end_ids = as_end_ids(end_ids)
    max_len = model.config.max_len
    check_request(min(ids.size(1), max_len - 1) if slide_context else ids.size(1),
                  1 if slide_context else max_new_tokens, max_len, end_ids, V)
    if slide_context and (isinstance(max_new_tokens, bool) or not is_int(max_new_tokens)
                           or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty,
                   presence_penalty)
    if sampler is not None:
        if not callable(sampler):
            raise TypeError(f"sampler must be a function (B, V) logits -> (B,) token ids, got "
                            f"{type(sampler).__name__}")
        if (temperature, top_k, top_p, min_p) != (0.0, None, None, None):
            raise ValueError("give either a sampler or temperature/top_k/top_p/min_p, not both: "
                             f"got a sampler and temperature={temperature!r}, top_k={top_k!r}, "
                             f"top_p={top_p!r}, min_p={min_p!r}")
    stop_strings, decode = _check_stop_strings(stop_strings, tokenizer)
    penalised = (repetition_penalty, frequency_penalty, presence_penalty) != (1.0, 0.0, 0.0)
    B, T = ids.size()
    # room for exactly the positions this call can fill, not the whole context
    cache = model.new_cache(T + max_new_tokens) if use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    kept: list[Tensor] = []
    step_ids, step_positions = ids, positions_from_mask(mask)  # the prefill: all of the prompt
    step_mask = mask
    for _ in range(max_new_tokens):
        if slide_context:  # the last max_len tokens, positions from the window's start
            step_ids, step_mask = ids[:, -max_len:], mask[:, -max_len:].clone()
            step_mask[:, -1] |= ~step_mask.any(dim=1)  # a finished row's window of padding
            step_positions = positions_from_mask(step_mask)
        logits = next_logits(model, step_ids, step_positions, step_mask, cache, memory,
                             memory_mask)
        if keep_logits:
            kept.append(logits)  # the raw scores, before any penalty
        if penalised:
            logits = apply_penalties(logits, ids, repetition_penalty, frequency_penalty,
                                     presence_penalty, mask=mask, prompt_length=T)
        if sampler is None:
            token = next_token(logits, temperature, top_k, top_p, generator, min_p=min_p)
        else:
            token = _sampled(sampler, logits)  # (B,)
        token = torch.where(done, torch.full_like(token, pad_id), token)  # finished rows pad
        ids = torch.cat([ids, token[:, None]], dim=1)  # (B, T + n)
        mask = torch.cat([mask, ~done[:, None]], dim=1)  # padding after the end is not real
        if end_ids:
            done = done | torch.isin(token, torch.tensor(end_ids, device=token.device))
        for row in (~done).nonzero().flatten().tolist() if stop_strings else ():
            if completes_stop_string(ids[row][mask[row]].tolist(), stop_strings, decode):
                done[row] = True
        if bool(done.all()):
            break
        positions = positions_from_mask(mask)  # (B, T + n)
        if use_cache:
            step_ids, step_positions = ids[:, -1:], positions[:, -1:]  # only the new token
        else:
            step_ids, step_positions = ids, positions  # everything again, for comparison
        step_mask = mask
    return Generation(tokens=ids, attention_mask=mask, prompt_length=T, logits=kept)
