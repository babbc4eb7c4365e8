"""Decoding against the memory bound: the measurements the chapter book/fast/decoding_speed.md
quotes, on one machine, with that machine's record beside them.

    python bench/bench_decode.py           # a progress bar, a summary, and the results in
                                           # bench/results/decode.json and (for the chapter)
                                           # book/fast/data/decoding_speed.json
    python bench/bench_decode.py --quick   # two rounds of everything, nothing written
    python bench/bench_decode.py --when-quiet 2.5   # first wait (up to 6 hours) until the
                                                    # 1-minute load average is below 2.5

A decode step at batch 1 multiplies one vector by every weight matrix of the model, so it has
to read every weight from memory once, and the speed of that reading bounds the tokens per
second: bound = bandwidth (bytes/s) / bytes read per step.

1. Bandwidth: one 512 MiB float32 buffer read four ways, its sum on all threads and on one,
   and a matrix-vector product with it as an (8192, 16384) matrix stored by rows and by
   columns; the bandwidth of the bound is the largest of the four medians. With the number
   of threads that work in each (from /proc: the CPU time of each thread while it runs).
   The estimated peak: a (2048, 2048)
   float32 matrix product.
2. Layouts: GB/s of y = W x for each of SmolLM2's matrix shapes, 30 matrices a shape (one for
   the output layer), stored by rows and by columns, on 1 and on 2 threads (with the threads
   that work), all timed in turns so that between two runs of one group the others read
   hundreds of MB and none stays in the cache.
3. Roofline points: the (3072, 576) gate|value product with B = 1 ... 256 input rows, both
   layouts: flop/s against arithmetic intensity.
4. Decoding steps, the chapter's protocol: its chat prompt, then cached greedy steps of the
   plain, packed and int8 models taking turns, ROUNDS rounds of STEPS steps; median, min, max.
5. One step split: the step's matrix products timed on their own (float32; for int8 the
   integer products, torch._int_mm, and the rounding and scaling around them), in the same
   rounds as whole steps; "the rest" is the difference.
6. torch._int_mm alone against F.linear for each shape, with 1 and 256 input rows.
7. Batch: tokens/s of cached steps of the packed model with B = 1, 2, 4, 8 copies of the prompt.
8. tfbook's generate (plain, packed, int8) beside Hugging Face's, 64 tokens after a 16-token
   prompt (issue 17's comparison).

Every timing is a median over rounds in which the candidates take turns (bench_model.py's
method), two threads unless said, OMP_WAIT_POLICY=PASSIVE, float32. Absolute speeds depend on
the machine and its load (recorded by `machine()`); ratios measured in the same rounds are what
to compare.
"""

import os
import sys

if __name__ == "__main__":  # run as a script: before torch starts its thread pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402

import tfbook.quantize as quantize  # noqa: E402
from tfbook.checkpoints.smollm2 import (  # noqa: E402
    load_smollm2,
    load_smollm2_tokenizer,
    smollm2_chat_ids,
)
from tfbook.packing import column_major, pack_for_decoding  # noqa: E402
from tfbook.quantize import int8_rows, quantise_linears  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "decode.json"
BOOK_COPY = ROOT / "book" / "fast" / "data" / "decoding_speed.json"
THREADS = 2
QUESTION = "Why is the sky blue? Answer in two sentences."  # the chapter's prompt
ROUNDS, STEPS = 15, 8  # decoding steps: rounds of steps, the models in turn
REPEATS = 9  # rounds of every other timing
BATCHES = (1, 2, 4, 8)
ROOF_ROWS = tuple(2**i for i in range(9))  # B = 1 ... 256
GB = 1e9
SHAPES = {"q|k|v": (960, 576), "W_O": (576, 576), "gate|value": (3072, 576),
          "down": (576, 1536), "output layer": (49152, 576)}  # SmolLM2's (O, K), packed


def timed(fns: dict, repeats: int, warmup: int = 1, progress=None) -> dict:
    """Each fn() in turn, `warmup` + `repeats` rounds -> {name: wall seconds of the timed
    rounds}."""
    wall = {name: [] for name in fns}
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_ >= warmup:
                wall[name].append(time.perf_counter() - start)
        if progress is not None:
            progress.update(1)
    return wall


