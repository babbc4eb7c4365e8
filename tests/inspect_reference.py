"""The reference side of Part VII's parity tests: TransformerLens 4.3 and nnsight 0.8, offline.

Plain functions that the tests of `tfbook.inspect` call to get the numbers tfbook must equal:
residual streams, attention patterns, logit lens (both definitions), direct logit attribution
per head and per MLP, head-pattern scores, activation patching, attribution patching, and one
nnsight read and write. Nothing is downloaded: the Hugging Face hub is switched off while a
bridge boots (`offline_hub`), the SmolLM2 reference is the `LlamaForCausalLM` built from the
shipped GGUF (`hf_llama_from_gguf`), and its fast tokenizer is built from the GGUF's own
vocabulary and merges (`smollm2_fast_tokenizer`).

What the two libraries do to the objects they are given (build tfbook's side first):

- `TransformerBridge.boot_transformers(..., hf_model=m)` swaps m's submodules for bridge
  components IN PLACE: afterwards `m.state_dict()` has names like
  `model.embed_tokens._original_component.weight` and `lm_head` gained a zero bias.
- `bridge.enable_compatibility_mode()` rewrites m's weights in place (RMSNorm weights folded
  into W_Q, W_K, W_V, the MLP's input matrices and W_U; W_U centred over the vocabulary).
  `boot_bridge(..., compatibility=True)` therefore boots on a deep copy.
- `NNsight(module)` replaces every submodule's `forward` by an instance attribute for good:
  wrap a copy (`copy.deepcopy`) when the module is shared with other tests.
- Importing nnsight mounts a `.save` method on every Python object and patches
  `torch.Tensor.backward`; importing transformer_lens sets the "transformers" logger to ERROR.
  Import them only in the test modules that need them (this module imports them lazily).
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformer_lens.ActivationCache import ActivationCache
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

# The variables that make huggingface_hub, transformers and datasets refuse the network.
OFFLINE_VARIABLES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "HF_DATASETS_OFFLINE": "1"}


@contextmanager
def offline_hub() -> Iterator[None]:
    """Inside the block any Hugging Face hub request raises instead of downloading.

    huggingface_hub reads HF_HUB_OFFLINE once, when it is imported, into
    `huggingface_hub.constants.HF_HUB_OFFLINE` (which every `is_offline_mode()` reads): so the
    constant is set too, for a process that imported it before this block. Both are restored.
    """
    import huggingface_hub.constants as hub_constants

    saved_env = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    saved_flag = hub_constants.HF_HUB_OFFLINE
    os.environ.update(OFFLINE_VARIABLES)
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_flag
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- tokenizers and models ----------------------------------------------------------------

def smollm2_fast_tokenizer() -> PreTrainedTokenizerFast:
    """SmolLM2's byte-level BPE as a Hugging Face fast tokenizer, from the GGUF's metadata.

    Same ids as `load_smollm2_tokenizer()` on ordinary text (tested). `add_bos_token=True`
    and a `name_or_path` are needed by TransformerLens's `get_tokenizer_with_bos`: without
    them it reloads the tokenizer with `AutoTokenizer.from_pretrained(name_or_path)` (a hub
    request). About 0.1 s of CPU once the GGUF's metadata is read.
    """
    import gguf
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tfbook.checkpoints.smollm2 import read_smollm2_gguf

    meta = read_smollm2_gguf(metadata_only=True).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(line.split(" ")) for line in meta["tokenizer.ggml.merges"]]
    bpe = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # llama.cpp's "smollm" pre-tokenizer: every digit alone, then GPT-2's split (ByteLevel)
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    bpe.decoder = decoders.ByteLevel()
    special = (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
    specials = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"], strict=True)
                if kind in special]
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
        additional_special_tokens=specials, name_or_path="smollm2-gguf", add_bos_token=True,
    )


def numbered_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A fast tokenizer whose token i is the word "<i>": enough for a bridge fed token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<0>")),
        bos_token="<1>", eos_token="<2>", name_or_path="numbered", add_bos_token=True,
    )


def tiny_hf_llama(seed: int = 0, **config: Any) -> LlamaForCausalLM:
    """A random 2-layer LlamaForCausalLM (float32, eager attention, eval mode), tied head.

    4 query heads share 2 key/value heads (grouped-query attention, as SmolLM2's 9 and 3).
    The RMSNorm weights are drawn around 1 instead of HF's all-ones, so that a mistake about
    where the norm's weight goes (TransformerLens folds it into the next matrices) shows; the
    weights' scale (initializer_range 0.2, not 0.02) makes the attention far from uniform, so
    that patching a head's query or key changes the output.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    tie_word_embeddings=True, attn_implementation="eager", initializer_range=0.2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    settings.update(config)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**settings)).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def boot_bridge(hf_model: Any, tokenizer: Any, *, compatibility: bool = False
                ) -> TransformerBridge:
    """TransformerLens's TransformerBridge around `hf_model`, booted offline on the CPU.

    `boot_transformers` takes a model name or a directory; with `hf_model=` given it reads the
    config from the model (a copy) and never loads weights, but the name must still resolve,
    so a directory holding `hf_model.config.save_pretrained(...)` is passed. The default bridge
    runs the HF model's own modules (eager attention): its logits are HF's bit for bit.
    `compatibility=True` boots on a deep copy and calls `enable_compatibility_mode()`
    (HookedTransformer's weight processing: norms folded, W_U centred); `hf_model` is left
    as it was. Either way the bridge rewires the model it wraps (see the module docstring).
    """
    from transformer_lens.model_bridge import TransformerBridge

    if compatibility:
        hf_model = copy.deepcopy(hf_model)
    with offline_hub(), tempfile.TemporaryDirectory() as config_dir:
        hf_model.config.save_pretrained(config_dir)
        bridge = TransformerBridge.boot_transformers(
            config_dir, hf_model=hf_model, tokenizer=tokenizer, device="cpu")
    if compatibility:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge.eval()


