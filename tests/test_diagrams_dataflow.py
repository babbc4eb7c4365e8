"""tfbook.diagrams.dataflow: which tensor was computed from which, and the drawings' arrows held
against it. Every diagram of the book has its arrows checked when it is drawn: a wrong arrow
(V into the softmax, queries producing keys) is refused, and so is a missing one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tfbook.attention
from tfbook.attention import MultiHeadAttention
from tfbook.cache import LayerCache
from tfbook.diagrams import cross_attention, trace
from tfbook.diagrams.dataflow import Dataflow, Recorder, check_edges, dataflow
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama

IDX = torch.tensor([list(b"The cat s")])  # (1, 9)


def gpt(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(replace(GPTConfig.tiny(), **changes)).eval()


def test_a_forward_pass_as_named_tensors() -> None:
    flow = dataflow(gpt(), IDX)
    a = "blocks.0.attn"
    # attention inside: scores from q and k, weights from the scores, the output from weights and v
    assert flow.sources(f"{a}.scores") == {f"{a}.q", f"{a}.k"}
    assert flow.sources(f"{a}.heads") == {f"{a}.weights", f"{a}.v"}
    assert flow.depends(f"{a}.weights", f"{a}.k") and not flow.depends(f"{a}.weights", f"{a}.v")
    assert not flow.depends(f"{a}.k", f"{a}.q")  # the queries make no keys
    # the modules in order: positions are added to the token embedding, then the blocks
    assert flow.sources("tok_emb") == {"idx"} and "tok_emb" in flow.sources("pos_emb")
    assert flow.depends("lm_head", "blocks.1") and flow.depends("blocks.1", "blocks.0")
    assert not flow.depends("blocks.0", "blocks.1")
    # several names of one tensor: a module's input is the output that feeds it
    assert flow.vertex("blocks.1:x") == flow.vertex("blocks.0")
    assert flow.vertex("output") == flow.vertex("lm_head")
    # the activation function of the FFN, a plain function, gets a name of its own
    assert flow.sources("blocks.0.ff.act") == {"blocks.0.ff.fc_in"}


def test_the_cache_carries_keys_from_one_pass_to_the_next() -> None:
    torch.manual_seed(0)
    model = GPT(tiny_llama()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 5))
    cache = model.new_cache(6)
    with torch.no_grad(), Recorder(model) as rec:
        rec.prefix = "prefill."
        model(prompt, cache=cache)
        rec.prefix = "decode."
        model(prompt[:, -1:], cache=cache)
    flow = rec.flow
    a = "blocks.0.attn"
    # the decode step's keys are the cache's: this step's new key and the prompt's keys
    assert flow.depends(f"decode.{a}.keys", f"decode.{a}.k")
    assert flow.depends(f"decode.{a}.keys", f"prefill.{a}.k")
    assert flow.depends(f"decode.{a}.weights", f"prefill.{a}.k")
    assert not flow.depends(f"decode.{a}.k", f"decode.{a}.q")


def test_check_edges_refuses_wrong_and_missing_arrows() -> None:
    flow = dataflow(gpt(), IDX)
    a = "blocks.0.attn"
    right = [(f"{a}.q", f"{a}.scores"), (f"{a}.k", f"{a}.scores"),
             (f"{a}.scores", f"{a}.weights"), (f"{a}.weights", f"{a}.heads"),
             (f"{a}.v", f"{a}.heads")]
    check_edges(right, flow)
    with pytest.raises(ValueError, match=r"wrong: .*\.v -> .*\.weights \(.* is not computed"):
        check_edges(right + [(f"{a}.v", f"{a}.weights")], flow)  # V into the softmax
    with pytest.raises(ValueError, match=r"missing: blocks.0.attn.k -> blocks.0.attn.scores"):
        check_edges([e for e in right if e[0] != f"{a}.k"], flow, nodes=[f"{a}.k"])
    with pytest.raises(ValueError, match="only through blocks.0.attn.scores"):
        check_edges(right + [(f"{a}.q", f"{a}.weights")], flow)  # skips a shown tensor
    # a dependency left out on purpose, and two names of one tensor joined by an arrow
    check_edges([e for e in right if e[0] != f"{a}.k"], flow, nodes=[f"{a}.k"],
                omit=[(f"{a}.k", f"{a}.scores")])
    check_edges([("blocks.0", "blocks.1:x")], flow)


def test_the_old_wrong_wirings_are_refused() -> None:
    """The two figures the reading found wrong, as they were drawn, fail the check."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    flow = trace(mha, torch.randn(2, 3, 16), source=torch.randn(2, 7, 16)).flow
    # cross-attention: one "K, V" box feeding the softmax, V never reaching A V
    with pytest.raises(ValueError, match="wrong: v -> weights"):
        check_edges([("source", "k"), ("source", "v"), ("x", "q"), ("q", "weights"),
                     ("k", "weights"), ("v", "weights"), ("weights", "output")], flow)
    # the KV cache: ids -> queries -> new keys and values
    torch.manual_seed(0)
    model = GPT(tiny_llama()).eval()
    flow = dataflow(model, torch.randint(0, 256, (1, 6)))
    with pytest.raises(ValueError, match="wrong: blocks.0.attn.q -> blocks.0.attn.k"):
        check_edges([("idx", "blocks.0.attn.q"), ("blocks.0.attn.q", "blocks.0.attn.k")], flow)


def test_every_arrow_of_cross_attention_is_checked() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    d = cross_attention(trace(mha, torch.randn(2, 3, 16),
                              source=torch.randn(2, 7, 16)).attention(""))
    assert d.wired
    assert ("v", "heads") in d.edges and ("k", "weights") in d.edges
    assert not any(src == "v" and dst == "weights" for src, dst in d.edges)


def test_the_recorder_leaves_everything_as_it_found_it() -> None:
    model = gpt()
    plain_sdpa = tfbook.attention.scaled_dot_product_attention
    plain_update = LayerCache.update
    act = model.blocks[0].ff.act
    dataflow(model, IDX)
    attn = model.blocks[0].attn
    assert "split_heads" not in vars(attn) and not attn._forward_hooks
    assert not attn._forward_pre_hooks and not attn.out_proj._forward_pre_hooks
    assert tfbook.attention.scaled_dot_product_attention is plain_sdpa
    assert LayerCache.update is plain_update and model.blocks[0].ff.act is act
    # and the model computes what it computed before
    torch.testing.assert_close(model(IDX).logits, gpt()(IDX).logits, rtol=0, atol=0)


def test_bad_input() -> None:
    flow = dataflow(gpt(), IDX)
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        dataflow("model")
    with pytest.raises(TypeError, match="must be a Dataflow"):
        check_edges([], {"q": "k"})
    with pytest.raises(TypeError, match="source name, result name"):
        check_edges([("q",)], flow)
    with pytest.raises(ValueError, match="no tensor named 'blocks.0.attn.z'"):
        check_edges([("blocks.0.attn.q", "blocks.0.attn.z")], flow)
    with pytest.raises(ValueError, match="already given"):
        Dataflow().add("a", ()) and None or flow.add("idx", ())
    with pytest.raises(ValueError, match="no tensor of a call 'blocks.7'"):
        check_edges([("blocks.0", "blocks.1")], flow, within="blocks.7")
