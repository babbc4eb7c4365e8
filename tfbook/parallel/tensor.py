"""Tensor parallelism of the book's block (Shoeybi et al. 2019, "Megatron-LM", section 3).

Every rank holds one p-th of each big matrix of a block and the whole residual stream. The MLP
is split column-then-row, attention by heads, so that each sub-layer needs one all-reduce in
the forward pass and one in the backward pass:

    MLP        x (B, T, C) --f--> act(x W_1[:, cols_r]) (B, T, F/p) -> h_r W_2[rows_r, :] --g--> y
    attention  x (B, T, C) --f--> heads_r = attend(x W_Q[:, heads_r], x W_K[..], x W_V[..])
                                  (B, T, H/p D) -> heads_r W_O[rows_r, :] --g--> y

    f = copy_to_parallel:     forward identity,   backward all-reduce (sum) of dL/dx
    g = reduce_from_parallel: forward all-reduce, backward identity

The activation acts on each column by itself, so W_1 split by columns needs no communication
before it; W_2 split by the same rows then gives each rank a partial sum of y, added by g.
Attention heads never mix until W_O, so W_Q, W_K, W_V split by heads and W_O by the matching
rows is the same pattern. The row-split layer's bias is added once, after the all-reduce.
Per block: 2 all-reduces forward (one g per sub-layer), 2 backward (one f per sub-layer).
The norms, biases of the row-split layers and the residual stream are replicated: every rank
computes them on the same numbers and gets the same (full) gradient for them.

`tensor_parallel_block(block, rank, world_size)` cuts rank r's shard out of a full block
(tfbook.blocks.SelfAttentionBlock, as a BlockConfig builds it); `CollectiveCount` counts the
all-reduces f and g launch. Shape legend: B batch, T positions, C width, H heads, D head size,
F hidden width of the MLP, p world size (ranks of the tensor-parallel group).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfbook.attention import MultiHeadAttention
from tfbook.blocks import BlockConfig, SelfAttentionBlock
from tfbook.config import is_int
from tfbook.feedforward import FeedForward, SwiGLU
from tfbook.models.gpt import GPTConfig
from tfbook.parallel.ddp import require_process_group


@dataclass
class CollectiveCount:
    """The all-reduces f and g launched while this is active (`with CollectiveCount() as c`)."""

    forward: int = 0  # all-reduces in forward passes (g)
    backward: int = 0  # all-reduces in backward passes (f)
    shapes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # (pass, shape)

    def __enter__(self) -> CollectiveCount:
        _COUNTERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _COUNTERS.remove(self)


_COUNTERS: list[CollectiveCount] = []


def _all_reduce(t: Tensor, group: dist.ProcessGroup | None, direction: str) -> Tensor:
    """Sum t over the group's ranks (a new tensor; autograd's inputs are never changed)."""
    require_process_group("a tensor-parallel shard")
    t = t.contiguous().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    for counter in _COUNTERS:
        setattr(counter, direction, getattr(counter, direction) + 1)
        counter.shapes.append((direction, tuple(t.shape)))
    return t


class _CopyToParallel(torch.autograd.Function):
    """f: identity forward; the ranks' gradients summed backward (each saw part of the use)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:  # noqa: ANN001
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: ANN001
        return _all_reduce(grad, ctx.group, "backward"), None


class _ReduceFromParallel(torch.autograd.Function):
    """g: the ranks' partial sums added forward; the gradient passed through backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:  # noqa: ANN001
        return _all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: ANN001
        return grad, None


def copy_to_parallel(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """f of Megatron-LM: x unchanged; in backward, dL/dx all-reduced over the group."""
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """g of Megatron-LM: x all-reduced (summed) over the group; backward the identity."""
    return _ReduceFromParallel.apply(x, group)


class RowParallelLinear(nn.Module):
    """y = g(x_r W_r^T) + b: this rank's input columns x_r times its slice W_r of the weight
    (in the math's y = x W, rows of W; in torch's (out, in) storage, columns: W_r is
    (out, in / p)); the partial products summed over the ranks, the (replicated) bias added
    once afterwards."""

    def __init__(self, weight: Tensor, bias: Tensor | None,
                 group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out, in / p)
        self.bias = None if bias is None else nn.Parameter(bias)  # (out,), the full bias
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in / p) -> (..., out), the same on every rank."""
        y = reduce_from_parallel(x @ self.weight.T, self.group)
        return y if self.bias is None else y + self.bias


