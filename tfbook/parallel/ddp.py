"""Data parallelism whose gradient all-reduces overlap the backward pass (Li et al. 2020,
"PyTorch Distributed", section 3.2): what `torch.nn.parallel.DistributedDataParallel` does,
written out.

`tfbook.train.distributed` averages gradients once they are all computed, or one parameter at a
time. Here they are grouped into buckets of about `bucket_size_mb` megabytes: the parameters
in reverse registration order (the order the backward pass tends to finish them: the last
layer's gradients are ready first), one bucket after another. When the last gradient of a
bucket has been accumulated, the bucket is flattened into one vector and its all-reduce (sum)
starts asynchronously, while autograd goes on with the earlier layers:

    backward:  [grads of bucket 0 ready] [grads of bucket 1 ready] ... [bucket n-1 ready]
    network:              [all-reduce 0]            [all-reduce 1] ...     [all-reduce n-1]
    finish_gradient_synchronization(): wait for each, g <- sum / p, copy into p.grad

Buckets start in index order on every rank (a ready bucket waits for the earlier ones), so the
ranks issue their collectives in the same order whatever order autograd finishes them in.
A tied matrix (GPT's embedding and head) is one Parameter: `parameters()` lists it once and its
hook fires once, after both uses have added their parts. A parameter that received no
gradient on a rank counts as zeros there; one that received none on any rank keeps `grad=None`
(as DDP with find_unused_parameters=True does). Such a parameter holds back its bucket, and
with it every later one, until finish_gradient_synchronization(): no overlap past it.
Unlike torch's DDP, which at its default cap (25 MiB) gives the first bucket only 1 MiB so that
communication starts sooner, every bucket here has the same cap (megabytes are MiB, 2^20 bytes).

Use inside a process group the caller set up (gloo here):

    model = DDPOverlap(GPT(config), bucket_size_mb=1.0)    # broadcasts rank 0's weights
    loss = model(x, targets=y).loss;  loss.backward()
    model.finish_gradient_synchronization()                 # before optimizer.step()
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfbook.config import is_number
from tfbook.train.distributed import check_shardable


class NoProcessGroupError(RuntimeError):
    """A tfbook.parallel wrapper or collective was used in a process that belongs to no
    torch.distributed process group (the caller sets one up in every process first)."""


def require_process_group(owner: str) -> tuple[int, int]:
    """(rank, world size) of the default process group; a NoProcessGroupError (a RuntimeError)
    saying what to do if there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise NoProcessGroupError(
            f"{owner} runs inside a process group, and this process belongs to none: call "
            "torch.distributed.init_process_group (e.g. backend='gloo', with rank, world_size "
            "and an init_method) in every process first (torch.multiprocessing.spawn or "
            "torchrun start them)")
    return dist.get_rank(), dist.get_world_size()


def check_bucket_size(bucket_size_mb: object, owner: str = "DDPOverlap") -> float:
    """The bucket cap in bytes (math.inf for None: one bucket of unbounded size); a TypeError
    for a non-number (a bool, a string), a ValueError for <= 0, NaN or infinity."""
    if bucket_size_mb is None:
        return math.inf
    if not is_number(bucket_size_mb):
        raise TypeError(f"{owner}: bucket_size_mb must be a finite number of megabytes > 0 (or "
                        f"None: one bucket of unbounded size), got "
                        f"{type(bucket_size_mb).__name__} {bucket_size_mb!r:.40}")
    if not 0 < bucket_size_mb < math.inf:
        raise ValueError(f"{owner}: bucket_size_mb must be a finite number of megabytes > 0 (or "
                         f"None: one bucket of unbounded size), got {bucket_size_mb!r}")
    return float(bucket_size_mb) * 2**20


def check_data_parallel(batch_size: int, world_size: int) -> int:
    """Rows per rank, B / p, refusing (before any process starts) a world size that does not
    divide the global batch: `tfbook.train.distributed.check_shardable`, under this name."""
    return check_shardable(batch_size, world_size)