# --- activations ----------------------------------------------------------------------------

@torch.no_grad()
def tl_run(bridge: TransformerBridge, ids: Tensor) -> tuple[Tensor, ActivationCache]:
    """Logits (B, T, V) and TransformerLens's activation cache of one run on token ids."""
    return bridge.run_with_cache(ids)


def tl_residuals(cache: ActivationCache, n_layers: int) -> dict[str, Tensor]:
    """The residual stream per block, each (L, B, T, C): before the block ("resid_pre"),
    after attention ("resid_mid"), after the MLP ("resid_post")."""
    return {kind: torch.stack([cache[f"blocks.{i}.hook_{kind}"] for i in range(n_layers)])
            for kind in ("resid_pre", "resid_mid", "resid_post")}


def tl_patterns(cache: ActivationCache, n_layers: int) -> Tensor:
    """Attention probabilities (L, B, H, T, T) of every layer (softmax of the scaled scores)."""
    return torch.stack([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(n_layers)])


def tl_attention_vectors(cache: ActivationCache, layer: int) -> dict[str, Tensor]:
    """One layer's per-head vectors, each (B, T, heads, D).

    "q", "k", "v": the projections BEFORE RoPE; "rot_q", "rot_k": after RoPE; "z": each
    head's attention-weighted values (before W_O). Keys and values have the key/value heads
    only (SmolLM2: 3, not repeated to 9); queries and z have all heads.
    """
    names = {"q": "hook_q", "k": "hook_k", "v": "hook_v", "rot_q": "hook_rot_q",
             "rot_k": "hook_rot_k", "z": "hook_z"}
    return {short: cache[f"blocks.{layer}.attn.{hook}"] for short, hook in names.items()}


def tl_sublayer_outputs(cache: ActivationCache, layer: int) -> dict[str, Tensor]:
    """One layer's attention output and MLP output (B, T, C), the MLP's hidden activation
    silu(gate) * up (B, T, F), and the RMS scales sqrt(mean(x^2) + eps) (B, T, 1) of its two
    norms' inputs."""
    return {"attn_out": cache[f"blocks.{layer}.hook_attn_out"],
            "mlp_out": cache[f"blocks.{layer}.hook_mlp_out"],
            "mlp_hidden": cache[f"blocks.{layer}.mlp.hook_post"],
            "ln1_scale": cache[f"blocks.{layer}.ln1.hook_scale"],
            "ln2_scale": cache[f"blocks.{layer}.ln2.hook_scale"]}


# --- logit lens -------------------------------------------------------------------------------

def _unembed(bridge: TransformerBridge, x: Tensor) -> Tensor:
    """x (..., C) @ W_U (+ b_U, zero for SmolLM2): what the bridge's unembed computes."""
    logits = x @ bridge.W_U
    b_U = getattr(bridge, "b_U", None)
    return logits if b_U is None else logits + b_U


