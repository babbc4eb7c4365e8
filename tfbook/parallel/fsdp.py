"""Fully sharded data parallelism (Zhao et al. 2023, "PyTorch FSDP"; ZeRO stage 3 in
Rajbhandari et al. 2020), written on torch.distributed: every rank keeps 1/p of the weights.

Units. The wrapped module is cut into units: every child of an nn.ModuleList inside it (the
GPT's `blocks`: one transformer block each) is a unit, and every other parameter (embeddings,
final norm, output layer; a tied matrix once) forms the root unit. A parameter shared by two
units is refused. Each unit's parameters are flattened, in named_parameters order, into one
vector of n numbers, padded with zeros to N = p ceil(n / p) so that p ranks get equal shards:

    flat (N,) = [w_1.flatten(), w_2.flatten(), ..., 0 * (N - n)]
    rank r keeps shard_r = flat[r N/p : (r + 1) N/p]     # the master copy, float32 (or float64)

(`FSDP.layout` tells, per unit, n, the padding N - n and the shard size N / p.)

A step, per unit:
    forward:  all-gather the p shards into the full flat vector (cast to `compute_dtype` if
              given, e.g. bfloat16; then a unit's vectors have a flat vector of their own, see
              "Mixed precision"), point the unit's modules at views of it, run the unit,
              free the full vector (its storage shrinks to nothing; autograd's saved views
              keep pointing at that storage);
    backward: when the gradient reaches the unit's output, all-gather the full vector again
              into the same storage; the unit's backward then accumulates the gradient of
              the full vector (N,); it is cast to the master dtype and reduce-scattered
              (summed, then divided by p), so rank r receives the averaged gradient of its
              shard; the full vector is freed again.
The root unit is gathered at the start of the forward pass and kept until its gradient is
reduced at the end of the backward pass (its output layer is the first thing the backward
pass needs), as FSDP2 does for its root. Buffers are not sharded: rank 0's are broadcast once.

The optimiser is built over `FSDP.parameters()`, which yields the shards, one per flat vector
(1-D tensors: weight decay applies to every number of a shard alike; torch's FSDP with flat
parameters has the same limit). `finish_gradient_synchronization()` waits for the reductions
still in flight and stores each shard's gradient; the backward pass also calls it at its end,
so a plain training loop works too (tfbook.train.loop.train with clip=None: clipping by the
global norm would need the squared norms of all ranks' shards summed, and the loop sees only
this rank's).
`full_state_dict()` gathers the master weights into a state dict with the unsharded module's
names, which `load_state_dict` of an unsharded model accepts.

Mixed precision. With `compute_dtype` (e.g. torch.bfloat16 or torch.float16) the matrices
(parameters with two or more dimensions: Linear weights, embeddings) are gathered in that dtype
and the forward and backward passes use them rounded to it; the vectors (norm gains, biases)
stay in the parameters' own dtype, in a second flat group of their unit
(`UnitLayout.full_precision`). The shards (master weights), the reduce-scatter of the gradients
and the optimiser use the parameters' dtype throughout. Keeping norms in float32 is the usual
mixed-precision practice and what CS336's reference does (it casts only Linear and Embedding
weights): a gain rounded to float16 moves every normalised activation by up to 2^-11 of itself
and is updated through a float16 gradient, and on a toy model of CS336's test that alone
moves weights about 1e-4 (its tolerance) from the reference within three SGD steps, about a
hundred times further than with the vectors kept. Torch's own nn.Linear computes
with one dtype, so its bias is rounded to compute_dtype where it is used (gathered and updated
in full precision all the same). The module's forward must accept float32 vectors beside
compute_dtype matrices: a norm that computes in float32 and returns its input's dtype
(Llama-style RMSNorm; torch's F.layer_norm, so tfbook's fused LayerNorm) does; tfbook's
unfused LayerNorm and its RMSNorm return float32, and a GPT built with them (fused_norm=False,
or norm="rms") needs `cast="all"` (FSDP says so when a forward fails on mixed dtypes).

`cast="all"` casts every parameter, vectors included: PyTorch's FSDP2 with
`fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32))`,
whose param_dtype applies to every parameter of the module it shards (FSDP2 keeps a norm in
float32 only if that norm is fully_shard-ed separately with param_dtype=None; FSDP1's
MixedPrecision kept BatchNorm so through `_module_classes_to_ignore`).

Inside forward and backward the wrapped module's parameters are plain tensors (views of the
gathered vector); outside them read the weights with `full_state_dict()`. Each unit runs
once per forward pass (as a GPT's blocks do). Use inside a process group the caller set up.
Shape legend: p world size, n a unit's numbers, N = p ceil(n / p), s = N / p numbers a rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfbook.parallel.ddp import require_process_group

CASTS = ("matrices", "all")  # which parameters a compute_dtype applies to
# torch modules whose kernels take one dtype: a vector kept in full precision is rounded to
# the compute dtype where they use it
_ONE_DTYPE = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.MultiheadAttention)


@dataclass(frozen=True)
class UnitLayout:
    """How one unit is flattened and sharded."""

    name: str  # "" for the root unit, else the unit's module name ("blocks.0")
    numel: int  # n, the unit's parameter numbers
    padded: int  # N = p ceil(n / p)
    shard: int  # s = N / p numbers each rank keeps
    params: tuple[str, ...]  # the parameters, flattened in this order (a tied matrix once)
    full_precision: bool = False  # gathered in the master dtype (the vectors, cast="matrices")

    @property
    def padding(self) -> int:
        """N - n (< p) zeros at the end of the flat vector, in the last ranks' shards."""
        return self.padded - self.numel