def _thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process, from /proc."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[tid] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def threads_busy(fn, seconds: float = 0.5) -> int | None:
    """How many threads of this process work while fn() runs over and over for `seconds`:
    those with at least a quarter of the busiest thread's CPU time. Unlike CPU time over wall
    time, this does not fall when other processes take turns on the cores. None without
    Linux's /proc/self/task."""
    if not os.path.isdir("/proc/self/task"):
        return None
    fn()
    before, start = _thread_ticks(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
    after = _thread_ticks()
    work = [after[tid] - before.get(tid, 0) for tid in after]
    return sum(w >= max(work) / 4 for w in work) if max(work) > 0 else None


def summary(seconds: list[float], work: float = 1.0) -> dict:
    """work / time as median, min and max over the rounds (min rate from the slowest round)."""
    if not seconds or min(seconds) <= 0:
        raise ValueError(f"summary needs positive times, got {seconds}")
    return {"median": work / statistics.median(seconds), "min": work / max(seconds),
            "max": work / min(seconds)}


def intensity(rows: int, n_out: int, n_in: int, nbytes: int = 4) -> float:
    """Flop per byte of y = x W^T with x (rows, n_in), W (n_out, n_in): 2 rows O K flops over
    the bytes of W, x and y, `nbytes` a number."""
    for name, value in (("rows", rows), ("n_out", n_out), ("n_in", n_in), ("nbytes", nbytes)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"intensity needs a positive int {name}, got {value!r}")
    return 2 * rows * n_out * n_in / (nbytes * (n_out * n_in + rows * (n_out + n_in)))


def bandwidth(progress) -> dict:
    """GB/s of reading one 512 MiB float32 buffer: its sum, and y = x W^T with the buffer as
    an (8192, 16384) matrix by rows and by columns; the largest is the bound's bandwidth."""
    buffer = torch.ones(128 * 1024 * 1024)  # 512 MiB = 537 MB
    rows = buffer.view(8192, 16384)  # (O, K) strides (K, 1)
    columns = buffer.view(16384, 8192).t()  # (O, K) strides (1, O)
    x = torch.ones(1, 16384)
    fns = {"sum": buffer.sum, "matvec, rows": lambda: F.linear(x, rows),
           "matvec, columns": lambda: F.linear(x, columns)}
    t = timed(fns, REPEATS, progress=progress)
    out = {name: {"GB_per_s": summary(ts, buffer.numel() * 4 / GB),
                  "threads_busy": threads_busy(fns[name])} for name, ts in t.items()}
    torch.set_num_threads(1)  # what one core reads
    one = timed({"sum": buffer.sum}, REPEATS, progress=progress)["sum"]
    out["sum, 1 thread"] = {"GB_per_s": summary(one, buffer.numel() * 4 / GB), "threads_busy": 1}
    torch.set_num_threads(THREADS)
    best = max(out, key=lambda name: out[name]["GB_per_s"]["median"])
    return {"reads": out, "bytes": buffer.numel() * 4, "largest": best,
            "GB_per_s": out[best]["GB_per_s"]["median"]}


def peak(progress) -> dict:
    """Estimated peak arithmetic rate: GFLOP/s of a (2048, 2048) float32 matrix product."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    t = timed({"matmul": lambda: a @ b}, REPEATS, progress=progress)["matmul"]
    return {"shape": [2048, 2048, 2048], "GFLOP_per_s": summary(t, 2 * 2048**3 / GB)}


def layouts(progress, copies: int = 30) -> dict:
    """GB/s of y = W x (one input row) for each shape by rows and by columns, on 1 and on 2
    threads; `copies` matrices a shape (one for the output layer, 113 MB), all in turn."""
    out: dict = {}
    fns, nbytes = {}, {}
    for name, (n_out, n_in) in SHAPES.items():
        ws = [torch.randn(n_out, n_in) for _ in range(1 if name == "output layer" else copies)]
        x = torch.randn(1, n_in)
        for layout, mats in (("rows", ws), ("columns", [column_major(w) for w in ws])):
            fns[name, layout] = lambda mats=mats, x=x: [F.linear(x, w) for w in mats]
            nbytes[name, layout] = sum(w.numel() * 4 for w in mats)
    for threads in (1, THREADS):
        torch.set_num_threads(threads)
        t = timed(fns, REPEATS, progress=progress)
        for (name, layout), ts in t.items():
            row = out.setdefault(name, {"shape": list(SHAPES[name])})
            row[f"{layout}, {threads} thread" + "s" * (threads > 1)] = {
                "GB_per_s": summary(ts, nbytes[name, layout] / GB),
                "threads_busy": threads_busy(fns[name, layout]) if threads > 1 else 1}
    torch.set_num_threads(THREADS)
    return out


def roofline_points(progress, copies: int = 30) -> dict:
    """GFLOP/s of y = x W^T with x (B, 576) and 30 gate|value matrices (3072, 576), both
    layouts, for B in ROOF_ROWS; with each B's intensity."""
    n_out, n_in = SHAPES["gate|value"]
    ws = [torch.randn(n_out, n_in) for _ in range(copies)]
    layouts_ = {"rows": ws, "columns": [column_major(w) for w in ws]}
    xs = {b: torch.randn(b, n_in) for b in ROOF_ROWS}
    t = timed({(b, layout): lambda x=xs[b], mats=mats: [F.linear(x, w) for w in mats]
               for b in ROOF_ROWS for layout, mats in layouts_.items()}, REPEATS,
              progress=progress)
    return {"shape": [n_out, n_in], "copies": copies, "points": [
        {"rows": b, "layout": layout, "flop_per_byte": intensity(b, n_out, n_in),
         "GFLOP_per_s": summary(ts, copies * 2 * b * n_out * n_in / GB),
         "threads_busy": threads_busy(lambda x=xs[b], w=layouts_[layout][0]: F.linear(x, w),
                                      seconds=0.3)}
        for (b, layout), ts in t.items()]}


def step_bytes(model, context: int, batch: int = 1) -> dict:
    """Bytes one decode step reads: every parameter and buffer once (the tied embedding once;
    an untied embedding's lookup reads one row, not counted), and the keys and values of
    `context` earlier positions for each of `batch` sequences."""
    if not isinstance(context, int) or context < 0 or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"step_bytes needs context >= 0 and batch >= 1 as ints, got "
                         f"{context!r}, {batch!r}")
    tied = getattr(model.lm_head, "weight", None) is model.tok_emb.weight
    seen = set() if tied else {id(model.tok_emb.weight)}
    weights = 0
    for p in [*model.parameters(), *model.buffers()]:
        if id(p) not in seen:
            seen.add(id(p))
            weights += p.numel() * p.element_size()
    c = model.config
    head_size = c.d_model // c.n_heads
    kv = 2 * c.n_layers * (c.n_kv_heads or c.n_heads) * head_size * context * 4 * batch
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def decoder(model, prompt: list[int], steps: int, batch: int = 1):
    """A function that makes one cached greedy step of `model` per call (the prompt's pass
    done here, untimed), with room for `steps` calls; its `tokens` list grows by a step."""
    with torch.no_grad():
        cache = model.new_cache(len(prompt) + steps + 1)
        x = torch.tensor([prompt] * batch)
        token = model(x, cache=cache, last_only=True).logits.argmax(-1)  # (B, 1)
    tokens = [token]

    def step():
        with torch.no_grad():
            tokens.append(model(tokens[-1], cache=cache).logits.argmax(-1))  # (B, 1)

    step.tokens = tokens
    return step


