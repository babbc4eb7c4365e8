"""Any Hugging Face `LlamaForCausalLM` as a tfbook GPT, for parity tests and the chapters;
also its relatives `Qwen3ForCausalLM` (QK-norm) and `MistralForCausalLM` (sliding window),
which keep Llama's names and add one setting each. A RoPE scaling in the config's
rope_parameters ("linear", "dynamic", "yarn", "llama3") becomes GPTConfig.rope_scaling.

Hugging Face's port of LLaMA keeps the rows of W_Q and W_K permuted so that RoPE rotates the
two halves of each head (features i and i + D/2), and computes the rotary angles in float32.
The tfbook model built here does the same (rope_convention="half", rope_precision="float32"),
so the two compute the same numbers operation for operation. One visible table maps the names.
"""

import math
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tfbook.checkpoints.names import expand_names
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import llama_config
from tfbook.rope_scaling import ROPE_SCALING_TYPES

# Hugging Face LlamaForCausalLM name -> tfbook GPT name; "{i}" stands for the layer number.
HF_TO_TFBOOK: dict[str, str] = {
    "model.embed_tokens.weight": "tok_emb.weight",
    "model.layers.{i}.input_layernorm.weight": "blocks.{i}.norm1.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blocks.{i}.attn.q_proj.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blocks.{i}.attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blocks.{i}.attn.v_proj.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blocks.{i}.attn.out_proj.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "blocks.{i}.attn.q_norm.weight",  # Qwen3
    "model.layers.{i}.self_attn.k_norm.weight": "blocks.{i}.attn.k_norm.weight",  # Qwen3
    "model.layers.{i}.post_attention_layernorm.weight": "blocks.{i}.norm2.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blocks.{i}.ff.fc_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blocks.{i}.ff.fc_in.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blocks.{i}.ff.fc_out.weight",
    "model.layers.{i}.mlp.gate.weight": "blocks.{i}.ff.router.weight",  # Mixtral's router
    "model.norm.weight": "norm_f.weight",
    "lm_head.weight": "lm_head.weight",  # the same tensor as the embedding when tied
}

HF_MODEL_TYPES = ("llama", "mistral", "qwen3", "mixtral")  # the families config_from_hf_llama reads


def rope_settings_from_hf(hf_config: Any) -> tuple[float, dict | None]:
    """(rope_base, rope_scaling) of a Hugging Face config's rope_parameters (or rope_scaling).

    rope_scaling is None for rope_type "default", else a GPTConfig.rope_scaling dict that
    computes what HF computes: "dynamic" stretches from HF's max_position_embeddings, which
    becomes original_max_position_embeddings; YaRN without a factor takes HF's
    max_position_embeddings / original_max_position_embeddings; settings HF reads as absent
    (None, and YaRN's beta_fast, beta_slow, mscale, mscale_all_dim when 0) are left out.
    """
    rope = dict(getattr(hf_config, "rope_parameters", None)
                or getattr(hf_config, "rope_scaling", None) or {})
    base = rope.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    rope.pop("type", None)
    partial = rope.pop("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(f"expected RoPE on the whole head (partial_rotary_factor=1.0), got "
                         f"partial_rotary_factor={partial!r}")
    if rope_type == "default":
        return float(base), None
    if rope_type not in ROPE_SCALING_TYPES:
        raise ValueError(f"expected rope_type 'default' or one of {ROPE_SCALING_TYPES}, got "
                         f"{rope_type!r}")
    absent_when_zero = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
    settings = {"rope_type": rope_type, **{
        k: v for k, v in rope.items()
        if v is not None and not (rope_type == "yarn" and k in absent_when_zero and not v)}}
    if rope_type == "dynamic":  # HF's dynamic NTK stretches from max_position_embeddings
        settings["original_max_position_embeddings"] = hf_config.max_position_embeddings
    if rope_type == "yarn" and "factor" not in settings and settings.get(
            "original_max_position_embeddings"):
        settings["factor"] = (hf_config.max_position_embeddings
                              / settings["original_max_position_embeddings"])
    return float(base), settings