class ParallelInput(nn.Module):
    """A sub-layer whose input enters through f (`copy_to_parallel`) once, however many
    column-split matrices then read it (W_Q, W_K, W_V; or W_gate, W_1)."""

    def __init__(self, inner: nn.Module, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.inner = inner
        self.group = group

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        return self.inner(copy_to_parallel(x, self.group), *args, **kwargs)


def check_tensor_parallel(config: BlockConfig | GPTConfig, world_size: int) -> None:
    """Refuse a block that p ranks cannot split evenly (before any process starts): H, H_kv and
    F must be multiples of p; dropout must be 0; the MLA, mixture-of-experts and QK-norm blocks
    are not split here. A GPTConfig is checked through its blocks' BlockConfig."""
    if isinstance(config, GPTConfig):
        config = config.block_config()
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config must be a BlockConfig or a GPTConfig, got "
                        f"{type(config).__name__}")
    _check_world_size(world_size)
    n_kv = config.n_heads if config.n_kv_heads is None else config.n_kv_heads
    _check_split(n_heads=config.n_heads, n_kv_heads=n_kv, d_ff=config.d_ff,
                 world_size=world_size)
    _check_kind(kv_lora_rank=config.kv_lora_rank, ffn=config.ffn, qk_norm=config.qk_norm,
                dropout=config.dropout)


def _check_world_size(world_size: object) -> None:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")


def _check_split(n_heads: int, n_kv_heads: int, d_ff: int, world_size: int) -> None:
    for name, value, unit in (("n_heads", n_heads, "attention heads"),
                              ("n_kv_heads", n_kv_heads, "key/value heads"),
                              ("d_ff", d_ff, "hidden units of the MLP")):
        if value % world_size:
            raise ValueError(f"tensor parallelism gives each of the {world_size} ranks the same "
                             f"share of the {value} {unit}: {name}={value} must be a multiple "
                             f"of world_size={world_size}")


def _check_kind(kv_lora_rank: int | None, ffn: str, qk_norm: bool, dropout: float) -> None:
    if kv_lora_rank is not None:
        raise ValueError("tensor parallelism here splits multi-head attention by heads; "
                         f"multi-head latent attention (kv_lora_rank={kv_lora_rank}) is not split")
    if ffn not in ("mlp", "swiglu"):
        raise ValueError(f"tensor parallelism here splits an MLP or SwiGLU, got ffn={ffn!r}")
    if qk_norm:
        raise ValueError("tensor parallelism here does not split QK-norm blocks (its norm "
                         "weights are shared by every head, so their gradients would need "
                         "their own all-reduce); got qk_norm=True")
    if dropout:
        raise ValueError("tensor parallelism here needs dropout 0: each rank would draw its "
                         "own mask on the replicated residual stream, and the replicas would "
                         f"drift apart; got dropout={dropout}")


def tensor_parallel_block(block: SelfAttentionBlock, rank: int | None = None,
                          world_size: int | None = None,
                          group: dist.ProcessGroup | None = None) -> SelfAttentionBlock:
    """Rank r's shard of a full block: a copy whose attention keeps heads
    [r H/p, (r + 1) H/p) (and key/value heads [r H_kv/p, ...)), whose MLP keeps hidden units
    [r F/p, (r + 1) F/p), with f before and g after each sub-layer. Its forward is the block's
    forward (same arguments, same output on every rank); `block` itself is not changed.

    rank and world_size default to the process group's (`group`, or the default group).
    """
    if not isinstance(block, SelfAttentionBlock):
        raise TypeError("block must be a tfbook.blocks.SelfAttentionBlock (BlockConfig builds "
                        f"one), got {type(block).__name__}")
    if rank is None or world_size is None:  # the group's (or give both explicitly)
        require_process_group("tensor_parallel_block without rank and world_size")
        rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
    _check_world_size(world_size)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    attn, ff = block.attn, block.ff
    if not isinstance(attn, MultiHeadAttention):
        raise ValueError("tensor parallelism here splits multi-head attention by heads; this "
                         f"block's attention is a {type(attn).__name__}")
    if not isinstance(ff, FeedForward | SwiGLU):
        _check_kind(kv_lora_rank=None, ffn=type(ff).__name__, qk_norm=False, dropout=0.0)
    _check_split(attn.n_heads, attn.n_kv_heads, ff.fc_in.out_features, world_size)
    _check_kind(None, "mlp", attn.q_norm is not None,
                max(attn.dropout, ff.dropout.p, block.dropout.p))
    if attn.packed_qkv is not None or getattr(ff, "packed_gate_in", None) is not None:
        raise ValueError("unpack the block's matrices (tfbook.packing) before splitting it")

    shard = copy.deepcopy(block)
    D = attn.head_size
    h, h_kv = attn.n_heads // world_size, attn.n_kv_heads // world_size
    q_rows = slice(rank * h * D, (rank + 1) * h * D)  # this rank's heads' output features
    kv_rows = slice(rank * h_kv * D, (rank + 1) * h_kv * D)
    a = shard.attn
    for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
        setattr(a, name, _column_shard(getattr(attn, name), rows))
    a.out_proj = _row_shard(attn.out_proj, q_rows, group)
    a.n_heads, a.n_kv_heads = h, h_kv  # the module now runs h heads of size D
    shard.attn = ParallelInput(a, group)

    f = ff.fc_in.out_features // world_size
    cols = slice(rank * f, (rank + 1) * f)
    m = shard.ff
    m.fc_in = _column_shard(ff.fc_in, cols)
    if isinstance(ff, SwiGLU):
        m.fc_gate = _column_shard(ff.fc_gate, cols)
    m.fc_out = _row_shard(ff.fc_out, cols, group)
    shard.ff = ParallelInput(m, group)
    return shard


