"""One launch of a process group per test file: every scenario runs in it and saves what it
saw; the tests read the saved results (starting processes that import torch costs seconds)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp

from tfbook.train.distributed import free_port, passive_single_thread_children


def spawn_scenarios(worker, out_dir: Path, world_size: int = 2) -> list[dict]:
    """Run worker(rank, world_size, init_method, out_dir) in `world_size` spawned processes
    (one thread each); each saves a dict to out_dir/rank<r>.pt, returned in rank order."""
    with passive_single_thread_children():
        mp.spawn(worker, args=(world_size, f"tcp://127.0.0.1:{free_port()}", str(out_dir)),
                 nprocs=world_size, join=True)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]
