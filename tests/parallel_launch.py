"""One launch of a process group per test file: every scenario runs in it and saves what it
saw; the tests read the saved results (starting processes that import torch costs seconds)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tfbook.train.distributed import free_port, passive_single_thread_children


def spawn_scenarios(worker, out_dir: Path, world_size: int = 2, *extra) -> list[dict]:
    """Run worker(rank, world_size, init_method, out_dir, *extra) in `world_size` spawned
    processes (one thread each); each saves a dict to out_dir/rank<r>.pt, returned in rank
    order."""
    with passive_single_thread_children():
        mp.spawn(worker, args=(world_size, f"tcp://127.0.0.1:{free_port()}", str(out_dir),
                               *extra), nprocs=world_size, join=True)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]


def _in_group(rank: int, world_size: int, init_method: str, out_dir: str,
              scenarios: Callable[[int, int], dict], timeout: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    try:
        torch.save(scenarios(rank, world_size), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_in_group(scenarios: Callable[[int, int], dict], out_dir: Path, world_size: int = 2,
                 timeout: float = 120.0) -> list[dict]:
    """Run scenarios(rank, world_size) -> dict in every process of one gloo group (one thread
    each; a collective waiting longer than `timeout` seconds fails); the dicts in rank order.
    `scenarios` is a module-level function (the children import it)."""
    return spawn_scenarios(_in_group, out_dir, world_size, scenarios, timeout)
