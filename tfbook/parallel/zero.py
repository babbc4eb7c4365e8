"""A sharded optimizer, ZeRO stage 1 (Rajbhandari et al. 2020, section 5.1): what
`torch.distributed.optim.ZeroRedundancyOptimizer` does, written out.

In plain data parallelism every rank holds the optimizer state of every parameter (AdamW: two
numbers, m and v, per weight) and takes the same step. Here the parameters are dealt out to
the ranks, each rank keeps the state of its share only and steps only that share; then every
parameter is broadcast from the rank that owns it, so all replicas hold the new weights:

    owner(w) = the rank with the fewest numbers so far, parameters taken largest first
    rank r:  inner optimizer over {w : owner(w) = r}      # state: K N / p numbers, not K N
    step():  inner.step();  for every w: broadcast(w, src=owner(w))

The gradients must already be averaged (DDP, or `DDPOverlap`); the update of each weight is
the same elementwise AdamW as unsharded, so the weights agree bit for bit.

Use inside a process group the caller set up (gloo here):

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tfbook.parallel.ddp import require_process_group


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: each rank builds `optimizer_cls(**kwargs)` over its share of the
    parameters (shares balanced by number of elements), steps it, and broadcasts each
    updated parameter from its owner. Parameter groups and `add_param_group` work as in any
    torch optimizer; hyperparameters changed in `param_groups` (a scheduler) reach the inner
    optimizer at the next step."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)
                and not issubclass(optimizer_cls, ShardedOptimizer)):
            raise TypeError("ShardedOptimizer: optimizer_cls must be a torch.optim.Optimizer "
                            "class (e.g. torch.optim.AdamW, not an instance), got "
                            f"{optimizer_cls!r}")
        self.rank, self.world_size = require_process_group("ShardedOptimizer")
        self.optimizer_cls, self.inner_kwargs = optimizer_cls, dict(kwargs)
        self.owner: dict[int, int] = {}  # id(parameter) -> the rank that steps it
        self.shard_numel = [0] * self.world_size  # numbers each rank owns so far
        self.inner: torch.optim.Optimizer | None = None  # built with this rank's first share
        self._inner_groups: list[tuple[int, int]] = []  # (our group index, inner group index)
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (torch's checks and defaults), deal its parameters out to the ranks,
        and give this rank's share to the inner optimizer as a group of its own."""
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        # every rank must deal out the same parameters, or owners would disagree
        shapes = [tuple(p.shape) for p in group["params"]]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, shapes)
        if any(g != shapes for g in gathered):
            differs = [r for r, g in enumerate(gathered) if g != gathered[0]]
            raise ValueError("ShardedOptimizer: every rank must pass parameters of the same "
                             f"shapes in the same order; rank(s) {differs} differ from rank 0 "
                             f"in parameter group {index}")
        # largest first, each to the rank holding the fewest numbers (ties: lowest rank)
        for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
            if id(p) in self.owner:  # torch refuses a parameter in two groups; be safe
                continue
            r = min(range(self.world_size), key=lambda k: (self.shard_numel[k], k))
            self.owner[id(p)] = r
            self.shard_numel[r] += p.numel()
        mine = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        if not mine:  # every parameter of this group went to other ranks
            return
        options = {k: v for k, v in group.items() if k != "params"}
        if self.inner is None:
            self.inner = self.optimizer_cls([{"params": mine, **options}], **self.inner_kwargs)
        else:
            self.inner.add_param_group({"params": mine, **options})
        self._inner_groups.append((index, len(self.inner.param_groups) - 1))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        """Step this rank's share, then broadcast every parameter from its owner."""
        loss = None
        if self.inner is not None:
            for ours, theirs in self._inner_groups:  # e.g. a learning-rate scheduler's change
                for key, value in self.param_groups[ours].items():
                    if key != "params":
                        self.inner.param_groups[theirs][key] = value
            with torch.enable_grad():
                loss = self.inner.step(closure, **kwargs) if closure is not None \
                    else self.inner.step(**kwargs)
        elif closure is not None:
            with torch.enable_grad():
                loss = closure()
        handles = [dist.broadcast(p.data, src=self.owner[id(p)], async_op=True)
                   for group in self.param_groups for p in group["params"]]
        for handle in handles:
            handle.wait()
        return loss

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (the tensors of its inner optimizer)."""
        if self.inner is None:
            return 0
        return sum(t.numel() * t.element_size() for state in self.inner.state.values()
                   for t in state.values() if isinstance(t, Tensor))

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("ShardedOptimizer: each rank holds only its share of the "
                                  "state; gathering a full state_dict is not written yet")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError("ShardedOptimizer: loading a state_dict is not written yet")
