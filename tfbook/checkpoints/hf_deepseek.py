"""A Hugging Face `DeepseekV3ForCausalLM` (every block dense, or every block a mixture of
experts) as a tfbook GPT with multi-head latent attention, for parity tests and the chapters.

DeepSeek-V3's decoder is a Llama-style one (RMSNorm, SwiGLU, RoPE, no biases) whose attention
is MLA (`tfbook.mla`, kv_lora_rank set in GPTConfig). Its attention weights keep Hugging
Face's names inside tfbook's block (`blocks.{i}.attn.kv_b_proj.weight`), so the name table
only moves them under `blocks.{i}.attn`. RoPE rotates the d_R-wide part in DeepSeek's
interleaved pairs (HF's rope_interleave=True) or in halves (False), with the angles in float32
as HF computes them.

Its mixture of experts is tfbook.moe's routing="sigmoid" (sigmoid scores, a bias that
steers the choice only, group-limited top-k, shared experts, a routed scaling factor).

What the converter refuses rather than approximates:
- dense and MoE blocks in one model (the released models' first_k_dense_replace = 3): one
  BlockConfig serves every block, so first_k_dense_replace must be 0 (all MoE) or at least
  num_hidden_layers (all dense); and norm_topk_prob=False (weights not renormalised);
- RoPE scaling (DeepSeek-V3's YaRN, whose mscale also multiplies the softmax scale);
- attention biases (HF's attention_bias puts biases in attention only, GPTConfig's `bias`
  everywhere), and key/value heads other than the query heads;
- an rms_norm_eps other than 1e-6: HF's two latent RMSNorms keep eps = 1e-6 whatever the
  config says, and GPTConfig has one norm_eps for every norm.
"""

from dataclasses import replace
from typing import Any

import torch

from tfbook.checkpoints.hf_llama import load_converted, split_hf_experts
from tfbook.checkpoints.names import expand_names
from tfbook.models.gpt import GPT, GPTConfig

# Hugging Face DeepseekV3ForCausalLM name -> tfbook GPT name; "{i}" stands for the layer number.
ATTENTION_NAMES = ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                   "kv_a_layernorm", "kv_b_proj", "o_proj")  # the same in both (tfbook.mla)
HF_TO_TFBOOK: dict[str, str] = {
    "model.embed_tokens.weight": "tok_emb.weight",
    "model.layers.{i}.input_layernorm.weight": "blocks.{i}.norm1.weight",
    **{f"model.layers.{{i}}.self_attn.{name}.weight": f"blocks.{{i}}.attn.{name}.weight"
       for name in ATTENTION_NAMES},
    "model.layers.{i}.post_attention_layernorm.weight": "blocks.{i}.norm2.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blocks.{i}.ff.fc_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blocks.{i}.ff.fc_in.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blocks.{i}.ff.fc_out.weight",
    "model.layers.{i}.mlp.gate.weight": "blocks.{i}.ff.router.weight",  # MoE blocks
    "model.layers.{i}.mlp.gate.e_score_correction_bias": "blocks.{i}.ff.score_bias",
    **{f"model.layers.{{i}}.mlp.shared_experts.{theirs}.weight": f"blocks.{{i}}.ff.shared.{ours}"
       ".weight" for theirs, ours in (("gate_proj", "fc_gate"), ("up_proj", "fc_in"),
                                      ("down_proj", "fc_out"))},
    "model.norm.weight": "norm_f.weight",
    "lm_head.weight": "lm_head.weight",
}

LATENT_NORM_EPS = 1e-6  # HF's q_a_layernorm and kv_a_layernorm: DeepseekV3RMSNorm's default