@dataclass
class _Unit:
    layout: UnitLayout
    locations: list[list[tuple[nn.Module, str]]]  # per parameter: every (module, attribute)
    shapes: list[torch.Size]
    numels: list[int]
    shard: nn.Parameter  # (s,) master weights
    full: Tensor  # (N,) the gathered parameters in the compute dtype; storage freed between
    names_by_param: list[list[str]]  # every state-dict name of each parameter
    regather: bool = False  # the backward pass must gather again before the unit's backward


def _units(module: nn.Module) -> list[tuple[str, nn.Module, list[nn.Module]]]:
    """(name, unit module, the modules whose parameters the unit owns): the children of every
    nn.ModuleList outside other units, then the root (every other module)."""
    blocks: list[tuple[str, nn.Module]] = []
    root_modules: list[nn.Module] = []

    def walk(prefix: str, m: nn.Module) -> None:
        root_modules.append(m)
        for child_name, child in m.named_children():
            name = f"{prefix}{child_name}"
            if isinstance(child, nn.ModuleList):
                root_modules.append(child)
                blocks.extend((f"{name}.{i}", c) for i, c in child.named_children())
            else:
                walk(f"{name}.", child)

    walk("", module)
    units = [(name, m, list(m.modules())) for name, m in blocks]
    return [*units, ("", module, root_modules)]