@torch.no_grad()
def tl_logit_lens(bridge: TransformerBridge, cache: ActivationCache, *, incl_mid: bool = False,
                  pos_slice: int | None = None) -> tuple[Tensor, list[str]]:
    """The literature's logit lens, TransformerLens 4.3's `accumulated_resid(apply_ln=True)`.

    Every layer's residual stream (each block's input, then the last block's output; with
    `incl_mid` also each block's mid-stream) through the final norm RECOMPUTED on that stream
    (its own RMS, times the norm's weight), then W_U: (L + 1, B, T, V) and the labels "0_pre"
    .. "29_pre", "final_post" ("0_pre", "0_mid", "1_pre", ... with `incl_mid`). An int
    `pos_slice` keeps one position and drops the T axis. TL 4.3 recomputes the statistics
    when `layer` is None (the fix of TL issue #1076, PR #1180); the last entry is the model's
    logits.
    """
    stack, labels = cache.accumulated_resid(apply_ln=True, incl_mid=incl_mid,
                                            pos_slice=pos_slice, return_labels=True)
    return _unembed(bridge, stack), labels


@torch.no_grad()
def tl_logit_lens_cached_scale(bridge: TransformerBridge, cache: ActivationCache, *,
                               pos_slice: int | None = None) -> Tensor:
    """The logit lens as TransformerLens computed it before 4.3 (TL issue #1076).

    Every layer's stream divided by the FINAL layer's cached RMS (`ln_final.hook_scale`),
    times the final norm's weight, then W_U: (L + 1, B, T, V). This is TL's
    `apply_ln_to_stack(stack, layer=None)` (the cached-scale path that `decompose_resid`,
    `stack_head_results` and `logit_attrs` still use) with the weight that the default bridge
    leaves out: with the weight folded (compatibility mode) TL's own product is this up to
    W_U's centring. Early layers' streams are far smaller than the last one's, so their
    logits come out shrunk towards zero (a high-temperature, near-uniform distribution).
    `pos_slice` as in `tl_logit_lens`.
    """
    stack = cache.accumulated_resid(pos_slice=pos_slice)  # (L + 1, B, T, C), no norm
    scaled = cache.apply_ln_to_stack(stack, layer=None, pos_slice=pos_slice)  # / cached scale
    return _unembed(bridge, scaled * bridge.ln_final.weight)


# --- direct logit attribution -----------------------------------------------------------------

def _position_slice(position: int) -> slice:
    return slice(position, position + 1 if position != -1 else None)


@torch.no_grad()
def tl_head_logit_attribution(compat_bridge: TransformerBridge, ids: Tensor, position: int,
                              token: int, other: int | None = None) -> Tensor:
    """Direct logit attribution of every head, (L, H), at one position, batch averaged.

    TransformerLens's recipe on a bridge in compatibility mode (the final norm's weight folded
    into W_U, which the recipe needs: in the default bridge `logit_attrs` leaves the weight
    out and the attributions do not add up to the logit): each head's output z_h W_O,h
    (`stack_head_results`) divided by the final norm's cached RMS, dotted with
    W_U[:, token] - W_U[:, other] (`logit_attrs`). With `other` the centring of W_U cancels;
    without it each value is shifted by that head's share of the vocabulary mean.
    """
    _, cache = compat_bridge.run_with_cache(ids)
    pos = _position_slice(position)
    stack = cache.stack_head_results(pos_slice=pos)  # (L*H, B, 1, C)
    attrs = cache.logit_attrs(stack, tokens=token, incorrect_tokens=other,
                              pos_slice=pos)  # (L*H, B, 1)
    cfg = compat_bridge.cfg
    return attrs.mean(dim=(1, 2)).view(cfg.n_layers, cfg.n_heads)


@torch.no_grad()
def tl_component_logit_attribution(compat_bridge: TransformerBridge, ids: Tensor,
                                   position: int, token: int, other: int | None = None
                                   ) -> tuple[Tensor, list[str]]:
    """Direct logit attribution of the embedding and every attention layer and MLP: (1 + 2L,)
    with labels "embed", "0_attn_out", "0_mlp_out", ... (`decompose_resid` + `logit_attrs`,
    compatibility mode, batch averaged). The values add up to the logit (difference)."""
    _, cache = compat_bridge.run_with_cache(ids)
    pos = _position_slice(position)
    stack, labels = cache.decompose_resid(pos_slice=pos, return_labels=True)
    attrs = cache.logit_attrs(stack, tokens=token, incorrect_tokens=other, pos_slice=pos)
    return attrs.mean(dim=(1, 2)), labels


