"""Model families against their Hugging Face classes: prefill, cached decoding and the cache's
bytes, measured side by side in one run (issue 26), for the chapter book/generation/model_families.

    python bench/bench_families.py           # a progress bar, a table, and the results in
                                             # bench/results/families.json and (for the chapter)
                                             # book/generation/data/families_speed.json
    python bench/bench_families.py --quick   # two rounds of everything, nothing written
    python bench/bench_families.py --threads 2   # torch on two threads (default one)

Each variant is built tiny but not trivial (4 layers, width 256, 8 heads of 32, 2 key/value
heads, vocabulary 4096, a 256-token prompt) as a Hugging Face model first; tfbook's copy holds
the same weights (`tfbook_from_hf_llama`), and the outputs are checked to agree before any
timing (within 1e-4 of the largest HF output, and the same greedy tokens; else the run stops):

- "llama": LlamaForCausalLM, the baseline every other row adds one setting to;
- "qwen3": Qwen3ForCausalLM, QK-norm (qk_norm=True);
- "mistral": MistralForCausalLM, a 64-position sliding window, so the 256-token prompt and
  everything decoded after it are longer than the window (tfbook's SlidingWindowKVCache
  against HF's DynamicSlidingWindowLayer);
- "mixtral": MixtralForCausalLM, 8 SwiGLU experts, 2 per token (ffn="moe"), with HF's default
  experts implementation;
- "llama_rope_scaling": LlamaForCausalLM with Llama 3.1's RoPE scaling ("llama3", 4x past an
  original context of 128), GPTConfig.rope_scaling; only where tfbook has that setting (else
  the reason is stored under "skipped");
- "mla": multi-head latent attention at the attention level: 4 layers x <- x + attn(x) of
  tfbook.mla.MultiHeadLatentAttention against HF's DeepseekV3Attention (the same state dict),
  HF's rotary table computed once per call as its model does. tfbook's naive form is the
  same algorithm as HF's; its absorbed form (W_UK in the query, W_UV in the output) is timed
  in the same rounds.

Measured for each: one forward over the prompt (prefill; every position's logits on both
sides), and cached greedy decoding one token per step (per-token time); the speed ratio is HF
CPU time / tfbook CPU time in the same round (above 1: tfbook faster), median over rounds.
Then the bytes the live caches hold after the prompt and the decoded tokens: tfbook's
`memory_bytes()` and the tensors of HF's DynamicCache, per token for multi-head (8 key/value
heads), grouped-query (2) and latent attention at the same width, beside
`tfbook.mla.kv_cache_bytes_per_token`.

Protocol (bench_decode.py's, on one thread): float32, batch 1, tfbook attention="torch" and HF
attn_implementation="sdpa", torch.set_num_threads(1) (`--threads N` for another count; on one
thread the CPU time is the running time, whatever else the machine runs, where the wall-clock
time of a 2-core machine shared by busy processes is not), OMP_WAIT_POLICY=PASSIVE; the
candidates take turns inside every round (in reverse order every other round) after a
warm-up round, so a burst of load from another process slows both alike; wall-clock and
process CPU times are both kept. Absolute times depend on the machine and its load (the
`machine()` record); the ratios are what to compare.
"""

import os
import sys

if __name__ == "__main__":  # run as a script: before torch starts its thread pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402

from tfbook.checkpoints.hf_llama import config_from_hf_llama, tfbook_from_hf_llama  # noqa: E402
from tfbook.families import random_norm_gains  # noqa: E402
from tfbook.mla import LatentCache, MultiHeadLatentAttention, kv_cache_bytes_per_token  # noqa: E402
from tfbook.models.gpt import GPTConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "families.json"
BOOK_COPY = ROOT / "book" / "generation" / "data" / "families_speed.json"
THREADS = 1  # one thread: its CPU time is its running time, whatever the load
PROMPT = 256  # tokens of the prompt (the prefill)
PREFILL_ROUNDS = 15
DECODE_ROUNDS, STEPS = 15, 16  # rounds of STEPS cached steps, tfbook and HF in turn
WARMUP = 1
WINDOW = 64  # Mistral's sliding window, shorter than the prompt
EXPERTS, TOP_K = 8, 2
SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
             eos_token_id=None, pad_token_id=None, initializer_range=0.1)
# Llama 3.1's RoPE scaling, shrunk: 4x past an original context of 128 (the prompt is longer)
LLAMA3_SCALING = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 128}
MLA_DIMS = dict(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                q_lora_rank=128)  # DeepSeek-V3's proportions at width 256