@dataclass
class BucketTiming:
    """When one bucket's all-reduce ran, in seconds after the backward pass reached the
    module's output (the start of its backward pass)."""

    bucket: int  # bucket index: 0 holds the last-registered parameters
    numel: int  # numbers in the bucket
    nbytes: int  # bytes in the bucket
    started: float  # the all-reduce was launched
    waited: float  # finish_gradient_synchronization() had its result
    during_backward: bool  # launched by a gradient hook (True) or only at finish (False)


def plan_buckets(params: list[nn.Parameter], bucket_size_mb: float | None
                 ) -> list[list[nn.Parameter]]:
    """Group parameters into buckets: reverse registration order; a bucket closes once it
    holds bucket_size_mb megabytes (2^20 bytes) or more, or when the dtype changes (torch's
    DDP rule: a bucket may pass the cap by its last parameter). None: no cap (one bucket per
    dtype).

    Three float32 tensors of 1, 2 and 3 MB, cap 3 MB: [[p3], [p2, p1]]; cap 2.5 MB:
    [[p3], [p2, p1]] too (p2 alone is under the cap, so p1 joins it).
    """
    cap = check_bucket_size(bucket_size_mb, "plan_buckets")
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets and size < cap and buckets[-1][0].dtype == p.dtype:
            buckets[-1].append(p)
            size += nbytes
        else:
            buckets.append([p])
            size = nbytes
    return buckets


def _output_tensors(value: Any) -> list[Tensor]:
    """The tensors needing gradients inside a forward output: a tensor, or tuples, lists,
    dicts and dataclasses (GPT's ModelOutput) of them."""
    if isinstance(value, Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, tuple | list):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return []
    return [t for item in items for t in _output_tensors(item)]


