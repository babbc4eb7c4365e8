"""Parallelism past one replica per process (issue 27): each strategy a plain wrapper around a
`torch.nn.Module` or a `torch.optim.Optimizer`, usable inside a process group the caller set up
(gloo on CPU processes here), each checked against PyTorch's own implementation and one process.

- `ddp`: data parallelism whose gradient buckets are all-reduced while the backward pass runs;
- `zero`: a sharded optimizer (ZeRO stage 1);
- `fsdp`: fully sharded data parallelism (parameters, gradients and optimizer state sharded);
- `tensor`: tensor parallelism (column- then row-split MLP, attention split by heads);
- `pipeline`: pipeline parallelism (GPipe and 1F1B schedules);
- `ring`: context parallelism, ring attention with a zig-zag causal load balance.
"""