@torch.no_grad()
def tl_head_logit_attribution_unfolded(bridge: TransformerBridge, cache: ActivationCache,
                                       position: int, token: int, other: int) -> Tensor:
    """The same (L, H) attributions from the DEFAULT bridge's cache: TL's per-head outputs
    (`stack_head_results`) divided by TL's cached final scale (`apply_ln_to_stack`), dotted
    with ln_final.weight * (W_U[:, token] - W_U[:, other]): the weight that TL's `logit_attrs`
    leaves out here is put back by hand. Batch averaged."""
    pos = _position_slice(position)
    stack = cache.stack_head_results(pos_slice=pos)  # (L*H, B, 1, C)
    scaled = cache.apply_ln_to_stack(stack, layer=None, pos_slice=pos)  # / ln_final.hook_scale
    direction = (bridge.W_U[:, token] - bridge.W_U[:, other]) * bridge.ln_final.weight
    cfg = bridge.cfg
    return (scaled @ direction).mean(dim=(1, 2)).view(cfg.n_layers, cfg.n_heads)


@torch.no_grad()
def tl_logit_attrs_total(bridge: TransformerBridge, cache: ActivationCache, position: int,
                         token: int, other: int) -> Tensor:
    """Sum of TL's own `logit_attrs` over `decompose_resid`'s parts (batch mean): the logit
    difference in compatibility mode; in the default bridge NOT, since the final norm's
    weight is missing from the direction there."""
    pos = _position_slice(position)
    stack = cache.decompose_resid(pos_slice=pos)
    attrs = cache.logit_attrs(stack, tokens=token, incorrect_tokens=other, pos_slice=pos)
    return attrs.sum(0).mean()


# --- head scores ------------------------------------------------------------------------------

HEAD_PATTERNS = ("previous_token", "duplicate_token", "induction")


def tl_head_scores(cache: ActivationCache, tokens: Tensor, kind: str, n_layers: int, *,
                   exclude_bos: bool = False, exclude_current_token: bool = False) -> Tensor:
    """TransformerLens's head-detector score of every head, (L, H), for one sequence.

    `tokens` (T,); the cache of a batch-1 run on them. The score ("mul" measure) is the
    attention mass on the positions of the detection pattern summed over every query row,
    divided by the total mass (T rows of 1, fewer when the first key or the diagonal is
    excluded): rows with nothing to find (the first query of a previous-token test, the first
    half of a repeated sequence) still count in the denominator, so a perfect induction head
    on a sequence repeated once scores about 1/2, not 1.
    """
    from transformer_lens import head_detector

    if kind not in HEAD_PATTERNS:
        raise ValueError(f"kind must be one of {HEAD_PATTERNS}, got {kind!r}")
    pattern_of = getattr(head_detector, f"get_{kind}_head_detection_pattern")
    detection = pattern_of(tokens.reshape(1, -1).cpu())  # (T, T) zeros and ones
    scores = []
    for layer in range(n_layers):
        per_head = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # (H, T, T)
        scores.append([head_detector.compute_head_attention_similarity_score(
            head, detection, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token,
            error_measure="mul") for head in per_head])
    return torch.tensor(scores)


# --- activation patching ----------------------------------------------------------------------

def logit_difference(token: int, other: int, position: int = -1) -> Callable[[Tensor], Tensor]:
    """The metric: logits[:, position, token] - logits[:, position, other], batch mean."""
    def metric(logits: Tensor) -> Tensor:
        return (logits[:, position, token] - logits[:, position, other]).mean()
    return metric


# kind -> (patching function name, index columns); "head" counts key/value heads for k and v
PATCHES = {
    "resid_pre": ("get_act_patch_resid_pre", ("layer", "pos")),
    "attn_out": ("get_act_patch_attn_out", ("layer", "pos")),
    "mlp_out": ("get_act_patch_mlp_out", ("layer", "pos")),
    "head_out": ("get_act_patch_attn_head_out_all_pos", ("layer", "head")),
    "head_q": ("get_act_patch_attn_head_q_all_pos", ("layer", "head")),
    "head_k": ("get_act_patch_attn_head_k_all_pos", ("layer", "head")),
    "head_v": ("get_act_patch_attn_head_v_all_pos", ("layer", "head")),
    "head_out_by_pos": ("get_act_patch_attn_head_out_by_pos", ("layer", "pos", "head")),
    "head_q_by_pos": ("get_act_patch_attn_head_q_by_pos", ("layer", "pos", "head")),
    "head_k_by_pos": ("get_act_patch_attn_head_k_by_pos", ("layer", "pos", "head")),
    "head_v_by_pos": ("get_act_patch_attn_head_v_by_pos", ("layer", "pos", "head")),
}