class DDPOverlap(nn.Module):
    """Wrap `module` as one data-parallel replica: rank 0's parameters and buffers broadcast
    at construction; gradients averaged across ranks bucket by bucket, each bucket's
    all-reduce launched as soon as its gradients are ready (with overlap=False: all of them
    only once the backward pass is over, the same sums without the overlap). `forward` is the
    module's; call `finish_gradient_synchronization()` after every backward pass, before the
    optimizer step. bucket_size_mb=None puts every gradient in one bucket of unbounded size
    (reduced once the last gradient is ready: no overlap, one collective)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0,
                 overlap: bool = True) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"DDPOverlap wraps a torch.nn.Module, got {type(module).__name__}")
        check_bucket_size(bucket_size_mb)
        if not isinstance(overlap, bool):
            raise TypeError(f"DDPOverlap: overlap must be True or False, got {overlap!r}")
        rank, world_size = require_process_group("DDPOverlap")
        super().__init__()
        self.module = module
        self.rank, self.world_size = rank, world_size
        self.bucket_size_mb = None if bucket_size_mb is None else float(bucket_size_mb)
        self.overlap = overlap  # False: every bucket waits for finish (to time the difference)
        self._check_same_shapes()
        with torch.no_grad():  # every replica starts from rank 0's weights
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

        # parameters() lists a tied matrix once; frozen ones take no part (as in torch's DDP)
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.buckets = plan_buckets(trainable, self.bucket_size_mb)
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in trainable]
        self._flats: dict[int, Tensor] = {}  # bucket -> its flat buffer (made at first use)
        self.timeline: list[BucketTiming] = []  # the last synchronised step's buckets
        self.backward_seconds = 0.0  # the last step: backward start -> finish was called
        self._reset()

    def _check_same_shapes(self) -> None:
        """Every rank must wrap the same architecture, or the buckets would not line up."""
        shapes = [(tuple(p.shape), str(p.dtype), p.requires_grad)
                  for p in self.module.parameters()]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, shapes)
        if any(g != gathered[0] for g in gathered):
            differs = [r for r, g in enumerate(gathered) if g != gathered[0]]
            raise ValueError("DDPOverlap: every rank must wrap a module with the same "
                             "parameters (shapes, dtypes, requires_grad) in the same order; "
                             f"rank(s) {differs} differ from rank 0")

    def _reset(self) -> None:
        """Forget the last step: no bucket ready or launched."""
        self._pending = [len(bucket) for bucket in self.buckets]  # gradients still to come
        self._received: list[set[int]] = [set() for _ in self.buckets]  # ids with a gradient
        self._next = 0  # the next bucket to launch (they go in index order)
        self._work: list[tuple[Any, Tensor, Tensor]] = []  # (handle, flat, has-grad flags)
        self._started: list[tuple[float, bool]] = []
        self._backward_start: float | None = None
        self._forward_end = time.perf_counter()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward; notes when the backward pass reaches its output."""
        output = self.module(*args, **kwargs)
        self._forward_end = time.perf_counter()
        for t in _output_tensors(output):
            t.register_hook(self._backward_reached_output)
        return output

    def _backward_reached_output(self, grad: Tensor) -> None:
        if self._backward_start is None:
            self._backward_start = time.perf_counter()

    def _grad_ready(self, param: Tensor) -> None:
        """Post-accumulate-grad hook: param.grad is final for this backward pass."""
        b = self._bucket_of[id(param)]
        if id(param) in self._received[b]:
            raise RuntimeError("DDPOverlap: a parameter received a second gradient before "
                               "finish_gradient_synchronization(); call it after every "
                               "backward pass")
        self._received[b].add(id(param))
        self._pending[b] -= 1
        while (self.overlap and self._next < len(self.buckets)
               and self._pending[self._next] == 0):
            self._launch(self._next, during_backward=True)

    def _launch(self, b: int, during_backward: bool) -> None:
        """Flatten bucket b (zeros for a missing gradient) plus one has-gradient flag per
        parameter, and start its all-reduce (sum) without waiting."""
        bucket = self.buckets[b]
        grads = [p.grad.detach().reshape(-1) if p.grad is not None
                 else torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in bucket]
        flags = torch.tensor([p.grad is not None for p in bucket], dtype=bucket[0].dtype,
                             device=bucket[0].device)
        flat = self._flats.get(b)  # one buffer per bucket, reused step after step
        if flat is None:
            flat = self._flats[b] = torch.empty(sum(p.numel() for p in bucket) + len(bucket),
                                                dtype=bucket[0].dtype, device=bucket[0].device)
        torch.cat([*grads, flags], out=flat)  # (numel of the bucket + parameters in it,)
        self._started.append((time.perf_counter(), during_backward))
        handle = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        self._work.append((handle, flat, flags))
        self._next = b + 1

    def finish_gradient_synchronization(self) -> None:
        """Launch the buckets still waiting (their parameters got no gradient on this rank),
        wait for every all-reduce, and set each gradient to the mean over the ranks."""
        finished = time.perf_counter()
        while self._next < len(self.buckets):
            self._launch(self._next, during_backward=False)
        origin = self._backward_start if self._backward_start is not None else self._forward_end
        timeline = []
        for b, ((handle, flat, _), (started, during)) in enumerate(
            zip(self._work, self._started, strict=True)
        ):
            handle.wait()
            waited = time.perf_counter()
            bucket = self.buckets[b]
            flat.div_(self.world_size)  # the mean over ranks
            numel = sum(p.numel() for p in bucket)
            values, counts = flat[:numel], flat[numel:]
            for p, g, count in zip(bucket, values.split([p.numel() for p in bucket]),
                                   counts.tolist(), strict=True):
                if count == 0:  # no rank computed a gradient for it
                    continue
                g = g.view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            timeline.append(BucketTiming(b, numel, numel * bucket[0].element_size(),
                                         started - origin, waited - origin, during))
        self.timeline = timeline
        self.backward_seconds = finished - origin  # backward start -> finish was called
        self._reset()

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the wrapped module's parameters."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
