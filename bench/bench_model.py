"""Benchmark tfbook's models against PyTorch and sentence-transformers, side by side.

    python bench/bench_model.py            # prints a table, writes bench/results/model.json

1. GPT forward + backward, tokens/s: tfbook's GPT vs the same architecture assembled from
   nn.TransformerEncoderLayer (pre-LN, causal), same weights, same batch. Goal >= 0.9x.
   Also whole training steps (forward, backward, clipping, AdamW) through tfbook.train's loop
   for both models.
2. Sentence encoding, sentences/s: tfbook's all-MiniLM-L6-v2 vs sentence-transformers, same
   64 sentences in one batch; both sides tokenise with the same HF tokenizer inside the timed
   call, so the difference is the model. Goal >= 0.8x.
3. Attention cost vs sequence length: CPU time and peak memory of the manual attention
   (materialises the (T, T) weights) vs torch's fused kernel, with the fitted exponent.

Each timing is a median over rounds in which the candidates take turns, after a warm-up, all
in one process, so the ratios compare like with like even on a busy machine.
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

from tfbook.attention import scaled_dot_product_attention  # noqa: E402
from tfbook.checkpoints.minilm import load_minilm, minilm_dir, sentence_embeddings  # noqa: E402
from tfbook.masks import causal_mask  # noqa: E402
from tfbook.models.gpt import GPT, GPTConfig  # noqa: E402
from tfbook.torch_reference import copy_encoder_layer  # noqa: E402
from tfbook.train.loop import TrainConfig, train  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
RESULTS = ROOT / "bench" / "results" / "model.json"

# The GPT benchmark configuration of the issue: 6 layers, width 384, 6 heads, T=256, B=8.
# The vocabulary is kept small (4096) so that the blocks, not the output layer, dominate.
GPT_BENCH = replace(
    GPTConfig.tiny(), max_len=256, vocab_size=4096, n_layers=6, n_heads=6, d_model=384,
    activation="gelu",  # torch.nn layers offer the erf GELU, so both sides use it
)
B, T = 8, 256


def median_times(
    fns: dict, repeats: int, warmup: int = 2, clock=time.perf_counter
) -> dict[str, float]:
    """Median seconds of each fn() over `repeats` rounds, after `warmup` rounds.

    The candidates take turns inside every round, so a burst of load from another process
    slows all of them alike and their ratio stays fair. `clock` is wall-clock time by default;
    time.process_time counts only the CPU time this process got (all its threads).
    """
    times = {name: [] for name in fns}
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            if round_ >= warmup:
                times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cpu_model() -> str:
    """The processor's name: platform.processor() is empty on Linux, /proc/cpuinfo has it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(**extra) -> dict:
    """What a benchmark's numbers depend on, recorded beside them: versions, threads, CPU,
    the OpenMP wait policy and the load. Other processes compete for the CPU when the load
    is well above `threads`: the ratios stay fair (interleaved runs), absolute speeds do not."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average_1min": os.getloadavg()[0], **extra}


class TorchGPT(nn.Module):
    """The GPT architecture from torch.nn parts: the reference for benchmark 1."""

    def __init__(self, ours: GPT) -> None:
        super().__init__()
        c = ours.config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Parameter(ours.pos_emb.weight.detach().clone())
        layer = nn.TransformerEncoderLayer(
            c.d_model, c.n_heads, 4 * c.d_model, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, c.n_layers, enable_nested_tensor=False)
        for dst, block in zip(self.encoder.layers, ours.blocks, strict=True):
            copy_encoder_layer(dst, block)
        self.norm_f = nn.LayerNorm(c.d_model)
        with torch.no_grad():
            self.tok_emb.weight.copy_(ours.tok_emb.weight)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied, like ours
        self.register_buffer("causal", ~causal_mask(c.max_len), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B_, T_ = idx.size()
        x = self.tok_emb(idx) + self.pos_emb[:T_]  # (B, T, C)
        x = self.encoder(x, mask=self.causal[:T_, :T_], is_causal=True)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V)


def bench_gpt() -> dict:
    """Forward + backward tokens/s of tfbook's GPT and of the torch.nn assembly.

    Measured twice for tfbook: with torch's kernels for attention, LayerNorm and GELU (the
    defaults attention="torch", fused_norm=True, fused_activation=True) and with our own
    code for every one of those (attention="reference", fused_norm=False,
    fused_activation=False).
    """
    torch.manual_seed(0)
    ours = GPT(GPT_BENCH).train()
    ours_own_code = GPT(replace(GPT_BENCH, attention="reference", fused_norm=False,
                                fused_activation=False)).train()
    ours_own_code.load_state_dict(ours.state_dict())
    theirs = TorchGPT(ours).train()
    idx = torch.randint(0, GPT_BENCH.vocab_size, (B, T))
    targets = torch.randint(0, GPT_BENCH.vocab_size, (B, T))
    with torch.no_grad():
        diff = (ours(idx).logits - theirs(idx)).abs().max().item()

    def step(model, forward):
        def run():
            model.zero_grad(set_to_none=True)
            logits = forward(idx)
            F.cross_entropy(logits.view(B * T, -1), targets.view(-1)).backward()
        return run

    t = median_times({
        "ours": step(ours, lambda i: ours(i).logits),
        "own_code": step(ours_own_code, lambda i: ours_own_code(i).logits),
        "theirs": step(theirs, theirs),
    }, repeats=5)
    t_ours, t_theirs = t["ours"], t["theirs"]

    # whole training steps through tfbook's loop (forward, backward, clipping, AdamW)
    steps = TrainConfig(steps=3, warmup=1)

    def loop(model, logits_of):
        def loss_fn(model_, batch, label_smoothing):
            return F.cross_entropy(logits_of(batch[0]).view(B * T, -1), batch[1].view(-1))
        return lambda: train(model, lambda g: (idx, targets), steps, loss_fn=loss_fn,
                             progress=False)

    t_loop = median_times({
        "ours": loop(ours, lambda i: ours(i).logits),
        "theirs": loop(theirs, theirs),
    }, repeats=3, warmup=1)
    return {
        "config": asdict(GPT_BENCH) | {"B": B, "T": T},
        "max_abs_logit_diff": diff,
        "tfbook_tokens_per_s": B * T / t_ours,
        "torch_nn_tokens_per_s": B * T / t_theirs,
        "ratio": t_theirs / t_ours,
        "train_step_tfbook_tokens_per_s": steps.steps * B * T / t_loop["ours"],
        "train_step_torch_nn_tokens_per_s": steps.steps * B * T / t_loop["theirs"],
        "train_step_ratio": t_loop["theirs"] / t_loop["ours"],
        "tfbook_unfused_tokens_per_s": B * T / t["own_code"],
        "unfused_ratio": t_theirs / t["own_code"],
        "goal": 0.9,
    }


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention lets every token look at every other token.",
    "A transformer block adds attention and a feed-forward network to a residual stream.",
    "Sentence embeddings place similar meanings close together.",
    "Mean pooling averages the token vectors of the real tokens only.",
    "Short.",
    "Padding makes a batch rectangular, and the mask hides the padding from attention.",
    "The model was trained on a billion sentence pairs with a contrastive objective.",
] * 8  # 64 sentences


def bench_minilm() -> dict:
    """Sentences/s of tfbook's MiniLM vs sentence-transformers, same batch of 64."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    reference = SentenceTransformer(str(minilm_dir()), device="cpu")
    ours = load_minilm()

    def encode_ours():
        batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=256,
                          return_tensors="pt")
        return sentence_embeddings(ours, batch["input_ids"], batch["attention_mask"])

    def encode_theirs():
        return reference.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_tensor=True)

    diff = (encode_ours() - encode_theirs()).abs().max().item()
    t = median_times({"ours": encode_ours, "theirs": encode_theirs}, repeats=7)
    t_ours, t_theirs = t["ours"], t["theirs"]
    return {
        "n_sentences": len(SENTENCES),
        "max_abs_embedding_diff": diff,
        "tfbook_sentences_per_s": len(SENTENCES) / t_ours,
        "sentence_transformers_sentences_per_s": len(SENTENCES) / t_theirs,
        "ratio": t_theirs / t_ours,
        "goal": 0.8,
    }