def decode_steps(models: dict, prompt: list[int], progress) -> dict:
    """Cached greedy steps per second of each model: ROUNDS rounds of STEPS steps, in turn."""
    steppers = {name: decoder(m, prompt, (ROUNDS + 1) * STEPS) for name, m in models.items()}
    t = timed({name: lambda s=s: [s() for _ in range(STEPS)] for name, s in steppers.items()},
              ROUNDS, progress=progress)
    tokens = {name: torch.cat(s.tokens, 1)[0].tolist() for name, s in steppers.items()}
    return {"tokens_per_s": {name: summary(ts, STEPS) for name, ts in t.items()},
            "same_tokens_as_plain": {name: tokens[name] == tokens["plain"] for name in tokens},
            "steps": len(tokens["plain"])}


def record_products(model, prompt: list[int]) -> list[tuple]:
    """The matrix products of one cached step after `prompt`, in order: ("float", x, weight,
    bias) for each F.linear, ("int8", x, codes, scale) for each int8_matmul."""
    step, records = decoder(model, prompt, 1), []
    linear, int8_matmul = F.linear, quantize.int8_matmul

    def recording_linear(x, weight, bias=None):
        records.append(("float", x, weight, bias))
        return linear(x, weight, bias)

    def recording_int8(x, q, scale):
        records.append(("int8", x, q, scale))
        return int8_matmul(x, q, scale)

    F.linear, quantize.int8_matmul = recording_linear, recording_int8
    try:
        step()
    finally:
        F.linear, quantize.int8_matmul = linear, int8_matmul
    return records


