"""Tensor parallelism (tfbook.parallel.tensor): two gloo processes, each holding half of every
big matrix of a block, compute what the unsplit block computes.

One launch runs every scenario (float64): the full block on one rank's copy of the weights,
then each rank's shard on the same input; the outputs, the input's gradient and every
parameter gradient (the shard's slice of the full one) agree within 2^-40 relative to the
largest value (only the order of the sums in the split products differs). The collectives
counted per block: 2 all-reduces forward, 2 backward.
"""

import pytest
import torch

from tests.parallel_launch import run_in_group  # one launch, results per rank
from tfbook.blocks import BlockConfig, SelfAttentionBlock
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.parallel.tensor import (
    CollectiveCount,
    check_tensor_parallel,
    shard_index,
    tensor_parallel_block,
    tensor_parallel_model,
)

TOL = 2.0**-40
CONFIGS = {
    "gpt": BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.0, norm_first=True,
                       activation="gelu"),
    "llama": BlockConfig(d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, dropout=0.0,
                         norm_first=True, norm="rms", ffn="swiglu", activation="silu",
                         bias=False, rope_base=10000.0, attention="reference"),
    "post_ln": BlockConfig(d_model=16, n_heads=2, d_ff=16, dropout=0.0, norm_first=False),
    "window": BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.0, norm_first=True,
                          sliding_window=3, rope_base=100.0),
}


def _scenario(name: str, config: BlockConfig, rank: int) -> dict:
    torch.manual_seed(0)
    block = SelfAttentionBlock(config).double()  # every rank builds the same full block
    x = torch.randn(2, 7, config.d_model, dtype=torch.float64)
    seed = torch.randn(2, 7, config.d_model, dtype=torch.float64)  # dL/dy
    x_full = x.clone().requires_grad_()
    y_full, _ = block(x_full, causal=True)
    y_full.backward(seed)
    shard = tensor_parallel_block(block)
    x_shard = x.clone().requires_grad_()
    with CollectiveCount() as count:
        y_shard, _ = shard(x_shard, causal=True)
        forward_count = count.forward
        y_shard.backward(seed)
    params = dict(shard.named_parameters())
    grads = {}
    for full_name, p in block.named_parameters():
        shard_name, where = shard_index(block, rank, 2)[full_name]
        grads[full_name] = (p.grad[where], params[shard_name].grad, tuple(params[shard_name].shape))
    n_full = sum(p.numel() for p in block.parameters())
    n_shard = sum(p.numel() for p in shard.parameters())
    return {"y": (y_full.detach(), y_shard.detach()), "dx": (x_full.grad, x_shard.grad),
            "grads": grads, "forward": forward_count, "backward": count.backward,
            "shapes": count.shapes, "n_full": n_full, "n_shard": n_shard,
            "block_unchanged": sum(p.numel() for p in block.parameters()) == n_full}


GPT_CONFIG = GPTConfig(max_len=8, vocab_size=64, n_layers=3, n_heads=4, d_model=16)


def _model_scenario(rank: int) -> dict:
    """The whole GPT (tied embedding, 3 blocks) with every block split."""
    torch.manual_seed(1)
    model = GPT(GPT_CONFIG).double()
    idx = torch.randint(0, 64, (2, 8))
    targets = torch.randint(0, 64, (2, 8))
    out = model(idx, targets)
    out.loss.backward()
    shard = tensor_parallel_model(model)
    with CollectiveCount() as count:
        shard_out = shard(idx, targets)
        forward_count = count.forward
        shard_out.loss.backward()
    full = {n: p.grad for n, p in model.named_parameters()}
    grads = {}
    for n, p in shard.named_parameters():
        if n.startswith("blocks."):
            _, i, rest = n.split(".", 2)
            full_rest = rest.replace(".inner.", ".")
            _, where = shard_index(model.blocks[int(i)], rank, 2)[full_rest]
            grads[n] = (full[f"blocks.{i}.{full_rest}"][where], p.grad)
        else:
            grads[n] = (full[n], p.grad)
    return {"logits": (out.logits.detach(), shard_out.logits.detach()), "grads": grads,
            "forward": forward_count, "backward": count.backward}


