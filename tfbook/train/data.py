"""Training data as tensors: windows of a token stream, and padded sequence-to-sequence batches.

A language model learns from every position at once (teacher forcing): a window of T + 1
tokens gives T inputs and, shifted by one, the T tokens that follow them.

    stream [5, 8, 2, 9, 4], T = 4  ->  x = [5, 8, 2, 9],  y = [8, 2, 9, 4]

Shape legend: B batch, T window length, S source length, N stream length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from tfbook.config import is_int
from tfbook.losses import IGNORE_INDEX


def check_stream(ids: Tensor, name: str = "ids") -> None:
    """ids must be a 1-D integer tensor (N,) of token ids."""
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or (
        ids.dtype == torch.bool
    ):
        given = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(
            ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be a 1-D integer tensor (N,) of token ids, got {given}")


def check_sizes(**sizes: object) -> None:
    """Each named size must be an int >= 1: a window or batch of zero tokens holds nothing."""
    for name, value in sizes.items():
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def split_stream(ids: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """Split a token stream (N,) into train and validation parts: the last `val_fraction` of
    the tokens is held out, so no validation window overlaps a training one."""
    check_stream(ids)
    if not isinstance(val_fraction, int | float) or isinstance(val_fraction, bool) or not (
        0.0 < val_fraction < 1.0
    ):
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction!r}")
    cut = int(round(len(ids) * (1.0 - val_fraction)))
    if not 0 < cut < len(ids):
        raise ValueError(f"a validation fraction of {val_fraction} of {len(ids)} tokens leaves "
                         f"{cut} for training and {len(ids) - cut} for validation: both parts "
                         "need at least one token")
    return ids[:cut], ids[cut:]


def random_windows(
    ids: Tensor, batch_size: int, T: int, generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """B random windows of a stream (N,): inputs x (B, T) and targets y (B, T), y = x shifted
    left by one token. The `generator` decides the starts (seeded: reproducible batches)."""
    check_stream(ids)
    check_sizes(batch_size=batch_size, T=T)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    if len(ids) < T + 1:
        raise ValueError(f"a window of T + 1 = {T + 1} tokens needs a stream at least that "
                         f"long, got {len(ids)} tokens")
    starts = torch.randint(0, len(ids) - T, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(T + 1)  # (T + 1,)
    windows = ids[starts[:, None] + offsets]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def sequential_windows(ids: Tensor, batch_size: int, T: int) -> list[tuple[Tensor, Tensor]]:
    """Every token of a stream once, as consecutive (x, y) windows in batches of up to B:
    the fixed set that evaluation averages over (the tail shorter than T + 1 is dropped)."""
    check_stream(ids)
    check_sizes(batch_size=batch_size, T=T)
    n = (len(ids) - 1) // T  # number of whole windows
    if n < 1:
        raise ValueError(f"a window of T + 1 = {T + 1} tokens needs a stream at least that "
                         f"long, got {len(ids)} tokens")
    x = ids[: n * T].view(n, T)  # (n, T)
    y = ids[1 : n * T + 1].view(n, T)  # (n, T)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def window_sampler(
    ids: Tensor, batch_size: int, T: int,
) -> Callable[[torch.Generator], tuple[Tensor, Tensor]]:
    """next_batch for `train`: B random windows x (B, T) and their targets y (B, T)."""
    check_stream(ids)
    check_sizes(batch_size=batch_size, T=T)
    if len(ids) < T + 1:  # fail here, not at the first step of a run
        raise ValueError(f"a stream of {len(ids)} tokens is too short for windows of "
                         f"T + 1 = {T + 1}")

    def next_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return random_windows(ids, batch_size, T, generator)

    return next_batch


def eval_windows(ids: Tensor, batch_size: int, T: int,
                 max_windows: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """Consecutive (x, y) windows covering the stream once: the fixed set a validation loss
    averages over. With `max_windows`, that many of them, evenly spread over the stream (a
    quicker estimate that still samples all of the text)."""
    batches = sequential_windows(ids, batch_size, T)
    if max_windows is None:
        return batches
    if not is_int(max_windows) or max_windows < 1:
        raise ValueError(f"max_windows must be a positive int or None, got {max_windows!r}")
    x = torch.cat([b[0] for b in batches])  # (n, T), every window
    y = torch.cat([b[1] for b in batches])  # (n, T)
    n = len(x)
    keep = torch.linspace(0, n - 1, min(max_windows, n)).round().long()  # (max_windows,)
    x, y = x[keep], y[keep]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def _id_lists(seqs: object, name: str) -> list[list[int]]:
    """A non-empty list of sequences of int ids (lists, tuples or 1-D integer tensors)."""
    if isinstance(seqs, str | bytes | Tensor) or not isinstance(seqs, Sequence):
        raise TypeError(f"{name} must be a list of sequences of int token ids, got "
                        f"{type(seqs).__name__}")
    if not seqs:
        raise ValueError(f"{name}: need at least one sequence to pad, got none")
    rows = []
    for k, seq in enumerate(seqs):
        if isinstance(seq, Tensor) and seq.dim() == 1 and not (
                seq.is_floating_point() or seq.is_complex() or seq.dtype == torch.bool):
            seq = seq.tolist()
        if isinstance(seq, str | bytes) or not isinstance(seq, Sequence) or not all(
                is_int(t) for t in seq):
            raise TypeError(f"{name}[{k}] must be a list of int token ids, got "
                            f"{type(seq).__name__} {seq!r:.40}")
        rows.append([int(t) for t in seq])
    return rows


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists to one length: ids (B, L) and a mask (B, L), True at real tokens."""
    rows = _id_lists(seqs, "seqs")
    if not is_int(pad_id):
        raise TypeError(f"pad_id must be an int token id, got {pad_id!r} of type "
                        f"{type(pad_id).__name__}")
    L = max(len(row) for row in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)  # (B, L)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    return ids, mask


def seq2seq_batch(
    sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int, bos_id: int,
) -> dict[str, Tensor]:
    """A padded encoder-decoder batch: src (B, S) with src_mask, the decoder input
    [BOS] + target[:-1] (B, T) with tgt_mask, and the targets (B, T) with IGNORE_INDEX where
    padded, so that padding never counts in the loss."""
    sources, targets = _id_lists(sources, "sources"), _id_lists(targets, "targets")
    if len(sources) != len(targets):
        raise ValueError(f"sources and targets must pair up, got {len(sources)} and "
                         f"{len(targets)}")
    if any(len(t) == 0 for t in targets):
        raise ValueError("every target needs at least one token, got an empty one")
    if not is_int(bos_id):
        raise TypeError(f"bos_id must be an int token id, got {bos_id!r} of type "
                        f"{type(bos_id).__name__}")
    src, src_mask = pad_sequences(sources, pad_id)
    tgt, tgt_mask = pad_sequences(targets, pad_id)  # (B, T)
    inp = torch.cat([torch.full_like(tgt[:, :1], bos_id), tgt[:, :-1]], dim=1)  # shifted right
    labels = tgt.masked_fill(~tgt_mask, IGNORE_INDEX)  # (B, T)
    return {"src": src, "src_mask": src_mask, "tgt_in": inp, "tgt_mask": tgt_mask,
            "labels": labels}
