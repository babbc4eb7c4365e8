"""A sharded optimizer, ZeRO stage 1 (Rajbhandari et al. 2020, section 5.1): what
`torch.distributed.optim.ZeroRedundancyOptimizer` does, written out.

In plain data parallelism every rank holds the optimizer state of every parameter (AdamW: two
numbers, m and v, per weight) and takes the same step. Here the parameters are dealt out to
the ranks, each rank keeps the state of its share only and steps only that share; then every
parameter is broadcast from the rank that owns it, so all replicas hold the new weights:

    owner(w) = the rank with the fewest numbers so far, parameters taken largest first
               (`partition_parameters`)
    rank r:  inner optimizer over {w : owner(w) = r}      # state: K N / p numbers, not K N
    step():  inner.step();  for every rank r: broadcast(flat[r], src=r)

The gradients must already be averaged (DDP, or `DDPOverlap`); the update of each weight is
the same elementwise AdamW as unsharded, so the weights agree bit for bit.

The parameters live in flat buffers (as `parameters_as_bucket_view=True` in torch's
ZeroRedundancyOptimizer): at construction, and again for the parameters `add_param_group`
brings, the parameters of each owner and dtype are copied into one flat vector `flat[r]`
(`ShardedOptimizer.buckets`) and each parameter's storage becomes a slice of it
(`p.data = flat[r][i:j].view_as(p)`). They stay the same `Parameter` objects, with the same
values and gradients, so the model and every reference to them see the new weights; the
owner's inner step writes into `flat[r]`, and one broadcast of `flat[r]` writes straight into
the other ranks' parameters, with nothing packed or copied back. So a parameter's storage is
now its bucket's: `p.untyped_storage()` is the whole buffer (`torch.save(p)` alone saves the
whole bucket; a model's state_dict saves each bucket once). In-place changes
(`load_state_dict`, `p.copy_`, `p.mul_`) keep the views. If a caller later replaces `p.data`
(e.g. `p.data = p.data.clone()`), `step` notices (the parameter's data pointer is no longer
its slice's) and broadcasts that parameter through a copy: the owner copies it into its slice
before the broadcast, the others copy it out after, which is correct but slower, and warns
once. A replacement of another shape, dtype or device (`model.half()` or `.to(device)` after
construction) is refused at the next step: build the optimizer after converting the model.

Use inside a process group the caller set up (gloo here):

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)

Checkpoints, as torch's ZeroRedundancyOptimizer: `consolidate_state_dict(to=0)` on every rank
gathers the shares on rank 0, where `state_dict()` is then the state dict of an unsharded
`optimizer_cls` over the same parameter groups (indices counted across the groups);
`load_state_dict` of such a dict, on every rank, keeps each rank's share.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

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


class Bucket(NamedTuple):
    """One owner's parameters of one dtype and device, stored in one flat vector: parameter
    `params[k]` is `flat[offsets[k]:offsets[k + 1]].view_as(params[k])`."""

    owner: int
    flat: Tensor  # (numbers of its parameters,)
    params: list[Tensor]
    offsets: list[int]  # len(params) + 1


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors a torch optimizer's state holds (AdamW: m, v and the step)."""
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if isinstance(t, Tensor))


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: each rank builds `optimizer_cls(**kwargs)` over its share of the
    parameters (shares balanced by number of elements, `partition_parameters`), steps it, and
    broadcasts its updated parameters: one flat vector per owner and dtype, which the
    parameters are views of (`buckets`; see the module's docstring). Parameter groups
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
        self.buckets: list[Bucket] = []  # the flat buffers the parameters are views of
        self._warned_copy = False  # warned that a parameter's data was replaced
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
        self._bucket_parameters()
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
        # one broadcast per owner and dtype, of the flat buffer its parameters are views of:
        # the owner's step wrote into it, the broadcast writes into the others' parameters
        replaced = self._replaced()  # none, unless a caller replaced some p.data
        self._copy_replaced(replaced, into_flat=True)
        handles = [dist.broadcast(bucket.flat, src=bucket.owner, async_op=True)
                   for bucket in self.buckets]
        for handle in handles:
            handle.wait()
        self._copy_replaced(replaced, into_flat=False)
        return loss

    def _bucket_parameters(self) -> None:
        """Put every parameter into the flat buffer of its owner, dtype and device (the same
        order on every rank: param_groups and owners agree), and make it a view of its slice.
        Called by add_param_group: buckets that gain parameters are built anew, the values
        of the parameters they already held copied over."""
        keys: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                keys.setdefault((self.owner[id(p)], p.dtype, p.device), []).append(p)
        kept = {(b.owner, b.flat.dtype, b.flat.device): b for b in self.buckets}
        buckets = []
        for r in range(self.world_size):  # by owner, then dtypes in order of first use
            for (owner, dtype, device), params in keys.items():
                if owner != r:
                    continue
                old = kept.get((owner, dtype, device))
                if old is not None and len(old.params) == len(params) and all(
                        a is b for a, b in zip(old.params, params, strict=True)):
                    buckets.append(old)
                    continue
                offsets = [0]
                for p in params:
                    offsets.append(offsets[-1] + p.numel())
                flat = torch.empty(offsets[-1], dtype=dtype, device=device)
                for p, i, j in zip(params, offsets, offsets[1:], strict=False):
                    flat[i:j].copy_(p.detach().reshape(-1))
                for p, i, j in zip(params, offsets, offsets[1:], strict=False):
                    p.data = flat[i:j].view_as(p)
                buckets.append(Bucket(owner, flat, params, offsets))
        self.buckets = buckets

    def _replaced(self) -> list[tuple[Bucket, list[int]]]:
        """(bucket, indices) of the parameters that are no longer views of their slice of the
        flat buffer (a caller replaced p.data); refused if the replacement has another shape,
        dtype or device. One data_ptr() per parameter and step."""
        replaced = []
        for bucket in self.buckets:
            base, size = bucket.flat.data_ptr(), bucket.flat.element_size()
            moved = [k for k, p in enumerate(bucket.params)
                     if p.numel() > 0 and p.data_ptr() != base + size * bucket.offsets[k]]
            for k in moved:
                p, n = bucket.params[k], bucket.offsets[k + 1] - bucket.offsets[k]
                if (p.numel(), p.dtype, p.device) != (n, bucket.flat.dtype, bucket.flat.device):
                    raise ValueError(
                        f"ShardedOptimizer: a parameter's data was replaced after construction "
                        f"by {p.numel()} numbers, {p.dtype}, on {p.device}; it held {n} "
                        f"numbers, {bucket.flat.dtype}, on {bucket.flat.device} (e.g. "
                        f"model.half() or .to(device) after building the optimizer): build "
                        f"the optimizer after converting the model")
            if moved:
                replaced.append((bucket, moved))
        if replaced and not self._warned_copy:
            self._warned_copy = True
            warnings.warn(f"ShardedOptimizer: {sum(len(m) for _, m in replaced)} parameter(s) "
                          f"no longer share the flat buffer their owner broadcasts (p.data was "
                          f"replaced after construction); they are copied into it and out of it "
                          f"at every step (correct, slower)", stacklevel=3)
        return replaced

    def _copy_replaced(self, replaced: list[tuple[Bucket, list[int]]], into_flat: bool) -> None:
        """The packed broadcast's copies, for replaced parameters only: before the broadcast
        the owner copies them into its flat buffer, after it the others copy them out."""
        for bucket, moved in replaced:
            if (bucket.owner == self.rank) != into_flat:
                continue
            for k in moved:
                p, piece = bucket.params[k], bucket.flat[bucket.offsets[k]:bucket.offsets[k + 1]]
                if into_flat:
                    piece.copy_(p.detach().reshape(-1))
                else:
                    p.detach().copy_(piece.view_as(p))

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (the tensors of its inner optimizer)."""
        return 0 if self.inner is None else optimizer_state_bytes(self.inner)

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
