"""Data-parallel training of a small byte-level GPT, launched by torchrun (one process per rank).

torchrun starts the processes and tells each who it is through environment variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); this script joins the gloo process group
they describe, trains its replica with tfbook.train.distributed.train_replica (which calls the
book's one training loop) and, with --out, writes each rank's result as safetensors + JSON.

On one machine, two processes:
    torchrun --standalone --nproc_per_node 2 scripts/ddp_train.py --steps 20
On two machines with 8 processes each (run the same command on both; host0 is one of them):
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_id demo --rdzv_backend c10d \\
        --rdzv_endpoint host0:29400 scripts/ddp_train.py --steps 20 --batch-size 64
"""

import argparse
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tfbook.corpus import stdlib_corpus
from tfbook.models.gpt import GPTConfig
from tfbook.train.distributed import (
    Variant,
    check_local_processes,
    check_shardable,
    save_result,
    train_replica,
)
from tfbook.train.loop import TrainConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch B (rows)")
    parser.add_argument("--T", type=int, default=64, help="window length")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sync", choices=["ddp", "allreduce"], default="ddp")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--data", choices=["corpus", "random"], default="corpus",
                        help="the book's corpus as bytes, or seeded random bytes (faster)")
    parser.add_argument("--corpus-bytes", type=int, default=200_000)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per collective")
    parser.add_argument("--out", type=Path, help="directory for each rank's result")
    return check_args(parser.parse_args(argv))


def setup(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig, torch.Tensor, Variant]:
    """The model, the training, the token stream (N,) and the variant the arguments ask for."""
    if args.data == "corpus":
        ids = torch.tensor(list(stdlib_corpus(args.corpus_bytes).encode("utf-8")))  # (N,)
    else:  # the same bytes on every rank: a fixed seed
        ids = torch.randint(0, 256, (args.corpus_bytes,),
                            generator=torch.Generator().manual_seed(0))  # (N,)
    model_config = replace(GPTConfig.tiny(), d_model=args.d_model, n_layers=args.n_layers,
                           max_len=max(64, args.T))
    train_config = TrainConfig(steps=args.steps, lr=args.lr, clip=None)
    variant = Variant(sync=args.sync, optimizer=args.optimizer, dtype=args.dtype)
    return model_config, train_config, ids, variant


def check_environment(env: "os._Environ[str] | dict[str, str]") -> int:
    """The world size torchrun set; refuses a start without torchrun, variables that are not
    whole numbers, and more processes on this machine than it has cores."""
    if "RANK" not in env:
        raise SystemExit("start this script with torchrun (it sets RANK, WORLD_SIZE, ...), "
                         "e.g. torchrun --standalone --nproc_per_node 2 scripts/ddp_train.py")
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        text = env.get(key, env["WORLD_SIZE"] if key == "LOCAL_WORLD_SIZE" else "")
        if not text.isdigit():
            raise ValueError(f"{key} must be a whole number >= 0 (torchrun sets it), got {text!r}")
        values[key] = int(text)
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise ValueError(f"RANK must lie in [0, WORLD_SIZE = {values['WORLD_SIZE']}), "
                         f"got {values['RANK']}")
    # one single-threaded process per core on this machine (--nproc_per_node)
    check_local_processes(values["LOCAL_WORLD_SIZE"], "--nproc_per_node")
    return values["WORLD_SIZE"]


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Sizes and counts must be >= 1 and the corpus must hold one window."""
    for name in ("steps", "batch_size", "T", "d_model", "n_layers", "corpus_bytes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    return args


def main() -> None:
    args = parse_args()
    world_size = check_environment(os.environ)
    check_shardable(args.batch_size, world_size)  # before anyone waits
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))  # from env vars
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        model_config, train_config, ids, variant = setup(args)
        result = train_replica(model_config, train_config, ids, args.batch_size, args.T,
                               variant, progress=rank == 0)
        print(f"rank {rank} of {world_size} (local rank {os.environ.get('LOCAL_RANK')}): "
              f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} on its "
              f"{args.batch_size // world_size} rows, {result.seconds:.2f} s in the loop",
              flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            save_result(result, args.out / f"rank{rank}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
