"""Released model families as data: the configs of real models, their sizes and caches.

Each `Released` record holds the settings of one released model as its config.json on the
Hugging Face Hub gives them (configs only, no weights), with the address of that file and
the paper that describes the model. From those settings alone this module computes

- `parameter_count`: every parameter, by formula (embedding, attention, norms, feed-forward
  or experts, output layer); `active_parameter_count`: those one token uses (a mixture of
  experts runs top_k of its n_experts routed experts, and all of its shared ones);
- `kv_bytes_per_token`: what the cache keeps per token, per layer or for the whole model:

      multi-head attention (MHA)       2 H D          numbers per token and layer
      grouped-query attention (GQA)    2 H_kv D
      multi-head latent attention      r + d_R        (the latent and the shared RoPE key)

  and `kv_cache_bytes(model, context)`, which caps the positions at the window for a
  sliding-window model (the cache keeps window - 1 earlier positions; the new token's own
  key and value make the window's last one).

`hf_config` and `hf_on_meta` build the same model as a Hugging Face class on PyTorch's meta
device (shapes, no memory), which the tests and the chapter count against the formulas;
`gpt_config` gives the `GPTConfig` of the models that tfbook's one block expresses.
`tiny_hf_family` builds a tiny random Hugging Face model of one family and `family_max_error`
compares it with tfbook's block loaded from it (book/generation/model_families.md).

Shape legend: L layers, C width, H query heads, H_kv key/value heads, D head size, F
feed-forward width, V vocabulary, E routed experts, k experts per token, r kv_lora_rank,
d_R qk_rope_head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from tfbook.config import is_int
from tfbook.mla import kv_cache_bytes_per_token
from tfbook.models.gpt import GPTConfig
from tfbook.models.llama import llama_config
from tfbook.moe import ROUTINGS
from tfbook.rope_scaling import RopeScaling

HF = "https://huggingface.co/{}/blob/main/config.json"
ATTENTIONS = ("mha", "gqa", "mla")
FFNS = ("mlp", "swiglu", "moe")


@dataclass(frozen=True)
class Released:
    """One released model's settings, named as tfbook names them (the HF name in comments)."""

    name: str  # the model's name as released
    repo: str  # its Hugging Face repository, whose config.json these values come from
    cite: str  # key in book/references.bib of the paper describing it
    hf_class: str  # the transformers class that builds it
    vocab_size: int  # V (vocab_size)
    n_layers: int  # L (num_hidden_layers / n_layer)
    d_model: int  # C (hidden_size / n_embd)
    n_heads: int  # H (num_attention_heads)
    n_kv_heads: int  # H_kv (num_key_value_heads); H for MHA and for MLA
    head_size: int  # D (head_dim); for MLA the value head size v_head_dim
    d_ff: int  # F (intermediate_size): the dense feed-forward width
    max_len: int  # max_position_embeddings
    tie_weights: bool  # tie_word_embeddings
    norm_eps: float  # rms_norm_eps / layer_norm_epsilon
    rope_base: float | None = None  # rope_theta; None: learned positions (GPT-2)
    rope_scaling: RopeScaling | None = None  # rope_scaling (Llama 3.1, DeepSeek)
    norm: str = "rms"  # "layer" (GPT-2) or "rms"
    ffn: str = "swiglu"  # "mlp", "swiglu" or "moe"
    bias: bool = False  # biases in the linear layers and norms (GPT-2)
    qk_norm: bool = False  # RMSNorm on each query and key head (Qwen3)
    sliding_window: int | None = None  # sliding_window (Mistral-7B-v0.1)
    n_experts: int | None = None  # E routed experts (num_local_experts / n_routed_experts)
    top_k: int | None = None  # k (num_experts_per_tok)
    n_shared_experts: int = 0  # experts every token uses (DeepSeek)
    expert_d_ff: int | None = None  # width of one expert (moe_intermediate_size); None: d_ff
    dense_layers: int = 0  # the first layers keep a dense SwiGLU (first_k_dense_replace)
    routing: str = "renormalised"  # tfbook.moe's name for how the k weights are formed
    n_expert_groups: int = 1  # n_group: the experts' groups (DeepSeek-V3's router)
    top_groups: int = 1  # topk_group: the groups a token's experts may come from
    routed_scaling: float = 1.0  # routed_scaling_factor: a factor on the routed weights
    kv_lora_rank: int | None = None  # r, MLA's latent width; None: not MLA
    q_lora_rank: int | None = None  # MLA's query latent width; None: a full query matrix
    qk_nope_head_dim: int | None = None  # d_N, MLA's query/key part without RoPE
    qk_rope_head_dim: int | None = None  # d_R, MLA's decoupled RoPE key, shared by all heads
    note: str = ""  # what does not fit tfbook's one block, if anything

    def __post_init__(self) -> None:
        owner = f"Released({self.name!r})"
        for f in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_size",
                  "d_ff", "max_len"):
            _positive(owner, f, getattr(self, f))
        for f in ("sliding_window", "n_experts", "top_k", "expert_d_ff", "kv_lora_rank",
                  "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
            if getattr(self, f) is not None:
                _positive(owner, f, getattr(self, f))
        for f in ("n_shared_experts", "dense_layers"):
            if not is_int(getattr(self, f)) or getattr(self, f) < 0:
                raise ValueError(f"{owner}: {f} must be an int >= 0, got {getattr(self, f)!r}")
        if self.norm not in ("layer", "rms"):
            raise ValueError(f"{owner}: norm must be 'layer' or 'rms', got {self.norm!r}")
        if self.ffn not in FFNS:
            raise ValueError(f"{owner}: ffn must be one of {FFNS}, got {self.ffn!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{owner}: n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.ffn == "moe":
            if self.n_experts is None or self.top_k is None:
                raise ValueError(f"{owner}: ffn='moe' needs n_experts and top_k")
            if self.top_k > self.n_experts:
                raise ValueError(f"{owner}: top_k={self.top_k} is more than "
                                 f"n_experts={self.n_experts}")
            if self.routing not in ROUTINGS:
                raise ValueError(f"{owner}: routing must be one of {ROUTINGS}, got "
                                 f"{self.routing!r}")
            if self.dense_layers > self.n_layers:
                raise ValueError(f"{owner}: dense_layers={self.dense_layers} is more than "
                                 f"n_layers={self.n_layers}")
        mla = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")
        given = [getattr(self, f) is not None for f in mla]
        if any(given) and not all(given):
            raise ValueError(f"{owner}: multi-head latent attention needs all of {mla}")
        if self.kv_lora_rank is not None and self.kv_lora_rank > self.d_model:
            raise ValueError(f"{owner}: kv_lora_rank={self.kv_lora_rank} is larger than the "
                             f"width d_model={self.d_model}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError(f"{owner}: rope_scaling must be a RopeScaling or None, got "
                            f"{type(self.rope_scaling).__name__}")

    @property
    def source(self) -> str:
        """The address of the config.json these settings were copied from."""
        return HF.format(self.repo)

    @property
    def attention(self) -> str:
        """'mla' with a latent, 'mha' when every query head has its own key/value head, else
        'gqa'."""
        if self.kv_lora_rank is not None:
            return "mla"
        return "mha" if self.n_kv_heads == self.n_heads else "gqa"

    @property
    def moe_layers(self) -> int:
        """Layers whose feed-forward is a mixture of experts."""
        return self.n_layers - self.dense_layers if self.ffn == "moe" else 0


def _positive(owner: str, name: str, value: object) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


def _yarn(factor: float, mscale: float) -> RopeScaling:
    """DeepSeek's YaRN setting: a context of 4,096 stretched 40 times."""
    return RopeScaling(rope_type="yarn", factor=factor, original_max_position_embeddings=4096,
                       beta_fast=32.0, beta_slow=1.0, mscale=mscale, mscale_all_dim=mscale)


RELEASED: dict[str, Released] = {r.name: r for r in (
    Released("GPT-2 small", "openai-community/gpt2", "radford2019language", "GPT2LMHeadModel",
             vocab_size=50257, n_layers=12, d_model=768, n_heads=12, n_kv_heads=12,
             head_size=64, d_ff=3072, max_len=1024, tie_weights=True, norm_eps=1e-5,
             norm="layer", ffn="mlp", bias=True),
    Released("Llama-2-7B", "meta-llama/Llama-2-7b-hf", "touvron2023llama2", "LlamaForCausalLM",
             vocab_size=32000, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32,
             head_size=128, d_ff=11008, max_len=4096, tie_weights=False, norm_eps=1e-5,
             rope_base=10000.0),
    Released("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "dubey2024llama", "LlamaForCausalLM",
             vocab_size=128256, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
             head_size=128, d_ff=14336, max_len=131072, tie_weights=False, norm_eps=1e-5,
             rope_base=500000.0,
             rope_scaling=RopeScaling(rope_type="llama3", factor=8.0,
                                      original_max_position_embeddings=8192,
                                      low_freq_factor=1.0, high_freq_factor=4.0)),
    Released("SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M", "allal2025smollm2",
             "LlamaForCausalLM", vocab_size=49152, n_layers=30, d_model=576, n_heads=9,
             n_kv_heads=3, head_size=64, d_ff=1536, max_len=8192, tie_weights=True,
             norm_eps=1e-5, rope_base=100000.0),
    Released("Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.1", "jiang2023mistral",
             "MistralForCausalLM", vocab_size=32000, n_layers=32, d_model=4096, n_heads=32,
             n_kv_heads=8, head_size=128, d_ff=14336, max_len=32768, tie_weights=False,
             norm_eps=1e-5, rope_base=10000.0, sliding_window=4096),
    Released("Qwen3-8B", "Qwen/Qwen3-8B", "yang2025qwen3", "Qwen3ForCausalLM",
             vocab_size=151936, n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8,
             head_size=128, d_ff=12288, max_len=40960, tie_weights=False, norm_eps=1e-6,
             rope_base=1000000.0, qk_norm=True),
    Released("Qwen3-0.6B", "Qwen/Qwen3-0.6B", "yang2025qwen3", "Qwen3ForCausalLM",
             vocab_size=151936, n_layers=28, d_model=1024, n_heads=16, n_kv_heads=8,
             head_size=128, d_ff=3072, max_len=40960, tie_weights=True, norm_eps=1e-6,
             rope_base=1000000.0, qk_norm=True,
             note="head_size 128 is not d_model / n_heads = 64: the queries are twice as wide "
                  "as the residual stream"),
    Released("Mixtral-8x7B", "mistralai/Mixtral-8x7B-v0.1", "jiang2024mixtral",
             "MixtralForCausalLM", vocab_size=32000, n_layers=32, d_model=4096, n_heads=32,
             n_kv_heads=8, head_size=128, d_ff=14336, max_len=32768, tie_weights=False,
             norm_eps=1e-5, rope_base=1000000.0, ffn="moe", n_experts=8, top_k=2),
    Released("DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite", "deepseekai2024v2",
             "DeepseekV2ForCausalLM", vocab_size=102400, n_layers=27, d_model=2048,
             n_heads=16, n_kv_heads=16, head_size=128, d_ff=10944, max_len=163840,
             tie_weights=False, norm_eps=1e-6, rope_base=10000.0, rope_scaling=_yarn(40.0, 0.707),
             ffn="moe", n_experts=64, top_k=6, n_shared_experts=2, expert_d_ff=1408,
             dense_layers=1, routing="unnormalised", kv_lora_rank=512,
             qk_nope_head_dim=128, qk_rope_head_dim=64,
             note="the first layer keeps a dense SwiGLU; routing weights are not renormalised"),
    Released("DeepSeek-V3", "deepseek-ai/DeepSeek-V3", "deepseekai2024v3",
             "DeepseekV3ForCausalLM", vocab_size=129280, n_layers=61, d_model=7168,
             n_heads=128, n_kv_heads=128, head_size=128, d_ff=18432, max_len=163840,
             tie_weights=False, norm_eps=1e-6, rope_base=10000.0, rope_scaling=_yarn(40.0, 1.0),
             ffn="moe", n_experts=256, top_k=8, n_shared_experts=1, expert_d_ff=2048,
             dense_layers=3, routing="sigmoid", n_expert_groups=8, top_groups=4,
             routed_scaling=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
             qk_rope_head_dim=64,
             note="sigmoid router scores with a per-expert bias (a buffer, not a parameter) and "
                  "experts chosen within 4 of 8 groups; a multi-token-prediction module "
                  "(num_nextn_predict_layers=1) that Hugging Face's class does not build"),
)}


def released(name: str) -> Released:
    """The record of a released model by its name (`RELEASED` lists them)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if name not in RELEASED:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(RELEASED)}")
    return RELEASED[name]


def _record(model: Released | str) -> Released:
    if isinstance(model, Released):
        return model
    return released(model)


def parameter_breakdown(model: Released | str) -> dict[str, int]:
    """Parameters by part, by formula from the config: embedding (and learned positions),
    attention, norms, feed-forward (dense and experts), output layer."""
    m = _record(model)
    C, H, D, F, L = m.d_model, m.n_heads, m.head_size, m.d_ff, m.n_layers
    norm = 2 * C if m.bias else C  # a gain per norm, and a bias where the model has biases
    if m.attention == "mla":
        d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            query = C * H * d_qk  # W_Q
        else:
            query = C * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * d_qk  # W_DQ, norm, W_UQ
        latent = C * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # W_DKV, W_KR, norm
        up = m.kv_lora_rank * H * (m.qk_nope_head_dim + D)  # W_UK and W_UV
        attention = query + latent + up + H * D * C  # + W_O
    else:
        attention = C * H * D + 2 * C * m.n_kv_heads * D + H * D * C  # q, k, v, out
        if m.bias:
            attention += H * D + 2 * m.n_kv_heads * D + C
        if m.qk_norm:
            attention += 2 * D  # one gain for the query heads, one for the key heads
    dense = 2 * C * F + (F + C if m.bias else 0) if m.ffn == "mlp" else 3 * C * F
    experts = 0
    if m.ffn == "moe":
        F_e = m.d_ff if m.expert_d_ff is None else m.expert_d_ff
        per_moe = C * m.n_experts + (m.n_experts + m.n_shared_experts) * 3 * C * F_e  # router
        experts = m.moe_layers * per_moe
    return {
        "embedding": m.vocab_size * C + (m.max_len * C if m.rope_base is None else 0),
        "attention": L * attention,
        "norms": (2 * L + 1) * norm,
        "feed-forward": (L - m.moe_layers) * dense + experts,
        "output layer": 0 if m.tie_weights else m.vocab_size * C,
    }


def parameter_count(model: Released | str) -> int:
    """All parameters of the released model, by formula (`parameter_breakdown` summed)."""
    return sum(parameter_breakdown(model).values())


def active_parameter_count(model: Released | str) -> int:
    """Parameters one token uses: a mixture of experts runs top_k of its n_experts routed
    experts (and every shared one); for a dense model, all of them."""
    m = _record(model)
    if m.ffn != "moe":
        return parameter_count(m)
    F_e = m.d_ff if m.expert_d_ff is None else m.expert_d_ff
    idle = m.moe_layers * (m.n_experts - m.top_k) * 3 * m.d_model * F_e
    return parameter_count(m) - idle


def kv_numbers_per_token(model: Released | str) -> tuple[int, str]:
    """(numbers, formula): what one layer's cache keeps per token, and how it is computed."""
    m = _record(model)
    if m.attention == "mla":
        r, d_R = m.kv_lora_rank, m.qk_rope_head_dim
        return r + d_R, f"r + d_R = {r} + {d_R}"
    if m.attention == "mha":
        return 2 * m.n_heads * m.head_size, f"2·H·D = 2·{m.n_heads}·{m.head_size}"
    return 2 * m.n_kv_heads * m.head_size, f"2·H_kv·D = 2·{m.n_kv_heads}·{m.head_size}"


def kv_bytes_per_token(model: Released | str, dtype: torch.dtype = torch.bfloat16,
                       whole_model: bool = True) -> int:
    """Bytes the cache keeps per token (`tfbook.mla.kv_cache_bytes_per_token` with this
    model's sizes), over every layer or (whole_model=False) for one layer."""
    m = _record(model)
    n_layers = m.n_layers if whole_model else 1
    if m.attention == "mla":
        return kv_cache_bytes_per_token("mla", dtype=dtype, n_layers=n_layers,
                                        kv_lora_rank=m.kv_lora_rank,
                                        qk_rope_head_dim=m.qk_rope_head_dim)
    return kv_cache_bytes_per_token(m.attention, dtype=dtype, n_layers=n_layers,
                                    n_heads=m.n_heads, n_kv_heads=m.n_kv_heads,
                                    head_size=m.head_size)


def cached_positions(model: Released | str, context: int) -> int:
    """Positions the cache holds after `context` tokens: all of them, or with a sliding window
    W the last W - 1 (the next token's own key and value complete its window)."""
    m = _record(model)
    _positive("cached_positions", "context", context)
    return context if m.sliding_window is None else min(context, m.sliding_window - 1)


def kv_cache_bytes(model: Released | str, context: int, dtype: torch.dtype = torch.bfloat16,
                   batch_size: int = 1) -> int:
    """Bytes of the whole cache after `context` tokens of each of `batch_size` sequences."""
    _positive("kv_cache_bytes", "batch_size", batch_size)
    return batch_size * cached_positions(model, context) * kv_bytes_per_token(model, dtype)


def hf_config(model: Released | str) -> Any:
    """The transformers config of the released model, from this record's values."""
    import transformers  # heavy, and only a reference: imported when asked for

    m = _record(model)
    if m.hf_class == "GPT2LMHeadModel":
        return transformers.GPT2Config(
            vocab_size=m.vocab_size, n_positions=m.max_len, n_embd=m.d_model,
            n_layer=m.n_layers, n_head=m.n_heads, n_inner=m.d_ff,
            layer_norm_epsilon=m.norm_eps, tie_word_embeddings=m.tie_weights)
    rope = {"rope_type": "default", "rope_theta": m.rope_base}
    if m.rope_scaling is not None:
        rope.update({f.name: getattr(m.rope_scaling, f.name) for f in fields(RopeScaling)
                     if getattr(m.rope_scaling, f.name) is not None})
    common = dict(vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.d_ff,
                  num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                  num_key_value_heads=m.n_kv_heads, max_position_embeddings=m.max_len,
                  rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tie_weights,
                  rope_parameters=rope)
    kind = m.hf_class.removesuffix("ForCausalLM")
    if kind in ("Llama", "Mistral", "Qwen3", "Mixtral"):
        common["head_dim"] = m.head_size
    if kind == "Mistral":
        common["sliding_window"] = m.sliding_window
    if kind == "Mixtral":
        common.update(num_local_experts=m.n_experts, num_experts_per_tok=m.top_k,
                      sliding_window=m.sliding_window)
    if kind.startswith("Deepseek"):
        common.update(
            n_routed_experts=m.n_experts, num_experts_per_tok=m.top_k,
            n_shared_experts=m.n_shared_experts, moe_intermediate_size=m.expert_d_ff,
            first_k_dense_replace=m.dense_layers, kv_lora_rank=m.kv_lora_rank,
            q_lora_rank=m.q_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
            qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.head_size,
            n_group=m.n_expert_groups, topk_group=m.top_groups,
            routed_scaling_factor=m.routed_scaling,
            norm_topk_prob=m.routing != "unnormalised")
    return getattr(transformers, f"{kind}Config")(**common)


def hf_on_meta(model: Released | str) -> nn.Module:
    """The released model as its Hugging Face class on the meta device: every parameter's
    shape, no memory and no weights (nothing is downloaded)."""
    import transformers

    m = _record(model)
    config = hf_config(m)
    with torch.device("meta"):
        return getattr(transformers, m.hf_class)(config)


def gpt_config(model: Released | str) -> GPTConfig:
    """The tfbook GPTConfig of the released model, where the one block expresses it; a
    ValueError says which setting it cannot express."""
    m = _record(model)
    if m.ffn == "moe" and 0 < m.dense_layers < m.n_layers:
        raise ValueError(f"{m.name}: its first {m.dense_layers} layer(s) are dense and the "
                         f"other {m.moe_layers} mixtures of experts, but one BlockConfig "
                         "serves every block")
    if m.attention == "mla" and m.rope_scaling is not None:
        raise ValueError(f"{m.name}: YaRN with latent attention also rescales the softmax "
                         "(mscale), which the block does not apply")
    if m.rope_base is None:  # GPT-2
        return GPTConfig(vocab_size=m.vocab_size, max_len=m.max_len, n_layers=m.n_layers,
                         n_heads=m.n_heads, d_model=m.d_model, d_ff=m.d_ff, norm_eps=m.norm_eps)
    moe = m.ffn == "moe"
    config = llama_config(
        vocab_size=m.vocab_size, max_len=m.max_len, n_layers=m.n_layers, d_model=m.d_model,
        n_heads=m.n_heads, n_kv_heads=m.n_kv_heads,
        d_ff=m.expert_d_ff if moe and m.expert_d_ff is not None else m.d_ff,
        rope_base=m.rope_base, norm_eps=m.norm_eps, tie_weights=m.tie_weights,
        qk_norm=m.qk_norm, sliding_window=m.sliding_window, n_experts=m.n_experts,
        top_k=2 if m.top_k is None else m.top_k, rope_convention="half",
        rope_precision="float32",
        head_dim=None if m.head_size * m.n_heads == m.d_model else m.head_size)
    changes: dict[str, Any] = {}
    if moe and (m.routing, m.n_expert_groups, m.top_groups, m.n_shared_experts,
                m.routed_scaling) != ("renormalised", 1, 1, 0, 1.0):
        changes.update(routing=m.routing, n_expert_groups=m.n_expert_groups,
                       top_groups=m.top_groups, n_shared_experts=m.n_shared_experts,
                       routed_scaling=m.routed_scaling)
    if m.attention == "mla":  # DeepSeek's RoPE turns adjacent pairs (rope_interleave)
        changes.update(n_kv_heads=None, head_dim=None, rope_convention="interleaved",
                       kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank,
                       qk_nope_head_dim=m.qk_nope_head_dim,
                       qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.head_size)
    if m.rope_scaling is not None:
        changes["rope_scaling"] = {f.name: getattr(m.rope_scaling, f.name)
                                   for f in fields(RopeScaling)
                                   if getattr(m.rope_scaling, f.name) is not None}
    return replace(config, **changes) if changes else config


# A tiny random Hugging Face model of each family, for the chapter's checks (the parity tests
# live in tests/test_model_families.py): 2 layers of width 32, 4 query heads of size 8 sharing
# 2 key/value heads, a vocabulary of 97 tokens.
TINY_HF = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
               eos_token_id=None, pad_token_id=None, initializer_range=0.2)
TINY_FAMILIES = ("llama", "qwen3", "mistral", "mixtral", "deepseek_v3")
# DeepSeek-V3's attention and experts in miniature: latents of 16 (queries 24), 4 + 4 wide
# query/key parts, values of 8; 8 experts of width 24 in 4 groups, 2 per token from the best
# 2 groups, 1 shared expert, the routed weights scaled by 2.5; every block a MoE
TINY_DEEPSEEK = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                     qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8,
                     moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2,
                     n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
                     norm_topk_prob=True, first_k_dense_replace=0, rms_norm_eps=1e-6)