@torch.no_grad()
def tl_patch(bridge: TransformerBridge, kind: str, clean_ids: Tensor, corrupted_ids: Tensor,
             metric: Callable[[Tensor], Tensor],
             rows: Sequence[Sequence[int]] | None = None) -> Tensor:
    """TransformerLens's activation patching (`transformer_lens.patching.get_act_patch_*`).

    Runs the corrupted ids once per index with one clean activation patched in and returns
    the metric of each run. `rows=None`: the whole grid, (L, T) for "resid_pre"/"attn_out"/
    "mlp_out", (L, H) for "head_out"/"head_q" (L, H_kv for "head_k"/"head_v": under
    grouped-query attention TL patches a key/value head, which all the query heads of its
    group read), (L, T, H) for the "_by_pos" kinds. `rows`: only those indices (tuples in the
    order of PATCHES[kind][1]), a flat tensor with one value per row. The query, key and value
    patched are TL's hook_q/hook_k/hook_v, taken BEFORE RoPE: the same as patching after it,
    since clean and corrupted ids sit at the same positions. One forward per index: SmolLM2
    costs about 0.1 s of CPU per index at 9 tokens.
    """
    import pandas as pd
    from transformer_lens import patching

    if kind not in PATCHES:
        raise ValueError(f"kind must be one of {sorted(PATCHES)}, got {kind!r}")
    name, columns = PATCHES[kind]
    _, clean_cache = bridge.run_with_cache(clean_ids)
    function = getattr(patching, name)
    # patching wraps its loop in tqdm (a progress bar on stderr); TQDM_DISABLE would only
    # work if set before tqdm was imported, so the bar is replaced by the bare iterable
    with mock.patch.object(patching, "tqdm", lambda iterable, *args, **kwargs: iterable):
        if rows is None:
            return function(bridge, corrupted_ids, clean_cache, metric)
        # the partial fixes index_axis_names; an index_df needs it set back to None
        index_df = pd.DataFrame([list(r) for r in rows], columns=list(columns))
        return function(bridge, corrupted_ids, clean_cache, metric, index_axis_names=None,
                        index_df=index_df)


def tl_attribution_patching(bridge: TransformerBridge, clean_ids: Tensor,
                            corrupted_ids: Tensor, metric: Callable[[Tensor], Tensor]
                            ) -> dict[str, Tensor]:
    """TransformerLens's attribution patching (node granularity), the gradient estimate of
    activation patching: (a_clean - a_corrupted) . d metric / d a at the corrupted run.

    -> "head_out" (L, T, H) from each head's z (before W_O), "mlp_out" (L, T) and "embed"
    (T,), batch averaged (TL scores each clean/corrupted pair on its own). `metric` maps one
    example's logits (1, T, V) to a scalar.
    """
    from transformer_lens.tools.analysis.attribution_patching import attribution_patch

    cfg = bridge.cfg
    T = clean_ids.shape[-1]
    result = attribution_patch(bridge, clean_ids, corrupted_ids, metric)
    heads = torch.zeros(cfg.n_layers, T, cfg.n_heads)
    mlps = torch.zeros(cfg.n_layers, T)
    embed = torch.zeros(T)
    for node, score in result.node_scores.items():
        if node.kind == "attn_head_out":
            heads[node.layer, node.position, node.head] = score
        elif node.kind == "mlp_out":
            mlps[node.layer, node.position] = score
        else:
            embed[node.position] = score
    return {"head_out": heads, "mlp_out": mlps, "embed": embed}


# --- nnsight ----------------------------------------------------------------------------------

@torch.no_grad()
def nnsight_block_output(model: torch.nn.Module, ids: Tensor, layer: int) -> tuple[Tensor, Tensor]:
    """nnsight's saved output of block `layer` (its residual stream, (B, T, C)) and the
    model's logits, from one trace of a tfbook GPT (a plain torch module: NNsight(model)).

    tfbook's blocks return (x, attention weights) and the model a ModelOutput dataclass:
    `.output[0]` and `.output.logits` reach into them inside the trace. NNsight wraps the
    modules' forwards in place: pass a model no other test counts hooks on.
    """
    from nnsight import NNsight

    traced = NNsight(model)
    with traced.trace(ids):
        hidden = traced.blocks[layer].output[0].save()
        logits = traced.output.logits.save()
    return hidden, logits


@torch.no_grad()
def nnsight_replace_block_output(model: torch.nn.Module, ids: Tensor, layer: int,
                                 new: Callable[[Tensor], Tensor]) -> Tensor:
    """The logits of a run in which nnsight replaced block `layer`'s residual output x by
    new(x) (e.g. `torch.zeros_like`, or a patch from another run); same caveats as above."""
    from nnsight import NNsight

    traced = NNsight(model)
    with traced.trace(ids):
        x, weights = traced.blocks[layer].output
        traced.blocks[layer].output = (new(x), weights)
        logits = traced.output.logits.save()
    return logits