def step_parts(models: dict, prompt: list[int], progress) -> dict:
    """Milliseconds of one step of each model, of its float32 products alone, and for int8
    of its integer products and of its rounding and scaling alone, all in the same rounds."""
    fns, counts = {}, {}
    for name, m in models.items():
        records = record_products(m, prompt)
        counts[name] = len(records)
        fns[name, "step"] = decoder(m, prompt, REPEATS * 4 + 4)
        floats = [(x, w, b) for kind, x, w, b in records if kind == "float"]
        ints = [(x, q, s) for kind, x, q, s in records if kind == "int8"]
        if floats:
            fns[name, "float32 products"] = lambda fl=floats: [F.linear(*r) for r in fl]
        if ints:
            coded = [(int8_rows(x)[0], q) for x, q, _ in ints]
            accs = [torch._int_mm(qx, q.T) for qx, q in coded]

            def rounding(ints=ints, accs=accs):
                for (x, _, s), acc in zip(ints, accs, strict=True):
                    _, sx = int8_rows(x)  # what int8_matmul does before and after _int_mm
                    acc.float() * sx[:, None] * s.float()[None, :]

            fns[name, "integer products"] = lambda coded=coded: [
                torch._int_mm(qx, q.T) for qx, q in coded]
            fns[name, "rounding and scaling"] = rounding
    t = timed(fns, REPEATS * 4, progress=progress)
    out = {name: {"products": counts[name]} for name in models}
    for (name, part), ts in t.items():
        out[name][f"{part}_ms"] = 1e3 * statistics.median(ts)
    for parts in out.values():
        parts["rest_ms"] = parts["step_ms"] - sum(v for k, v in parts.items()
                                                  if k.endswith("_ms") and k != "step_ms")
    return out


def int_mm_alone(progress, rows=(1, 256)) -> dict:
    """Milliseconds of F.linear (float32, rows) against torch._int_mm (int8 codes) and the
    whole int8_matmul, for each shape with 1 and 256 input rows; one matrix a shape."""
    fns = {}
    for name, (n_out, n_in) in SHAPES.items():
        w = torch.randn(n_out, n_in)
        q, s = quantize.int8_per_channel(w)
        for n in rows:
            x = torch.randn(n, n_in)
            qx, _ = int8_rows(x)
            fns[name, n, "F.linear"] = lambda x=x, w=w: F.linear(x, w)
            fns[name, n, "torch._int_mm"] = lambda qx=qx, q=q: torch._int_mm(qx, q.T)
            fns[name, n, "int8_matmul"] = lambda x=x, q=q, s=s: quantize.int8_matmul(x, q, s)
    t = timed(fns, REPEATS, progress=progress)
    out: dict = {}
    for (name, n, what), ts in t.items():
        out.setdefault(name, {"shape": list(SHAPES[name])}).setdefault(str(n), {})[what] = \
            1e3 * statistics.median(ts)
    return out


def batch_steps(model, prompt: list[int], progress) -> dict:
    """Tokens/s of cached greedy steps of `model` with B copies of the prompt, B in BATCHES."""
    steppers = {b: decoder(model, prompt, (REPEATS + 1) * 4, batch=b) for b in BATCHES}
    t = timed({b: lambda s=s: [s() for _ in range(4)] for b, s in steppers.items()}, REPEATS,
              progress=progress)
    return {str(b): summary(ts, 4 * b) for b, ts in t.items()}


def generate_with_hf(models: dict, progress) -> dict:
    """Tokens/s of generate (64 new tokens after a 16-token prompt) for each model and for
    Hugging Face's on the same weights, in turn; whether the tokens equal HF's."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from bench_generate import check_length, hf_generate, keeping, prompt_ids
    from transformers.utils import logging as hf_logging

    from tfbook.checkpoints.smollm2 import hf_llama_from_gguf, read_smollm2_gguf
    from tfbook.generate.search import generate

    hf_logging.set_verbosity_error()
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    (x,) = prompt_ids((16,))
    out, fns = {}, {}
    with torch.no_grad():
        for who, m in models.items():
            fns[who] = keeping(out, who, lambda m=m: generate(m, x, 64).tokens)
        fns["hf"] = keeping(out, "hf", lambda: hf_generate(hf, x, 64))
        t = timed(fns, 5, progress=progress)
    for who in fns:
        check_length(out[who], x, 64, who)
    return {"prompt_tokens": 16, "new_tokens": 64,
            "tokens_per_s": {who: summary(ts, 64) for who, ts in t.items()},
            "same_tokens_as_hf": {who: torch.equal(out[who], out["hf"]) for who in models}}


def blas() -> str:
    """torch's BLAS as its build configuration names it (e.g. "mkl")."""
    config = torch.__config__.show()
    return next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown")


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
    except OSError:
        return ""