def summary(values: list[float], scale: float = 1.0) -> dict:
    """Median, min and max of `values` times `scale`."""
    return {"median": scale * statistics.median(values), "min": scale * min(values),
            "max": scale * max(values)}


def rounds(fns: dict, n: int, progress=None) -> dict:
    """Each fn() in turn, WARMUP + n rounds -> {name: [(wall s, CPU s) of each timed round]}.

    Every other round runs the candidates in reverse order, so that none always runs just
    after the same other one (warm caches, a thread pool just woken)."""
    out = {name: [] for name in fns}
    for round_ in range(WARMUP + n):
        order = list(fns.items()) if round_ % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if round_ >= WARMUP:
                out[name].append((wall, cpu))
        if progress is not None:
            progress.update(1)
    return out


def compare(times: dict, ours: str, theirs: str, per: int = 1) -> dict:
    """Milliseconds (per `per` items) of two candidates and HF time / tfbook time per round,
    by CPU time (the speed_ratio) and by wall-clock time."""
    a, b = times[ours], times[theirs]
    return {"tfbook_cpu_ms": summary([c for _, c in a], 1e3 / per),
            "hf_cpu_ms": summary([c for _, c in b], 1e3 / per),
            "speed_ratio": summary([cb / ca for (_, ca), (_, cb) in zip(a, b, strict=True)]),
            "tfbook_wall_ms": summary([w for w, _ in a], 1e3 / per),
            "hf_wall_ms": summary([w for w, _ in b], 1e3 / per),
            "wall_speed_ratio": summary([wb / wa for (wa, _), (wb, _) in zip(a, b, strict=True)])}


randomized = random_norm_gains  # random norm gains (HF starts them at one)


def hf_model(family: str, **overrides):
    """The tiny HF model of `family` ("llama", "qwen3", "mistral", "mixtral"), sdpa."""
    import transformers as tr

    shape = SHAPE | overrides
    torch.manual_seed(0)
    if family == "llama":
        config, cls = tr.LlamaConfig(**shape), tr.LlamaForCausalLM
    elif family == "llama_rope_scaling":
        config, cls = tr.LlamaConfig(rope_parameters=dict(LLAMA3_SCALING), **shape), \
            tr.LlamaForCausalLM
    elif family == "qwen3":
        config, cls = tr.Qwen3Config(rms_norm_eps=1e-6, **shape), tr.Qwen3ForCausalLM
    elif family == "mistral":
        config, cls = tr.MistralConfig(sliding_window=WINDOW, **shape), tr.MistralForCausalLM
    elif family == "mixtral":
        config = tr.MixtralConfig(num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                  sliding_window=None, **shape)
        cls = tr.MixtralForCausalLM
    else:
        raise ValueError(f"unknown family {family!r}")
    config._attn_implementation = "sdpa"
    return randomized(cls(config))


def hf_cache_bytes(cache) -> int:
    """Bytes of the key and value tensors an HF cache holds, over its layers."""
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values) if t is not None)


class Decoder:
    """Cached greedy decoding of one model, one token per call, the prompt's pass made here."""

    def __init__(self, model, prompt: torch.Tensor, steps: int, hf: bool) -> None:
        self.model, self.hf = model, hf
        with torch.no_grad():
            if hf:
                out = model(prompt, use_cache=True, logits_to_keep=1)
                self.cache = out.past_key_values
            else:
                self.cache = model.new_cache(prompt.size(1) + steps + 1)
                out = model(prompt, cache=self.cache, last_only=True)
        self.tokens = [out.logits[:, -1:].argmax(-1)]  # (B, 1) each

    def step(self) -> None:
        with torch.no_grad():
            if self.hf:
                logits = self.model(self.tokens[-1], past_key_values=self.cache,
                                    use_cache=True).logits
            else:
                logits = self.model(self.tokens[-1], cache=self.cache).logits
        self.tokens.append(logits[:, -1:].argmax(-1))

    def steps(self) -> None:
        for _ in range(STEPS):
            self.step()

    def cache_bytes(self) -> int:
        return hf_cache_bytes(self.cache) if self.hf else self.cache.memory_bytes()