def tensor_parallel_model(model: nn.Module, rank: int | None = None,
                          world_size: int | None = None,
                          group: dist.ProcessGroup | None = None) -> nn.Module:
    """A copy of a model whose every block (`model.blocks`, as in tfbook's GPT) is replaced by
    rank r's shard (`tensor_parallel_block`); the embeddings, final norm and head stay whole
    (replicated: each rank computes them, and gets their full gradient). Per forward pass
    2 L all-reduces for L blocks, 2 L in the backward pass."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(model, nn.Module) or not isinstance(blocks, nn.ModuleList):
        raise TypeError("model must be an nn.Module with its blocks in an nn.ModuleList "
                        f"`blocks` (tfbook's GPT), got {type(model).__name__}")
    if getattr(model, "config", None) is not None and getattr(model.config, "dropout", 0):
        raise ValueError("tensor parallelism here needs dropout 0: each rank would draw its "
                         "own mask on the replicated residual stream; got dropout="
                         f"{model.config.dropout}")
    shards = [tensor_parallel_block(b, rank, world_size, group) for b in blocks]
    out = copy.deepcopy(model)
    out.blocks = nn.ModuleList(shards)
    return out


def _column_shard(linear: nn.Linear, rows: slice) -> nn.Linear:
    """The output features `rows` of y = x W^T + b (rows of torch's (out, in) weight)."""
    out = nn.Linear(linear.in_features, rows.stop - rows.start, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rows])
    return out


def _row_shard(linear: nn.Linear, cols: slice, group: dist.ProcessGroup | None
               ) -> RowParallelLinear:
    """The input features `cols` of y = x W^T + b (columns of torch's (out, in) weight)."""
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(linear.weight.detach()[:, cols].clone(), bias, group)


def shard_index(block: SelfAttentionBlock, rank: int, world_size: int
                ) -> dict[str, tuple[str, tuple[slice, ...]]]:
    """For every parameter of a full block: its name in rank r's shard (the sub-layers sit
    behind `.inner` there) and the (rows, columns) of the full tensor the shard holds; a
    replicated parameter (norms, the row-split layers' biases) is held whole."""
    attn, ff = block.attn, block.ff
    D = attn.head_size
    h, h_kv = attn.n_heads // world_size, attn.n_kv_heads // world_size
    f = ff.fc_in.out_features // world_size
    every = slice(None)
    q = slice(rank * h * D, (rank + 1) * h * D)
    kv = slice(rank * h_kv * D, (rank + 1) * h_kv * D)
    cols = slice(rank * f, (rank + 1) * f)
    split = {"attn.q_proj": (q, every), "attn.k_proj": (kv, every), "attn.v_proj": (kv, every),
             "ff.fc_in": (cols, every), "ff.fc_gate": (cols, every),
             "attn.out_proj.weight": (every, q), "ff.fc_out.weight": (every, cols)}
    index = {}
    for name, param in block.named_parameters():
        layer = name.rsplit(".", 1)[0]
        where = split.get(name, split.get(layer, (every, every)))[: param.dim()]
        shard = name
        for sub in ("attn.", "ff."):
            if name.startswith(sub):
                shard = sub + "inner." + name[len(sub):]
        index[name] = (shard, where)
    return index
