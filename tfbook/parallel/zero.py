"""A sharded optimizer, ZeRO stage 1 (Rajbhandari et al. 2020, section 5.1): what
`torch.distributed.optim.ZeroRedundancyOptimizer` does, written out.

In plain data parallelism every rank holds the optimizer state of every parameter (AdamW: two
numbers, m and v, per weight) and takes the same step. Here the parameters are dealt out to
the ranks, each rank keeps the state of its share only and steps only that share; then every
parameter is broadcast from the rank that owns it, so all replicas hold the new weights:

    owner(w) = the rank with the fewest numbers so far, parameters taken largest first
               (`partition_parameters`)
    rank r:  inner optimizer over {w : owner(w) = r}      # state: K N / p numbers, not K N
    step():  inner.step();  for every rank r: broadcast(its parameters packed flat, src=r)

The gradients must already be averaged (DDP, or `DDPOverlap`); the update of each weight is
the same elementwise AdamW as unsharded, so the weights agree bit for bit.

Use inside a process group the caller set up (gloo here):

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)

Checkpoints, as torch's ZeroRedundancyOptimizer: `consolidate_state_dict(to=0)` on every rank
gathers the shares on rank 0, where `state_dict()` is then the state dict of an unsharded
`optimizer_cls` over the same parameter groups (indices counted across the groups);
`load_state_dict` of such a dict, on every rank, keeps each rank's share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfbook.config import is_int
from tfbook.parallel.ddp import require_process_group


def partition_parameters(numels: Sequence[int], world_size: int,
                         start: Sequence[int] | None = None) -> list[int]:
    """The rank that owns each parameter: largest first (ties in order), each to the rank
    holding the fewest numbers so far (ties: the lowest rank). `start`: numbers each rank
    already owns (ShardedOptimizer deals each parameter group on from the last).

    [6, 1, 4, 3] over 2 ranks -> [0, 0, 1, 1] (6 + 1 and 4 + 3).
    """
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if isinstance(numels, str | bytes) or not all(is_int(n) and n >= 0 for n in numels):
        raise ValueError(f"numels must be a sequence of ints >= 0 (numbers in each parameter), "
                         f"got {numels!r:.60}")
    load = [0] * world_size if start is None else list(start)
    if len(load) != world_size:
        raise ValueError(f"start must give {world_size} numbers (one per rank), got {start!r}")
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        r = min(range(world_size), key=lambda k: (load[k], k))
        owners[i] = r
        load[r] += numels[i]
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: each rank builds `optimizer_cls(**kwargs)` over its share of the
    parameters (shares balanced by number of elements, `partition_parameters`), steps it, and
    broadcasts its updated parameters (one flat vector per owner and dtype). Parameter groups
    and `add_param_group` work as in any torch optimizer; hyperparameters changed in
    `param_groups` (a scheduler) reach the inner optimizer at the next step. Checkpoints:
    `consolidate_state_dict(to)`, then `state_dict()` on rank `to`; `load_state_dict` on all."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)
                and not issubclass(optimizer_cls, ShardedOptimizer)):
            raise TypeError("ShardedOptimizer: optimizer_cls must be a torch.optim.Optimizer "
                            "class (e.g. torch.optim.AdamW, not an instance), got "
                            f"{optimizer_cls!r}")
        if isinstance(params, nn.Module | Tensor):
            raise TypeError("ShardedOptimizer: params must be an iterable of parameters or of "
                            "parameter-group dicts (e.g. model.parameters()), got a "
                            f"{type(params).__name__}")
        try:  # refuse bad hyperparameters on every rank alike, before any collective
            optimizer_cls([torch.zeros(1, requires_grad=True)], **kwargs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"ShardedOptimizer: {optimizer_cls.__name__} refused the keyword "
                              f"arguments {kwargs}: {error}") from error
        self.rank, self.world_size = require_process_group("ShardedOptimizer")
        self.optimizer_cls, self.inner_kwargs = optimizer_cls, dict(kwargs)
        self.owner: dict[int, int] = {}  # id(parameter) -> the rank that steps it
        self.shard_numel = [0] * self.world_size  # numbers each rank owns so far
        self.inner: torch.optim.Optimizer | None = None  # built with this rank's first share
        self._inner_groups: list[tuple[int, int]] = []  # (our group index, inner group index)
        self._consolidated: dict[str, Any] | None = None  # the whole state, on rank `to`
        self._broadcasts: list[tuple[int, list[Tensor]]] | None = None  # (owner, parameters)
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (torch's checks and defaults), deal its parameters out to the ranks,
        and give this rank's share to the inner optimizer as a group of its own."""
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        # every rank must deal out the same parameters, or owners would disagree
        shapes = [(tuple(p.shape), str(p.dtype)) for p in group["params"]]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, shapes)
        if any(g != shapes for g in gathered):
            differs = [r for r, g in enumerate(gathered) if g != gathered[0]]
            raise ValueError("ShardedOptimizer: every rank must pass parameters of the same "
                             f"shapes and dtypes in the same order; rank(s) {differs} differ "
                             f"from rank 0 in parameter group {index}")
        # largest first, each to the rank holding the fewest numbers (ties: lowest rank);
        # torch's add_param_group has refused a parameter already in another group
        owners = partition_parameters([p.numel() for p in group["params"]], self.world_size,
                                      self.shard_numel)
        for p, r in zip(group["params"], owners, strict=True):
            self.owner[id(p)] = r
            self.shard_numel[r] += p.numel()
        self._broadcasts = None  # to be planned again with this group's parameters
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
        # one broadcast per owner and dtype: its parameters packed into one flat vector
        sent = []
        for r, params in self._broadcast_plan():
            if r == self.rank:
                flat = torch.cat([p.detach().reshape(-1) for p in params])  # (their numbers,)
            else:
                flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype,
                                   device=params[0].device)
            sent.append((dist.broadcast(flat, src=r, async_op=True), r, params, flat))
        for handle, r, params, flat in sent:
            handle.wait()
            if r != self.rank:
                for p, value in zip(params, flat.split([p.numel() for p in params]),
                                    strict=True):
                    p.copy_(value.view_as(p))
        return loss

    def _broadcast_plan(self) -> list[tuple[int, list[Tensor]]]:
        """(owner, its parameters of one dtype) in the same order on every rank."""
        if self._broadcasts is None:
            params = [p for group in self.param_groups for p in group["params"]]
            plan = []
            for r in range(self.world_size):
                mine = [p for p in params if self.owner[id(p)] == r]
                for dtype in dict.fromkeys(p.dtype for p in mine):
                    plan.append((r, [p for p in mine if p.dtype == dtype]))
            self._broadcasts = plan
        return self._broadcasts

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (the tensors of its inner optimizer)."""
        if self.inner is None:
            return 0
        return sum(t.numel() * t.element_size() for state in self.inner.state.values()
                   for t in state.values() if isinstance(t, Tensor))

    # ---- checkpoints (as torch's ZeroRedundancyOptimizer: consolidate, then state_dict) ----
    def _global_index(self) -> dict[int, int]:
        """id(parameter) -> its index in an unsharded optimizer's state dict (the parameters
        of every group in order, counted from 0 across the groups, as torch numbers them)."""
        return {id(p): i for i, p in
                enumerate(p for group in self.param_groups for p in group["params"])}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's share of the optimizer state on rank `to` (a collective: call it
        on every rank). Afterwards `state_dict()` on that rank returns the whole state, in the
        format of an unsharded `optimizer_cls` over the same parameter groups."""
        if not is_int(to) or not 0 <= to < self.world_size:
            raise ValueError(f"ShardedOptimizer.consolidate_state_dict: to must be a rank, an "
                             f"int in [0, {self.world_size}), got {to!r}")
        index = self._global_index()
        share: dict[str, Any] = {"state": {}, "groups": {}}
        if self.inner is not None:
            inner = self.inner.state_dict()  # indices local to the inner optimizer
            params = [p for group in self.inner.param_groups for p in group["params"]]
            # copies: the inner optimizer's own tensors change in place at the next step
            share["state"] = {index[id(params[i])]: {k: v.clone() if isinstance(v, Tensor) else v
                                                     for k, v in value.items()}
                              for i, value in inner["state"].items()}
            share["groups"] = {ours: {k: v for k, v in inner["param_groups"][theirs].items()
                                      if k != "params"} for ours, theirs in self._inner_groups}
        gathered: list[Any] | None = [None] * self.world_size if self.rank == to else None
        dist.gather_object(share, gathered, dst=to)
        self._consolidated = None
        if self.rank != to:
            return
        state: dict[int, Any] = {}
        options: dict[int, dict[str, Any]] = {}
        for piece in gathered:
            state.update(piece["state"])
            for g, value in piece["groups"].items():
                options.setdefault(g, value)
        groups, start = [], 0
        for g, group in enumerate(self.param_groups):
            mine = {k: v for k, v in group.items() if k != "params"}
            n = len(group["params"])
            # ours first (a scheduler may have changed them since the last step), then the
            # inner optimizer's defaults that the group does not name
            groups.append({**options.get(g, {}), **mine, "params": list(range(start, start + n))})
            start += n
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state, on the rank `consolidate_state_dict(to)` gathered it on
        (an unsharded `optimizer_cls` over the same parameter groups loads it); a RuntimeError
        elsewhere or before consolidating, as torch's ZeroRedundancyOptimizer."""
        consolidated = getattr(self, "_consolidated", None)
        if consolidated is None:
            raise RuntimeError("ShardedOptimizer: each rank holds only its share of the state; "
                               "call consolidate_state_dict(to) on every rank first, then "
                               "state_dict() on rank `to` (after the last step)")
        return {"state": {i: dict(v) for i, v in consolidated["state"].items()},
                "param_groups": [dict(g) for g in consolidated["param_groups"]]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole state dict (from `state_dict()` here, or from an unsharded
        `optimizer_cls` over the same parameter groups) on every rank: each keeps the state of
        the parameters it owns, and every group's hyperparameters."""
        if not (isinstance(state_dict, dict) and isinstance(state_dict.get("state"), dict)
                and isinstance(state_dict.get("param_groups"), list)):
            raise TypeError("ShardedOptimizer.load_state_dict expects a dict with 'state' (a "
                            "dict) and 'param_groups' (a list), as Optimizer.state_dict() "
                            f"gives, got {type(state_dict).__name__}")
        saved = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if [len(g.get("params", ())) for g in saved] != sizes:
            raise ValueError(f"ShardedOptimizer.load_state_dict: the state dict's parameter "
                             f"groups hold {[len(g.get('params', ())) for g in saved]} "
                             f"parameters, this optimizer's {sizes}")
        order = [i for group in saved for i in group["params"]]  # saved index of each parameter
        for group, saved_group in zip(self.param_groups, saved, strict=True):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
        self._consolidated = None
        if self.inner is None:
            return
        index = self._global_index()
        inner_state, inner_groups, i = {}, [], 0
        for ours, theirs in self._inner_groups:
            params = self.inner.param_groups[theirs]["params"]
            options = {k: v for k, v in saved[ours].items() if k != "params"}
            inner_groups.append({**options, "params": list(range(i, i + len(params)))})
            for p in params:
                saved_index = order[index[id(p)]]
                if saved_index in state_dict["state"]:
                    inner_state[i] = state_dict["state"][saved_index]
                i += 1
        self.inner.load_state_dict({"state": inner_state, "param_groups": inner_groups})