def random_norm_gains(hf_model: nn.Module, seed: int = 1) -> nn.Module:
    """Every norm gain of a Hugging Face model drawn from 1 + 0.5 N(0, 1) (HF starts them at
    one, which would hide a converter that drops a gain); -> the model, in eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
    return hf_model.eval()


def tiny_hf_family(family: str, *, window: int = 4, n_experts: int = 4, top_k: int = 2,
                   rope_scaling: dict | None = None, seed: int = 0) -> nn.Module:
    """A tiny random `LlamaForCausalLM` ("llama"), `Qwen3ForCausalLM` ("qwen3"),
    `MistralForCausalLM` with a sliding window ("mistral"), `MixtralForCausalLM`
    ("mixtral") or `DeepseekV3ForCausalLM` ("deepseek_v3": `TINY_DEEPSEEK`), in eval mode,
    with HF's sdpa attention and random norm gains (HF starts them at one, which would hide a
    missing gain) and, for DeepSeek, random router biases. `rope_scaling`: a Hugging Face
    rope_scaling dict ({"rope_type": "yarn", "factor": 4.0, ...}), None for plain RoPE."""
    import transformers

    if family not in TINY_FAMILIES:
        raise ValueError(f"family must be one of {TINY_FAMILIES}, got {family!r}")
    for name, value in (("window", window), ("n_experts", n_experts), ("top_k", top_k)):
        _positive("tiny_hf_family", name, value)
    if top_k > n_experts:
        raise ValueError(f"tiny_hf_family: top_k={top_k} is more than n_experts={n_experts}")
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling is not None:
        rope = {**rope, **RopeScaling.from_dict(rope_scaling).__dict__}  # checked first
        rope = {k: v for k, v in rope.items() if v is not None}
    settings = {**TINY_HF, "rope_parameters": rope}
    if rope.get("rope_type") == "dynamic":  # HF's dynamic scaling reads L from here
        settings["max_position_embeddings"] = rope.pop("original_max_position_embeddings")
    torch.manual_seed(seed)
    if family == "llama":
        config = transformers.LlamaConfig(**settings)
    elif family == "qwen3":
        config = transformers.Qwen3Config(rms_norm_eps=1e-6, **settings)
    elif family == "mistral":
        config = transformers.MistralConfig(sliding_window=window, **settings)
    elif family == "mixtral":
        config = transformers.MixtralConfig(num_local_experts=n_experts,
                                            num_experts_per_tok=top_k, **settings)
        config._experts_implementation = "eager"  # HF's loop over experts
    else:
        settings.pop("head_dim")
        config = transformers.DeepseekV3Config(**{**settings, **TINY_DEEPSEEK})
        config._experts_implementation = "eager"
    config._attn_implementation = "sdpa"
    name = "DeepseekV3" if family == "deepseek_v3" else family.capitalize()
    hf = getattr(transformers, f"{name}ForCausalLM")(config)
    random_norm_gains(hf, seed + 1)
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):  # steers the choice of experts
                b.copy_(0.1 * torch.randn_like(b))
    return hf.eval()


def hf_mla_output(mla: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's `DeepseekV3Attention` holding the weights of a tfbook
    `MultiHeadLatentAttention` (the same names), run causally on x (B, T, C) at positions
    0..T-1 with its eager kernel and its own rotary table: its output (B, T, C)."""
    import transformers
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    from tfbook.mla import MultiHeadLatentAttention

    if not isinstance(mla, MultiHeadLatentAttention):
        raise TypeError(f"mla must be a MultiHeadLatentAttention, got {type(mla).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a tensor (B, T, C), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    C = mla.kv_a_proj_with_mqa.in_features
    config = transformers.DeepseekV3Config(
        hidden_size=C, num_attention_heads=mla.n_heads, num_key_value_heads=mla.n_heads,
        q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
        qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim,
        v_head_dim=mla.v_head_dim, rope_interleave=mla.rope_convention == "interleaved",
        attention_bias=mla.o_proj.bias is not None, rms_norm_eps=mla.kv_a_layernorm.eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(mla.rope_base)})
    config._attn_implementation = "eager"
    hf = DeepseekV3Attention(config, layer_idx=0).to(x.dtype).eval()
    hf.load_state_dict(mla.state_dict())  # strict: every name must match
    B, T, _ = x.size()
    positions = torch.arange(T)[None].expand(B, T)  # (B, T)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
    with torch.no_grad():
        return hf(x, (cos, sin), mask)[0]