def main(quick: bool = False) -> None:
    """Run every measurement and store it; `quick`: two rounds each, nothing written."""
    global ROUNDS, REPEATS
    if quick:
        ROUNDS, REPEATS = 2, 2
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    record = machine(blas=blas(), cpu_model=cpu_model())  # the load as the run starts
    tokenizer = load_smollm2_tokenizer()
    prompt = smollm2_chat_ids(tokenizer, [{"role": "user", "content": QUESTION}])
    models = {"plain": load_smollm2(), "packed": pack_for_decoding(load_smollm2()),
              "int8": pack_for_decoding(quantise_linears(load_smollm2()))}
    rounds = 8 * (REPEATS + 1) + (ROUNDS + 1) + (4 * REPEATS + 1) + 6
    with tqdm(total=rounds, desc="bench_decode", unit="round") as bar:
        bw = bandwidth(bar)
        flops = peak(bar)
        layout = layouts(bar)
        roof = roofline_points(bar)
        steps = decode_steps(models, prompt, bar)
        parts = step_parts(models, prompt, bar)
        int_mm = int_mm_alone(bar)
        batch = batch_steps(models["packed"], prompt, bar)
        with_hf = generate_with_hf(models, bar)
    context = len(prompt) + (ROUNDS + 1) * STEPS // 2  # the cache half way through the steps
    nbytes = {name: step_bytes(m, context) for name, m in models.items()}
    bounds = {name: bw["GB_per_s"] * GB / b["total"] for name, b in nbytes.items()}
    results = {
        "machine": {**record, "load_average_1min_at_end": os.getloadavg()[0]},
        "protocol": {
            "threads": THREADS, "omp_wait_policy": "PASSIVE", "dtype": "float32",
            "prompt": QUESTION, "prompt_tokens": len(prompt), "rounds": ROUNDS,
            "steps_per_round": STEPS, "repeats_of_other_timings": REPEATS,
            "method": "candidates timed in turn within each round; medians over rounds"},
        "bandwidth": bw, "peak": flops, "layouts": layout, "roofline": roof,
        "bytes_per_step": nbytes, "context_positions": context,
        "bound_tokens_per_s": bounds, "decode": steps, "step_parts": parts,
        "int_mm_alone": int_mm, "batch": {"model": "packed", "tokens_per_s": batch},
        "generate_with_hf": with_hf, "seconds": time.perf_counter() - start,
    }
    text = json.dumps(results, indent=2) + "\n"
    for path in () if quick else (RESULTS, BOOK_COPY):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print_summary(results)


def print_summary(r: dict) -> None:
    """The stored numbers as short tables."""
    m = r["machine"]
    print(f"\n{m['cpu_model'] or m['cpu']} x{m['cpu_count']}, {m['threads']} threads, "
          f"BLAS {m['blas']}, load {m['load_average_1min']:.1f}, torch {m['torch']}")
    for name, read in r["bandwidth"]["reads"].items():
        print(f"{name:18s}{read['GB_per_s']['median']:7.1f} GB/s  threads busy "
              f"{read['threads_busy']}")
    print(f"peak estimate {r['peak']['GFLOP_per_s']['median']:.0f} GFLOP/s")
    for name, row in r["layouts"].items():
        print(f"{name:14s}" + "".join(f"  {k} {v['GB_per_s']['median']:5.1f} "
                                      f"({v['threads_busy']})" for k, v in row.items()
                                      if k != "shape"))
    for name, s in r["decode"]["tokens_per_s"].items():
        print(f"{name:8s}{s['median']:7.1f} tokens/s ({s['min']:.1f}-{s['max']:.1f}), "
              f"{s['median'] / r['bound_tokens_per_s'][name]:.0%} of its bound")
    for name, parts in r["step_parts"].items():
        print(f"{name:8s}" + "  ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    print(f"batch: {({b: round(s['median'], 1) for b, s in r['batch']['tokens_per_s'].items()})}")
    print(f"{r['seconds']:.0f} s")


def wait_until_quiet(load: float, hours: float = 6.0, every: float = 30.0) -> None:
    """Sleep until the 1-minute load average is below `load` (a shared machine's other work
    slows memory-bound timings far more than their ratios), at most `hours`."""
    deadline = time.time() + hours * 3600
    while os.getloadavg()[0] >= load and time.time() < deadline:
        print(f"load {os.getloadavg()[0]:.1f} >= {load}: waiting", flush=True)
        time.sleep(every)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--when-quiet" in args:
        wait_until_quiet(float(args[args.index("--when-quiet") + 1]))
    main(quick="--quick" in args)