def attention_inputs(T_: int) -> tuple[torch.Tensor, ...]:
    """q, k, v of shape (1, 6, T, 64) and the (T, T) causal mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, T_, 64, generator=g) for _ in range(3))
    return q, k, v, causal_mask(T_)


def run_attention(method: str, q, k, v, mask) -> torch.Tensor:
    """One causal attention call, manual (tfbook, keeps the weights) or fused (torch)."""
    if method == "manual":
        return scaled_dot_product_attention(q, k, v, mask)[0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def peak_memory_mb(method: str, T_: int) -> float:
    """Peak extra resident memory (MB) of one attention call, measured in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--peak-memory", method, str(T_)],
        capture_output=True, text=True, check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def measure_peak_memory(method: str, T_: int) -> float:
    """In this process: resident memory sampled every 0.1 ms during one call, minus before."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    run_attention(method, *attention_inputs(16))  # load kernels before measuring
    inputs = attention_inputs(T_)
    before, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(1e-4)

    sampler = threading.Thread(target=sample)
    sampler.start()
    run_attention(method, *inputs)
    done.set()
    sampler.join()
    return max(peak[0] - before, 0) / 2**20


def bench_attention_cost() -> dict:
    """CPU time and peak memory of one causal attention call (B=1, H=6, D=64) vs T.

    CPU time of one thread rather than wall-clock time: a single call is short, and on a
    shared machine its wall-clock time measures the other processes as much as the attention
    (and idle worker threads spin, which inflates multi-threaded CPU time).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    for T_ in (128, 256, 512, 1024, 2048):
        inputs = attention_inputs(T_)
        repeats = 9 if T_ <= 512 else 4
        times = median_times(
            {m: partial(run_attention, m, *inputs) for m in ("manual", "fused")}, repeats, 3,
            clock=time.process_time,
        )
        rows.append({
            "T": T_, "manual_cpu_ms": 1e3 * times["manual"], "fused_cpu_ms": 1e3 * times["fused"],
            "speedup": times["manual"] / times["fused"],
            # the (H, T, T) float32 weights that the manual path must hold, for comparison
            "weights_matrix_mb": 6 * T_ * T_ * 4 / 2**20,
            "manual_peak_mb": peak_memory_mb("manual", T_),
            "fused_peak_mb": peak_memory_mb("fused", T_),
        })
    # fit time = a * T^p on the manual path from T = 256 on (below, fixed overheads weigh in):
    # p close to 2 means quadratic
    big = [r for r in rows if r["T"] >= 256]
    xs = torch.log(torch.tensor([r["T"] for r in big], dtype=torch.float64))
    ys = torch.log(torch.tensor([r["manual_cpu_ms"] for r in big], dtype=torch.float64))
    slope = (((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()).item()
    torch.set_num_threads(threads)
    return {"rows": rows, "manual_time_exponent": slope, "threads": 1}


def main() -> None:
    if sys.argv[1:2] == ["--peak-memory"]:  # child process of peak_memory_mb()
        print(measure_peak_memory(sys.argv[2], int(sys.argv[3])))
        return
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    gpt = bench_gpt()
    minilm = bench_minilm()
    cost = bench_attention_cost()
    results = {
        "machine": machine(),
        "gpt_forward_backward": gpt,
        "minilm_sentence_encoding": minilm,
        "attention_cost": cost,
        "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")

    print(f"{'benchmark':<34}{'tfbook':>14}{'reference':>14}{'ratio':>8}{'goal':>7}")
    print(f"{'GPT fwd+bwd (tokens/s)':<34}{gpt['tfbook_tokens_per_s']:>14.0f}"
          f"{gpt['torch_nn_tokens_per_s']:>14.0f}{gpt['ratio']:>8.2f}{gpt['goal']:>7.1f}")
    print(f"{'GPT train step, our loop (tok/s)':<34}"
          f"{gpt['train_step_tfbook_tokens_per_s']:>14.0f}"
          f"{gpt['train_step_torch_nn_tokens_per_s']:>14.0f}{gpt['train_step_ratio']:>8.2f}"
          f"{gpt['goal']:>7.1f}")
    print(f"{'  same, own kernels':<34}{gpt['tfbook_unfused_tokens_per_s']:>14.0f}"
          f"{gpt['torch_nn_tokens_per_s']:>14.0f}{gpt['unfused_ratio']:>8.2f}{'-':>7}")
    print(f"{'MiniLM encode (sentences/s)':<34}{minilm['tfbook_sentences_per_s']:>14.1f}"
          f"{minilm['sentence_transformers_sentences_per_s']:>14.1f}{minilm['ratio']:>8.2f}"
          f"{minilm['goal']:>7.1f}")
    print(f"  (max |diff|: GPT logits {gpt['max_abs_logit_diff']:.1e}, "
          f"MiniLM embeddings {minilm['max_abs_embedding_diff']:.1e})")
    print("\nattention, B=1 H=6 D=64, causal, one thread, CPU ms")
    print(f"{'T':>6}{'manual ms':>11}{'fused ms':>10}{'speedup':>9}"
          f"{'manual MB':>11}{'fused MB':>10}{'weights MB':>12}")
    for r in cost["rows"]:
        print(f"{r['T']:>6}{r['manual_cpu_ms']:>11.2f}{r['fused_cpu_ms']:>10.2f}"
              f"{r['speedup']:>9.1f}"
              f"{r['manual_peak_mb']:>11.1f}{r['fused_peak_mb']:>10.1f}"
              f"{r['weights_matrix_mb']:>12.1f}")
    print(f"manual attention CPU time ~ T^{cost['manual_time_exponent']:.2f} (fit on T >= 256)")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