def config_from_hf_deepseek_v3(hf_config: Any, max_len: int | None = None) -> GPTConfig:
    """The GPTConfig of a Hugging Face DeepseekV3Config whose blocks are all dense."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type != "deepseek_v3":
        raise ValueError(f"expected a config of model_type 'deepseek_v3', got {model_type!r}")
    n_layers, dense = hf_config.num_hidden_layers, hf_config.first_k_dense_replace
    if 0 < dense < n_layers:
        raise ValueError(
            f"one BlockConfig serves every block: first_k_dense_replace={dense} makes layers "
            f"0..{dense - 1} dense and {dense}..{n_layers - 1} mixtures of experts; set it to 0 "
            f"(every block MoE) or >= num_hidden_layers ({n_layers}, every block dense)")
    ffn: dict[str, Any] = dict(ffn="swiglu", d_ff=hf_config.intermediate_size)
    if dense == 0:  # every block a mixture of experts (DeepSeek-V3's MoE, tfbook.moe)
        if not hf_config.norm_topk_prob:
            raise ValueError("expected norm_topk_prob=True (the k weights renormalised, as "
                             "DeepSeek-V3), got False")
        ffn = dict(ffn="moe", d_ff=hf_config.moe_intermediate_size,
                       n_experts=hf_config.n_routed_experts,
                       top_k=hf_config.num_experts_per_tok, routing="sigmoid",
                       n_expert_groups=hf_config.n_group, top_groups=hf_config.topk_group,
                       n_shared_experts=hf_config.n_shared_experts,
                       routed_scaling=float(hf_config.routed_scaling_factor))
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only plain RoPE is supported, got rope_type={rope.get('rope_type')!r}")
    if hf_config.num_key_value_heads != hf_config.num_attention_heads:
        raise ValueError(f"MLA has one latent for all heads: expected num_key_value_heads = "
                         f"num_attention_heads = {hf_config.num_attention_heads}, got "
                         f"{hf_config.num_key_value_heads}")
    if getattr(hf_config, "attention_bias", False):
        raise ValueError("expected a model without attention biases (attention_bias=False): "
                         "GPTConfig's bias would put biases in the feed-forward layers too")
    if hf_config.rms_norm_eps != LATENT_NORM_EPS:
        raise ValueError(f"expected rms_norm_eps={LATENT_NORM_EPS} (the eps of HF's latent "
                         f"norms, whatever the config says; GPTConfig has one norm_eps), got "
                         f"{hf_config.rms_norm_eps}")
    if hf_config.hidden_act != "silu":
        raise ValueError(f"expected hidden_act='silu' (SwiGLU), got {hf_config.hidden_act!r}")
    return GPTConfig(
        vocab_size=hf_config.vocab_size, max_len=max_len or hf_config.max_position_embeddings,
        n_layers=n_layers, d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads, dropout=0.0,
        activation="silu", bias=False, tie_weights=bool(hf_config.tie_word_embeddings),
        norm="rms", norm_eps=hf_config.rms_norm_eps, position="rope",
        rope_base=float(rope.get("rope_theta", 10000.0)),
        rope_convention="interleaved" if hf_config.rope_interleave else "half",
        rope_precision="float32", kv_lora_rank=hf_config.kv_lora_rank,
        q_lora_rank=hf_config.q_lora_rank, qk_nope_head_dim=hf_config.qk_nope_head_dim,
        qk_rope_head_dim=hf_config.qk_rope_head_dim, v_head_dim=hf_config.v_head_dim,
        **ffn,
    )


@torch.no_grad()
def tfbook_from_hf_deepseek_v3(
    hf_model: Any, *, attention: str = "torch", mla_absorbed: bool = False,
) -> GPT:
    """A tfbook GPT holding a copy of `hf_model`'s weights (strict: every tensor must fit).

    `attention` names the attention kernel ("reference" or "torch": MLA's values are not as
    wide as its keys) and `mla_absorbed` picks MLA's absorbed form (GPTConfig's fields).
    """
    config = replace(config_from_hf_deepseek_v3(hf_model.config), attention=attention,
                     mla_absorbed=mla_absorbed)
    model = GPT(config).eval()
    names = expand_names(HF_TO_TFBOOK, config.n_layers)
    hf_state, expert_state = split_hf_experts(dict(hf_model.state_dict()))
    unknown = sorted(set(hf_state) - set(names))
    if unknown:
        raise ValueError(f"tensors the name table does not explain: {unknown[:3]}")
    state = {names[key]: tensor for key, tensor in hf_state.items()
             if tensor.numel() > 0}  # n_shared_experts=0: HF keeps empty shared experts
    load_converted(model, {**state, **expert_state})
    return model.to(next(hf_model.parameters()).dtype)