def config_from_hf_llama(hf_config: Any, max_len: int | None = None) -> GPTConfig:
    """The GPTConfig of a Hugging Face LlamaConfig, in HF's RoPE layout and precision.

    Its RoPE scaling too (`rope_settings_from_hf`). max_len defaults to HF's
    max_position_embeddings, except for "dynamic", where that is the length the stretching
    starts from: there it defaults to factor times it.
    """
    base, rope_scaling = rope_settings_from_hf(hf_config)
    if max_len is None and rope_scaling is not None and rope_scaling["rope_type"] == "dynamic":
        max_len = math.ceil(rope_scaling["factor"] * hf_config.max_position_embeddings)
    model_type = getattr(hf_config, "model_type", "llama")
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"expected a config of model_type in {HF_MODEL_TYPES}, got "
                         f"{model_type!r}")
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim == hf_config.hidden_size / hf_config.num_attention_heads:
        head_dim = None  # the usual D = C / H
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise ValueError("expected a model without biases (attention_bias=mlp_bias=False)")
    window, experts = None, {}
    if model_type == "mixtral":
        experts = dict(n_experts=hf_config.num_local_experts,
                       top_k=hf_config.num_experts_per_tok)
    if model_type in ("mistral", "mixtral"):
        window = hf_config.sliding_window
    elif model_type == "qwen3" and getattr(hf_config, "use_sliding_window", False):
        raise ValueError("Qwen3 with use_sliding_window=True (windows in some layers only) "
                         "is not supported: one window serves every block here")
    config = llama_config(
        vocab_size=hf_config.vocab_size,
        max_len=max_len or hf_config.max_position_embeddings,
        n_layers=hf_config.num_hidden_layers, d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads, n_kv_heads=hf_config.num_key_value_heads,
        d_ff=hf_config.intermediate_size, rope_base=float(base), norm_eps=hf_config.rms_norm_eps,
        tie_weights=bool(hf_config.tie_word_embeddings), rope_convention="half",
        rope_precision="float32", qk_norm=model_type == "qwen3", sliding_window=window,
        head_dim=head_dim,
        **experts,
    )
    return config if rope_scaling is None else replace(config, rope_scaling=rope_scaling)


def split_hf_experts(
    hf_state: dict[str, Tensor],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(the other HF tensors, Mixtral's experts under tfbook's names): the experts are stored
    fused per layer (gate_up_proj (E, 2F, C) = [W_gate; W_1] of every expert, down_proj
    (E, C, F)); tfbook holds one SwiGLU per expert."""
    rest, out = {}, {}
    for name, tensor in hf_state.items():
        prefix, _, kind = name.rpartition(".mlp.experts.")
        if not prefix:
            rest[name] = tensor
            continue
        layer = prefix.rsplit(".", 1)[-1]
        for e, weight in enumerate(tensor):
            ff = f"blocks.{layer}.ff.experts.{e}"
            if kind == "gate_up_proj":
                gate, value = weight.chunk(2, dim=0)  # (F, C) each
                out[f"{ff}.fc_gate.weight"], out[f"{ff}.fc_in.weight"] = gate, value
            elif kind == "down_proj":
                out[f"{ff}.fc_out.weight"] = weight
            else:
                raise ValueError(f"an expert tensor the converter does not know: {name}")
    return rest, out


def rename_hf_llama(hf_state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """HF names -> tfbook names through HF_TO_TFBOOK; any name it does not explain is an error."""
    names = expand_names(HF_TO_TFBOOK, n_layers)
    unknown = sorted(set(hf_state) - set(names))
    if unknown:
        raise ValueError(f"tensors the name table does not explain: {unknown[:3]}")
    return {names[key]: tensor for key, tensor in hf_state.items()}


@torch.no_grad()
def tfbook_from_hf_llama(
    hf_model: Any, *, attention: str = "torch", fused_activation: bool = True,
    max_len: int | None = None,
) -> GPT:
    """A tfbook GPT holding a copy of `hf_model`'s weights (strict: every tensor must fit).

    `attention` names the attention kernel and `fused_activation` picks torch's SiLU or ours
    (GPTConfig's fields of the same names; RMSNorm is always our code); `max_len` as in
    `config_from_hf_llama`.
    """
    config = replace(config_from_hf_llama(hf_model.config, max_len), attention=attention,
                     fused_activation=fused_activation)
    model = GPT(config).eval()
    rest, experts = split_hf_experts(dict(hf_model.state_dict()))
    load_converted(model, {**rename_hf_llama(rest, config.n_layers), **experts})
    return model.to(next(hf_model.parameters()).dtype)


def load_converted(model: GPT, state: dict[str, Tensor]) -> None:
    """Load `state` (tfbook names) into `model`, strictly: every tensor must fit, and with tied
    weights the embedding is the head (a stored lm_head.weight is dropped)."""
    if model.config.tie_weights:
        state = {name: t for name, t in state.items() if name != "lm_head.weight"}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) != {"lm_head.weight"}:
            raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    else:
        model.load_state_dict(state, strict=True)