def _run(rank: int, world_size: int) -> dict:
    results = {name: _scenario(name, c, rank) for name, c in CONFIGS.items()}
    results["model"] = _model_scenario(rank)
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_in_group(_run, tmp_path_factory.mktemp("tensor"))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOL * max(
        1.0, float(a.abs().max()))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_output_and_gradients_equal_the_unsplit_block(results: list[dict], name: str) -> None:
    for rank in range(2):
        r = results[rank][name]
        assert _close(*r["y"]), name
        assert _close(*r["dx"]), name
        for param, (full, shard, _) in r["grads"].items():
            assert _close(full, shard), (name, rank, param)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_collectives_forward_two_backward(results: list[dict], name: str) -> None:
    for rank in range(2):
        r = results[rank][name]
        assert (r["forward"], r["backward"]) == (2, 2)
        # every all-reduce carries one (B, T, C) activation or its gradient
        assert {shape for _, shape in r["shapes"]} == {(2, 7, CONFIGS[name].d_model)}


def test_whole_gpt_split_equals_the_unsplit_gpt(results: list[dict]) -> None:
    for rank in range(2):
        r = results[rank]["model"]
        assert _close(*r["logits"])
        assert len(r["grads"]) == sum(1 for _ in GPT(GPT_CONFIG).parameters())
        for name, (full, shard) in r["grads"].items():
            assert _close(full, shard), (rank, name)
        # two per block each way
        assert (r["forward"], r["backward"]) == (2 * GPT_CONFIG.n_layers,) * 2


def test_each_rank_holds_its_half_of_the_big_matrices(results: list[dict]) -> None:
    for rank in range(2):
        grads = results[rank]["gpt"]["grads"]
        C, F = 16, 32
        assert grads["attn.q_proj.weight"][2] == (C // 2, C)
        assert grads["attn.out_proj.weight"][2] == (C, C // 2)
        assert grads["attn.out_proj.bias"][2] == (C,)  # added once, after the all-reduce
        assert grads["ff.fc_in.weight"][2] == (F // 2, C)
        assert grads["ff.fc_out.weight"][2] == (C, F // 2)
        r = results[rank]["gpt"]
        matrices = 4 * C * C + 2 * C * F
        assert r["n_full"] - r["n_shard"] == matrices // 2 + (3 * C + F) // 2
    # the two ranks' halves differ (they hold different heads)
    a, b = (results[r]["gpt"]["grads"]["attn.q_proj.weight"][1] for r in range(2))
    assert not torch.equal(a, b)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of world_size=3"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, d_ff=36, dropout=0.0), 3)
    with pytest.raises(ValueError, match="d_ff=30 must be a multiple of world_size=4"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, d_ff=30, dropout=0.0), 4)
    with pytest.raises(ValueError, match="n_kv_heads=1 must be a multiple"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, n_kv_heads=1, d_ff=32,
                                          dropout=0.0), 2)
    with pytest.raises(ValueError, match="dropout 0"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.1), 2)
    with pytest.raises(ValueError, match="QK-norm"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.0,
                                          qk_norm=True), 2)
    with pytest.raises(ValueError, match="ffn='moe'"):
        check_tensor_parallel(BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.0,
                                          ffn="moe"), 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        check_tensor_parallel(CONFIGS["gpt"], 0)
    with pytest.raises(TypeError, match="must be a BlockConfig or a GPTConfig"):
        check_tensor_parallel({"n_heads": 4}, 2)
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of world_size=3"):
        check_tensor_parallel(GPT_CONFIG, 3)
    check_tensor_parallel(GPT_CONFIG, 2)  # splits: nothing raised
    block = SelfAttentionBlock(CONFIGS["gpt"])
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of world_size=3"):
        tensor_parallel_block(block, rank=0, world_size=3)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        tensor_parallel_block(block, rank=2, world_size=2)
    with pytest.raises(RuntimeError, match="inside a process group"):
        tensor_parallel_block(block)
    with pytest.raises(TypeError, match="must be a tfbook.blocks.SelfAttentionBlock"):
        tensor_parallel_block(torch.nn.Linear(2, 2), rank=0, world_size=2)
    with pytest.raises(ValueError, match="dropout 0"):
        tensor_parallel_block(SelfAttentionBlock(BlockConfig(d_model=16, n_heads=4, d_ff=32)),
                              rank=0, world_size=2)
    with pytest.raises(ValueError, match="dropout 0"):
        tensor_parallel_model(GPT(GPTConfig(max_len=8, vocab_size=64, n_layers=1, n_heads=4,
                                        d_model=16, dropout=0.1)),
            rank=0, world_size=2)
    with pytest.raises(TypeError, match="nn.ModuleList `blocks`"):
        tensor_parallel_model(torch.nn.Linear(2, 2), rank=0, world_size=2)
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of world_size=3"):
        tensor_parallel_model(GPT(GPT_CONFIG), rank=0, world_size=3)
    # a shard made with an explicit rank, run outside a process group: tfbook's error
    one = tensor_parallel_block(block, rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="runs inside a process group"):
        one(torch.randn(1, 3, 16))