def formula_bytes(attention: str, n_kv_heads: int | None = None) -> int:
    """tfbook.mla.kv_cache_bytes_per_token for this benchmark's shapes in float32."""
    n = SHAPE["num_hidden_layers"]
    if attention == "mla":
        return kv_cache_bytes_per_token(
            "mla", dtype=torch.float32, n_layers=n, kv_lora_rank=MLA_DIMS["kv_lora_rank"],
            qk_rope_head_dim=MLA_DIMS["qk_rope_head_dim"])
    return kv_cache_bytes_per_token(
        attention, dtype=torch.float32, n_layers=n, n_heads=SHAPE["num_attention_heads"],
        n_kv_heads=n_kv_heads, head_size=SHAPE["head_dim"])


AGREE = 1e-4  # |tfbook - HF| at most this fraction of max |HF|: float32 rounding, not a bug


def check_agreement(name: str, check: dict) -> None:
    """Refuse to time models that do not compute the same thing (a wrong copy would be timed
    as if it were the same model): outputs within AGREE of HF's, the same greedy tokens."""
    diffs = [v for k, v in check.items() if k.startswith("max_abs") and "reference" not in k]
    scale = max(v for k, v in check.items() if k.startswith("max_abs") and "reference" in k)
    if max(diffs) > AGREE * scale or check.get("same_greedy_tokens") is False:
        raise RuntimeError(f"{name}: tfbook and HF disagree before timing: {check}")


def bench_model_family(family: str, label: str, prompt: torch.Tensor, progress) -> dict:
    """Check, then time prefill and decoding of one family, tfbook vs HF, in turns."""
    hf = hf_model(family)
    ours = tfbook_from_hf_llama(hf, attention="torch")
    with torch.no_grad():
        ref = hf(prompt).logits
        diff = (ours(prompt).logits - ref).abs().max().item()
    check_agreement(family, {"max_abs_diff": diff, "max_abs_reference": ref.abs().max().item()})
    total = (WARMUP + DECODE_ROUNDS) * STEPS
    dec = {"tfbook": Decoder(ours, prompt, total, hf=False), "hf": Decoder(hf, prompt, 0, True)}
    with torch.no_grad():
        t_prefill = rounds({"tfbook": lambda: ours(prompt), "hf": lambda: hf(prompt)},
                           PREFILL_ROUNDS, progress)
    t_decode = rounds({name: d.steps for name, d in dec.items()}, DECODE_ROUNDS, progress)
    tokens = {name: torch.cat(d.tokens, 1)[0].tolist() for name, d in dec.items()}
    check = {"max_abs_diff": diff, "max_abs_reference": ref.abs().max().item(),
             "same_greedy_tokens": tokens["tfbook"] == tokens["hf"],
             "tokens_compared": len(tokens["hf"])}
    check_agreement(family, check)
    positions = PROMPT + total
    ours_cache = dec["tfbook"].cache
    held = (ours_cache.layers[0].stored if hasattr(ours_cache.layers[0], "stored")
            else ours_cache.length)
    n_kv = hf.config.num_key_value_heads
    return {
        "label": label, "level": "model", "hf_class": type(hf).__name__,
        "tfbook": f"GPT({describe(ours.config)})",
        "hf_experts_implementation": getattr(hf.config, "_experts_implementation", None),
        "check": check,
        "prefill": compare(t_prefill, "tfbook", "hf"),
        "decode": compare(t_decode, "tfbook", "hf", per=STEPS),
        "kv_bytes": {"positions": positions, "tfbook": dec["tfbook"].cache_bytes(),
                     "hf": dec["hf"].cache_bytes(), "tfbook_positions_held": held,
                     "formula_per_token": formula_bytes("gqa", n_kv)},
    }