class FSDP(nn.Module):
    """Wrap `module` (built alike on every rank: rank 0's weights are broadcast) for fully
    sharded data parallelism in the current process group; see the module docstring.

    compute_dtype: None (compute in the parameters' own dtype) or a floating dtype such as
    torch.bfloat16: the gathered matrices (every parameter with cast="all"), hence the
    activations and gradients through them, are in that dtype, while each rank's shard (the
    master weights the optimiser updates) keeps the parameters' dtype and the gradients are
    reduced in it.

    cast: with a compute_dtype, "matrices" (default: parameters with >= 2 dimensions in
    compute_dtype, vectors such as norm gains and biases in the master dtype) or "all" (every
    parameter, as FSDP2's MixedPrecisionPolicy(param_dtype=...)); see "Mixed precision" in the
    module docstring.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 cast: str = "matrices") -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"FSDP: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if compute_dtype is not None and not isinstance(compute_dtype, torch.dtype):
            raise TypeError(f"FSDP: compute_dtype must be None or a torch floating dtype "
                            f"(e.g. torch.bfloat16), got {type(compute_dtype).__name__} "
                            f"{compute_dtype!r:.40}")
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"FSDP: compute_dtype must be a floating dtype (e.g. "
                             f"torch.bfloat16), got {compute_dtype}")
        if cast not in CASTS:
            raise ValueError(f"FSDP: cast must be one of {CASTS} (which parameters compute in "
                             f"compute_dtype), got {cast!r:.40}")
        if not list(module.parameters()):
            raise ValueError(f"FSDP: {type(module).__name__} has no parameters to shard")
        frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
        if frozen:
            raise ValueError(f"FSDP trains every parameter; these do not require grad: "
                             f"{frozen[:3]}")
        rank, world_size = require_process_group("FSDP")
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.cast = cast
        self.rank, self.world_size = rank, world_size
        self._pending: list[tuple[dist.Work, Tensor, Tensor, _Unit]] = []
        self._callback_queued = False

        names = {id(p): n for n, p in module.named_parameters()}  # a tied matrix: first name
        order = {key: i for i, key in enumerate(names)}
        everywhere: dict[int, list[str]] = {}  # every state-dict name of each parameter
        for prefix, m in module.named_modules(remove_duplicate=False):
            for attr, p in m._parameters.items():
                if p is not None:
                    everywhere.setdefault(id(p), []).append(f"{prefix}.{attr}" if prefix
                                                            else attr)
        # first every unit's parameters, checked, before any module is changed
        owner: dict[int, str] = {}
        plan = []
        for unit_name, unit_module, members in _units(module):
            unit_params, locations = [], []
            index: dict[int, int] = {}
            for m in members:
                for attr, p in m._parameters.items():
                    if p is None:
                        continue
                    if id(p) in owner and owner[id(p)] != unit_name:
                        raise ValueError(
                            f"FSDP: parameter {names[id(p)]!r} is used by two units "
                            f"({owner[id(p)] or 'root'!r} and {unit_name or 'root'!r}); "
                            f"a shared parameter must live in one unit")
                    owner[id(p)] = unit_name
                    if id(p) not in index:
                        index[id(p)] = len(unit_params)
                        unit_params.append(p)
                        locations.append([])
                    if (m, attr) not in locations[index[id(p)]]:
                        locations[index[id(p)]].append((m, attr))
            if not unit_params:
                continue
            unit_params.sort(key=lambda p: order[id(p)])  # named_parameters order
            locations = [locations[index[id(p)]] for p in unit_params]
            dtypes = {p.dtype for p in unit_params}
            if len(dtypes) > 1 or not unit_params[0].dtype.is_floating_point:
                raise ValueError(f"FSDP: the parameters of unit {unit_name or 'root'!r} must "
                                 f"share one floating dtype, got {sorted(map(str, dtypes))}")
            # with another compute dtype and cast="matrices", the vectors form a group of
            # their own (its own flat vector, gathered in the master dtype)
            split = compute_dtype not in (None, unit_params[0].dtype) and cast == "matrices"
            kept = [split and p.dim() < 2 for p in unit_params]
            for keep in (False, True):
                group = [i for i, k in enumerate(kept) if k == keep]
                if group:
                    plan.append((unit_name, unit_module, [unit_params[i] for i in group],
                                 [locations[i] for i in group], keep))

        for t in module.buffers():  # buffers are replicated: rank 0's everywhere
            dist.broadcast(t.data, src=0)
        self._units: list[_Unit] = []
        shards = []
        for unit_name, unit_module, unit_params, locations, keep in plan:
            master_dtype = unit_params[0].dtype
            numels = [p.numel() for p in unit_params]
            n = sum(numels)
            s = -(-n // self.world_size)  # ceil(n / p)
            padded = s * self.world_size
            flat = torch.zeros(padded, dtype=master_dtype)  # (N,)
            torch.cat([p.detach().reshape(-1) for p in unit_params], out=flat[:n])
            dist.broadcast(flat, src=0)  # every rank starts from rank 0's weights
            shard = nn.Parameter(flat[self.rank * s:(self.rank + 1) * s].clone())  # (s,)
            dtype = master_dtype if keep or compute_dtype is None else compute_dtype
            full = torch.empty(padded, dtype=dtype, requires_grad=True)
            layout = UnitLayout(unit_name, n, padded, s,
                                tuple(names[id(p)] for p in unit_params), keep)
            unit = _Unit(layout, locations, [p.shape for p in unit_params], numels, shard, full,
                         [everywhere[id(p)] for p in unit_params])
            self._free(unit)
            for place in locations:  # the modules hold plain tensors from now on
                for m, attr in place:
                    del m._parameters[attr]
                    setattr(m, attr, None)
            full.register_post_accumulate_grad_hook(
                lambda _full, unit=unit: self._reduce_scatter(unit))
            if unit_name:  # a block: gather before its forward, free after it
                unit_module.register_forward_pre_hook(
                    lambda _m, _args, unit=unit: self._gather(unit))
                unit_module.register_forward_hook(
                    lambda _m, _args, out, unit=unit: self._after_forward(unit, out))
            self._units.append(unit)
            shards.append(shard)
        self.shards = nn.ParameterList(shards)  # what parameters() yields: one shard a unit

    @property
    def layout(self) -> list[UnitLayout]:
        """Per unit (blocks first, the root last): n, N, s and the parameters' order."""
        return [u.layout for u in self._units]

    @property
    def root(self) -> _Unit:
        return self._units[-1]

    @property
    def _roots(self) -> list[_Unit]:
        """The root unit's flat groups (two when its vectors keep the master dtype)."""
        return [u for u in self._units if not u.layout.name]

    # ---- gathering and freeing -------------------------------------------------------
    @staticmethod
    def _free(unit: _Unit) -> None:
        """Drop the full vector's numbers; the tensor (and autograd's views of it) remain."""
        unit.full.data.untyped_storage().resize_(0)

    def _gather(self, unit: _Unit) -> None:
        """All-gather the shards into unit.full (N,) and point the modules at views of it."""
        full = unit.full.data  # .data: writing here does not count as an in-place change
        storage = full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(full.numel() * full.element_size())
        dist.all_gather_single(full, unit.shard.detach().to(full.dtype))
        views = unit.full.split([*unit.numels, unit.layout.padding])
        rounded = unit.layout.full_precision and self.compute_dtype is not None
        for view, shape, place in zip(views, unit.shapes, unit.locations, strict=False):
            tensor = view.view(shape)
            for m, attr in place:  # a torch Linear's bias: rounded where it is used
                setattr(m, attr, tensor.to(self.compute_dtype) if rounded and isinstance(
                    m, _ONE_DTYPE) else tensor)

    def _after_forward(self, unit: _Unit, output: Any) -> Any:
        self._free(unit)
        tensors = [t for t in (output if isinstance(output, tuple | list) else (output,))
                   if isinstance(t, Tensor) and t.requires_grad]
        if tensors:
            unit.regather = True
            for t in tensors:
                t.register_hook(lambda _grad, unit=unit: self._gather_for_backward(unit))
        return output

    def _gather_for_backward(self, unit: _Unit) -> None:
        if unit.regather:
            unit.regather = False
            self._gather(unit)

    # ---- gradients -------------------------------------------------------------------
    def _reduce_scatter(self, unit: _Unit) -> None:
        """The full vector's gradient is complete: reduce-scatter it (asynchronously) in the
        master dtype into this rank's shard, and free the full vector."""
        grad = unit.full.grad.to(unit.shard.dtype)  # (N,)
        unit.full.grad = None
        self._free(unit)
        out = torch.empty_like(unit.shard, memory_format=torch.contiguous_format)  # (s,)
        work = dist.reduce_scatter_single(out, grad, op=dist.ReduceOp.SUM, async_op=True)
        self._pending.append((work, out, grad, unit))  # grad: kept alive until the wait
        if not self._callback_queued:  # finish when the whole backward pass is done
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self.finish_gradient_synchronization)

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters in flight; add each averaged shard gradient to the
        shard's .grad. Call after backward (the backward pass calls it too: a second call
        finds nothing left to wait for)."""
        pending, self._pending, self._callback_queued = self._pending, [], False
        for work, out, _grad, unit in pending:
            work.wait()
            out.div_(self.world_size)  # summed over ranks -> averaged
            if unit.shard.grad is None:
                unit.shard.grad = out
            else:
                unit.shard.grad += out

    # ---- forward and checkpoints ---------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward, with the root unit gathered around it."""
        for unit in self._roots:
            self._gather(unit)
        try:
            return self.module(*args, **kwargs)
        except (RuntimeError, TypeError) as error:
            if (self.compute_dtype is not None and self.cast == "matrices"
                    and "dtype" in str(error)):
                raise TypeError(
                    f"FSDP: the wrapped module's forward failed on mixed dtypes ({error}). "
                    f"With compute_dtype={self.compute_dtype} and cast='matrices' the matrices "
                    "compute in that dtype and the vectors (norm gains, biases) stay in "
                    f"{self._units[0].shard.dtype}; a module whose norms return float32 (as "
                    "tfbook's unfused ones do) needs FSDP(..., cast='all'), or norms that "
                    "return their input's dtype") from error
            raise
        finally:
            if not torch.is_grad_enabled():
                for unit in self._roots:
                    self._free(unit)  # no backward pass will come to free it

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, Tensor]:
        """Every parameter (master dtype) under the unsharded module's names, buffers too:
        gathered on every rank (a collective: call it on all), returned on rank 0 (on every
        rank if rank0_only=False; an empty dict elsewhere)."""
        state: dict[str, Tensor] = {}
        for unit in self._units:
            flat = torch.empty(unit.layout.padded, dtype=unit.shard.dtype)  # (N,)
            dist.all_gather_single(flat, unit.shard.detach())
            pieces = flat.split([*unit.numels, unit.layout.padding])
            for piece, shape, names in zip(pieces, unit.shapes, unit.names_by_param,
                                           strict=False):
                for name in names:
                    state[name] = piece.view(shape).clone()
        # what is left in the module's own state dict: its (persistent) buffers
        state.update({k: v.detach().clone() for k, v in self.module.state_dict().items()})
        if rank0_only and self.rank != 0:
            return {}
        return state