def describe(config) -> str:
    """The settings that make a family, as GPTConfig fields."""
    parts = [f"n_kv_heads={config.n_kv_heads}"]
    if config.qk_norm:
        parts.append("qk_norm=True")
    if config.sliding_window is not None:
        parts.append(f"sliding_window={config.sliding_window}")
    if getattr(config, "rope_scaling", None) is not None:
        parts.append(f"rope_scaling={{'rope_type': {config.rope_scaling['rope_type']!r}, ...}}")
    if config.ffn == "moe":
        parts.append(f"ffn='moe', n_experts={config.n_experts}, top_k={config.top_k}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# MLA at the attention level

def mla_config():
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(
        hidden_size=SHAPE["hidden_size"], num_attention_heads=SHAPE["num_attention_heads"],
        num_key_value_heads=SHAPE["num_attention_heads"], rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=SHAPE["max_position_embeddings"],
        num_hidden_layers=SHAPE["num_hidden_layers"], **MLA_DIMS)
    config._attn_implementation = "sdpa"
    return config


class HFLatentStack(nn.Module):
    """4 layers x <- x + DeepseekV3Attention(x), the rotary table once per call (HF's model)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3Attention,
            DeepseekV3RotaryEmbedding,
        )
        self.layers = nn.ModuleList(DeepseekV3Attention(config, layer_idx=i)
                                    for i in range(config.num_hidden_layers))
        self.rotary = DeepseekV3RotaryEmbedding(config)

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        start = 0 if cache is None else cache.get_seq_length()
        positions = torch.arange(start, start + x.size(1))[None]  # (1, T)
        cos_sin = self.rotary(x, positions)
        for layer in self.layers:
            x = x + layer(x, cos_sin, None, past_key_values=cache)[0]
        return x


class LatentStack(nn.Module):
    """The same 4 layers as tfbook.mla.MultiHeadLatentAttention, one LatentCache each."""

    def __init__(self, hf: HFLatentStack) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            MultiHeadLatentAttention(SHAPE["hidden_size"], SHAPE["num_attention_heads"],
                                     rope_convention="interleaved", rope_precision="float32",
                                     attention="torch", **MLA_DIMS)
            for _ in hf.layers)
        for ours, theirs in zip(self.layers, hf.layers, strict=True):
            ours.load_state_dict(theirs.state_dict())  # the same names, strictly

    def new_cache(self, max_len: int) -> list[LatentCache]:
        return [LatentCache(max_len) for _ in self.layers]

    def forward(self, x: torch.Tensor, cache=None, absorbed: bool = False) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = x + layer(x, cache=None if cache is None else cache[i], absorbed=absorbed)[0]
        return x


class LatentDecoder:
    """Cached steps of an attention stack on a fixed sequence of inputs (B, 1, C) each."""

    def __init__(self, stack, x: torch.Tensor, inputs: torch.Tensor, hf: bool,
                 absorbed: bool = False) -> None:
        from transformers import DynamicCache

        self.stack, self.inputs, self.hf, self.absorbed = stack, inputs, hf, absorbed
        self.cache = DynamicCache() if hf else stack.new_cache(x.size(1) + len(inputs))
        self.outputs = [self.forward(x)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.hf:
                return self.stack(x, cache=self.cache)
            return self.stack(x, cache=self.cache, absorbed=self.absorbed)

    def steps(self) -> None:
        for _ in range(STEPS):
            self.outputs.append(self.forward(self.inputs[len(self.outputs) - 1]))

    def cache_bytes(self) -> int:
        if self.hf:
            return hf_cache_bytes(self.cache)
        return sum(c.memory_bytes() for c in self.cache)


def bench_mla(progress) -> dict:
    """MLA: check, then time prefill and decoding, tfbook naive and absorbed vs HF, in turns."""
    torch.manual_seed(0)
    hf = HFLatentStack(mla_config()).eval()
    with torch.no_grad():  # random gains too (HF starts them at one)
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
    ours = LatentStack(hf).eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, PROMPT, SHAPE["hidden_size"], generator=g)  # (B, T, C)
    total = (WARMUP + DECODE_ROUNDS) * STEPS
    inputs = torch.randn(total, 1, 1, SHAPE["hidden_size"], generator=g)  # one (B, 1, C) a step
    with torch.no_grad():
        ref = hf(x)
        diff = (ours(x) - ref).abs().max().item()
        diff_absorbed = (ours(x, absorbed=True) - ref).abs().max().item()
    check_agreement("mla", {"max_abs_diff": diff, "max_abs_diff_absorbed": diff_absorbed,
                            "max_abs_reference": ref.abs().max().item()})
    dec = {"tfbook": LatentDecoder(ours, x, inputs, hf=False),
           "tfbook_absorbed": LatentDecoder(ours, x, inputs, hf=False, absorbed=True),
           "hf": LatentDecoder(hf, x, inputs, hf=True)}
    with torch.no_grad():
        t_prefill = rounds({"tfbook": lambda: ours(x), "tfbook_absorbed":
                            lambda: ours(x, absorbed=True), "hf": lambda: hf(x)},
                           PREFILL_ROUNDS, progress)
    t_decode = rounds({name: d.steps for name, d in dec.items()}, DECODE_ROUNDS, progress)
    outs = {name: torch.cat(d.outputs[1:], 1) for name, d in dec.items()}  # decoded steps
    scale = outs["hf"].abs().max().item()
    check = {"max_abs_diff": diff, "max_abs_diff_absorbed": diff_absorbed,
             "max_abs_reference": ref.abs().max().item(),
             "max_abs_decode_diff": (outs["tfbook"] - outs["hf"]).abs().max().item(),
             "max_abs_decode_diff_absorbed":
                 (outs["tfbook_absorbed"] - outs["hf"]).abs().max().item(),
             "max_abs_decode_reference": scale, "steps_compared": outs["hf"].size(1)}
    check_agreement("mla", check)
    return {
        "label": "MLA (DeepSeek-V3 attention)", "level": "attention",
        "hf_class": "DeepseekV3Attention", "tfbook": "tfbook.mla.MultiHeadLatentAttention",
        "layers": "4 x (x + attention(x)), no norm or MLP",
        "check": check,
        "prefill": compare(t_prefill, "tfbook", "hf"),
        "prefill_absorbed": compare(t_prefill, "tfbook_absorbed", "hf"),
        "decode": compare(t_decode, "tfbook", "hf", per=STEPS),
        "decode_absorbed": compare(t_decode, "tfbook_absorbed", "hf", per=STEPS),
        "kv_bytes": {"positions": PROMPT + total, "tfbook": dec["tfbook"].cache_bytes(),
                     "hf": dec["hf"].cache_bytes(), "tfbook_positions_held": PROMPT + total,
                     "formula_per_token": formula_bytes("mla")},
    }


def mha_cache_bytes(prompt: torch.Tensor) -> dict:
    """Cache bytes of the Llama model with 8 key/value heads (multi-head) after the prompt."""
    hf = hf_model("llama", num_key_value_heads=SHAPE["num_attention_heads"])
    ours = tfbook_from_hf_llama(hf, attention="torch")
    return {"positions": PROMPT, "tfbook": Decoder(ours, prompt, 0, hf=False).cache_bytes(),
            "hf": Decoder(hf, prompt, 0, hf=True).cache_bytes(),
            "formula_per_token": formula_bytes("mha")}


def per_token(kv: dict) -> dict:
    return {"measured_tfbook": kv["tfbook"] / kv["positions"],
            "measured_hf": kv["hf"] / kv["positions"], "formula": kv["formula_per_token"],
            "positions": kv["positions"]}


def rope_scaling_unsupported() -> str | None:
    """None if tfbook reads a Llama with RoPE scaling from HF, else the reason it does not."""
    if "rope_scaling" not in {f.name for f in fields(GPTConfig)}:
        return "GPTConfig has no rope_scaling field"
    try:
        config = config_from_hf_llama(hf_model("llama_rope_scaling", num_hidden_layers=1).config)
    except (ValueError, TypeError) as error:
        return f"config_from_hf_llama refuses it: {error}"
    if config.rope_scaling is None:
        return "config_from_hf_llama drops the RoPE scaling"
    return None


FAMILIES = {"llama": "Llama (GQA, the baseline)", "qwen3": "Qwen3 (QK-norm)",
            "mistral": f"Mistral (sliding window {WINDOW})",
            "mixtral": f"Mixtral (MoE, {EXPERTS} experts, top-{TOP_K})"}


def main(quick: bool = False, threads: int = THREADS) -> None:
    """Run every measurement and store it; `quick`: two rounds each, nothing written."""
    global PREFILL_ROUNDS, DECODE_ROUNDS, THREADS
    THREADS = threads
    if quick:
        PREFILL_ROUNDS, DECODE_ROUNDS = 2, 2
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    record = machine()
    prompt = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT),
                           generator=torch.Generator().manual_seed(0))  # (B, T)
    variants = {}
    rope_scaling_missing = rope_scaling_unsupported()
    n_variants = len(FAMILIES) + 1 + (rope_scaling_missing is None)
    with tqdm(total=n_variants * (2 * WARMUP + PREFILL_ROUNDS + DECODE_ROUNDS),
              desc="bench_families", unit="round") as bar:
        for family, label in FAMILIES.items():
            bar.set_postfix_str(family)
            variants[family] = bench_model_family(family, label, prompt, bar)
        if rope_scaling_missing is None:
            bar.set_postfix_str("llama_rope_scaling")
            variants["llama_rope_scaling"] = bench_model_family(
                "llama_rope_scaling", "Llama (RoPE scaling, llama3 x4)", prompt, bar)
        bar.set_postfix_str("mla")
        variants["mla"] = bench_mla(bar)
    mha = mha_cache_bytes(prompt)
    results = {
        "machine": {**record, "load_average_1min_at_end": os.getloadavg()[0]},
        "protocol": {
            "threads": THREADS, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "dtype": "float32", "batch": 1, "prompt_tokens": PROMPT,
            "prefill_rounds": PREFILL_ROUNDS, "decode_rounds": DECODE_ROUNDS,
            "decode_steps_per_round": STEPS, "warmup_rounds": WARMUP,
            "tfbook_attention": "torch", "hf_attn_implementation": "sdpa",
            "clock": "process CPU time (time.process_time) for speed_ratio; wall-clock "
                     "(time.perf_counter) kept as wall_speed_ratio",
            "method": "tfbook and HF timed in turn within each round (reversed every other "
                      "round); speed_ratio = HF CPU time / tfbook CPU time in the same round, "
                      "median over rounds"},
        "config": {"n_layers": SHAPE["num_hidden_layers"], "d_model": SHAPE["hidden_size"],
                   "n_heads": SHAPE["num_attention_heads"],
                   "n_kv_heads": SHAPE["num_key_value_heads"], "head_size": SHAPE["head_dim"],
                   "d_ff": SHAPE["intermediate_size"], "vocab_size": SHAPE["vocab_size"],
                   "sliding_window": WINDOW, "n_experts": EXPERTS, "top_k": TOP_K,
                   "mla": MLA_DIMS},
        "variants": variants,
        "skipped": {} if rope_scaling_missing is None else {
            "llama_rope_scaling": rope_scaling_missing},
        "kv_bytes_per_token": {"mha": per_token(mha),
                               "gqa": per_token(variants["llama"]["kv_bytes"]),
                               "mla": per_token(variants["mla"]["kv_bytes"])},
        "seconds": time.perf_counter() - start,
    }
    text = json.dumps(results, indent=2) + "\n"
    for path in () if quick else (RESULTS, BOOK_COPY):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print_summary(results)


def print_summary(r: dict) -> None:
    """The stored numbers as short tables."""
    m = r["machine"]
    print(f"\n{m['cpu']} x{m['cpu_count']}, threads: {m['threads']}, load "
          f"{m['load_average_1min']:.1f}-{m['load_average_1min_at_end']:.1f}, torch {m['torch']}")
    print(f"{'CPU ms, tfbook / HF':34s}{'prefill':>16s}{'ratio':>7s}{'decode, a token':>18s}"
          f"{'ratio':>7s}{'wall ratios':>13s}")
    rows = [(v["label"], v["prefill"], v["decode"]) for v in r["variants"].values()]
    if "mla" in r["variants"]:
        mla = r["variants"]["mla"]
        rows.insert(len(rows), ("  absorbed form", mla["prefill_absorbed"], mla["decode_absorbed"]))
    for label, p, d in rows:
        print(f"{label:34s}{p['tfbook_cpu_ms']['median']:7.1f} /{p['hf_cpu_ms']['median']:7.1f}"
              f"{p['speed_ratio']['median']:7.2f}{d['tfbook_cpu_ms']['median']:8.2f} /"
              f"{d['hf_cpu_ms']['median']:8.2f}{d['speed_ratio']['median']:7.2f}"
              f"{p['wall_speed_ratio']['median']:7.2f}{d['wall_speed_ratio']['median']:6.2f}")
    print("max |tfbook - HF| / max |HF| (prefill): " + ", ".join(
        f"{k} {v['check']['max_abs_diff'] / v['check']['max_abs_reference']:.0e}"
        for k, v in r["variants"].items()))
    print("KV bytes per token (4 layers, float32): measured tfbook / HF / formula")
    for name, kv in r["kv_bytes_per_token"].items():
        print(f"  {name}: {kv['measured_tfbook']:.0f} / {kv['measured_hf']:.0f} / "
              f"{kv['formula']}")
    mis = r["variants"]["mistral"]["kv_bytes"]
    print(f"  mistral after {mis['positions']} positions: tfbook {mis['tfbook']} B "
          f"({mis['tfbook_positions_held']} held), HF {mis['hf']} B")
    print(f"{r['seconds']:.0f} s")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(quick="--quick" in args,
         threads=int(args[args.index("--threads") + 1]) if "--threads" in args else THREADS)
