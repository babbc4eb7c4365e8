"""tfbook.train: windows, schedules against their formulas, clipping == torch, checkpoints,
determinism, and a resumed run equal to an uninterrupted one."""

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.losses import IGNORE_INDEX
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.train.checkpoint import load_checkpoint, save_checkpoint
from tfbook.train.data import (
    pad_sequences,
    random_windows,
    seq2seq_batch,
    sequential_windows,
    split_stream,
)
from tfbook.train.loop import TrainConfig, evaluate, train
from tfbook.train.optim import adamw, clip_grad_norm, global_grad_norm, param_groups
from tfbook.train.schedules import inverse_sqrt, warmup_cosine, warmup_linear

CONFIG = dataclasses.replace(GPTConfig.tiny(), max_len=16, d_model=32, n_layers=1)


def stream(n=2000, seed=0):
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


# --- data ----------------------------------------------------------------------------------

def test_windows_are_shifted_by_one():
    ids = torch.arange(100)
    x, y = random_windows(ids, 5, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8)
    assert torch.equal(y, x + 1)  # in arange, the next token is the id plus one
    again = random_windows(ids, 5, 8, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x)  # the generator decides the windows


def test_split_and_sequential_windows_cover_the_stream_once():
    ids = torch.arange(1000)
    train_ids, val_ids = split_stream(ids, 0.1)
    assert len(train_ids) == 900 and torch.equal(torch.cat([train_ids, val_ids]), ids)
    batches = sequential_windows(val_ids, 4, 10)
    xs = torch.cat([x for x, _ in batches]).flatten()
    assert torch.equal(xs, val_ids[: len(xs)]) and len(xs) == 90  # (100 - 1) // 10 windows
    assert all(torch.equal(y, x + 1) for x, y in batches)


def test_seq2seq_batch_pads_and_ignores_padding():
    batch = seq2seq_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0, bos_id=10)
    assert batch["src"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["src_mask"].tolist() == [[True] * 3, [True, False, False]]
    assert batch["tgt_in"].tolist() == [[10, 1, 2], [10, 3, 4]]
    assert batch["labels"].tolist() == [[1, 2, IGNORE_INDEX], [3, 4, 9]]
    ids, mask = pad_sequences([[1], [2, 3]], pad_id=-1)
    assert ids.tolist() == [[1, -1], [2, 3]] and mask.sum() == 3


def test_data_bad_input():
    with pytest.raises(TypeError, match="1-D integer tensor"):
        random_windows(torch.randn(50), 2, 4)
    with pytest.raises(ValueError, match="T \\+ 1 = 11 tokens .* got 5 tokens"):
        random_windows(torch.arange(5), 2, 10)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        random_windows(torch.arange(50), 0, 4)
    with pytest.raises(ValueError, match=r"val_fraction must lie in \(0, 1\), got 1.5"):
        split_stream(torch.arange(10), 1.5)
    with pytest.raises(ValueError, match="pair up, got 2 and 1"):
        seq2seq_batch([[1], [2]], [[3]], 0, 1)
    with pytest.raises(ValueError, match="empty"):
        seq2seq_batch([[1]], [[]], 0, 1)
    for bad in ("0", 0.0, True, None):
        with pytest.raises(TypeError, match=rf"pad_id must be an int token id, got {bad!r}"):
            pad_sequences([[1, 2], [3]], bad)
    with pytest.raises(TypeError, match=r"bos_id must be an int token id, got '<s>'"):
        seq2seq_batch([[1]], [[2]], 0, "<s>")
    with pytest.raises(ValueError, match="seqs: need at least one sequence to pad, got none"):
        pad_sequences([], 0)
    for bad, message in (("ab", "seqs must be a list of sequences of int token ids, got str"),
                         (torch.zeros(2, 2), "seqs must be a list of sequences .* got Tensor"),
                         ([[1], "ab"], r"seqs\[1\] must be a list of int token ids, got str"),
                         ([[1], [2.0]], r"seqs\[1\] must be a list of int token ids, got list"),
                         ([[1], 5], r"seqs\[1\] must be a list of int token ids, got int")):
        with pytest.raises(TypeError, match=message):
            pad_sequences(bad, 0)
    with pytest.raises(TypeError, match=r"targets\[0\] must be a list of int token ids"):
        seq2seq_batch([[1]], ["ab"], 0, 1)
    ids, _ = pad_sequences([torch.tensor([4, 5]), (6,)], 0)  # tensors and tuples of ids
    assert ids.tolist() == [[4, 5], [6, 0]]
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        random_windows(torch.arange(50), 2, 4, generator=0)


# --- schedules -----------------------------------------------------------------------------

def test_warmup_cosine_formula():
    total, warmup, lo = 100, 10, 0.1
    for t in range(warmup):
        assert warmup_cosine(t, total, warmup, lo) == pytest.approx((t + 1) / warmup)
    for t in range(warmup, total):
        p = (t - warmup) / (total - 1 - warmup)
        expected = lo + (1 - lo) * (1 + math.cos(math.pi * p)) / 2
        assert warmup_cosine(t, total, warmup, lo) == pytest.approx(expected)
    assert warmup_cosine(warmup, total, warmup, lo) == 1.0
    assert warmup_cosine(total - 1, total, warmup, lo) == pytest.approx(lo)


def test_warmup_linear_formula():
    for t in range(100):
        assert warmup_linear(t, 100, 0, 0.0) == pytest.approx(1 - t / 100)
    assert warmup_linear(4, 100, 5, 0.2) == 1.0
    assert warmup_linear(55, 100, 5, 0.2) == pytest.approx(1 - 0.8 * 50 / 95)


def test_config_learning_rates_follow_the_schedules():
    cosine = TrainConfig(steps=50, lr=2e-3, warmup=5)
    assert [cosine.lr_at(t) for t in range(50)] == [2e-3 * warmup_cosine(t, 50, 5) for t in
                                                    range(50)]
    paper = TrainConfig(steps=50, lr=1.0, schedule="inverse_sqrt", warmup=10)
    peak = 512**-0.5 * 10**-0.5  # Vaswani et al.'s peak for C = 512, W = 10
    assert paper.lr_at(9) == pytest.approx(1.0)
    assert paper.lr_at(30) * peak == pytest.approx(inverse_sqrt(30, 512, 10))
    assert TrainConfig(steps=5, schedule="constant").lr_at(4) == 3e-3


def test_inverse_sqrt_is_vaswani_eq3():
    C, W = 512, 4000
    for n in (1, 100, 3999, 4000, 4001, 10**5):
        assert inverse_sqrt(n - 1, C, W) == pytest.approx(C**-0.5 * min(n**-0.5, n * W**-1.5))
    peak = max(range(8000), key=lambda t: inverse_sqrt(t, C, W))
    assert peak == W - 1  # the step counted from 1 is W


def test_schedule_bad_input():
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        warmup_cosine(0, 10, -1)
    with pytest.raises(ValueError, match="cannot be longer"):
        warmup_cosine(0, 10, 20)
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        inverse_sqrt(0, 64, 0)


# --- optimiser -----------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e3])
def test_clip_equals_torch(max_norm):
    torch.manual_seed(0)
    a, b = GPT(CONFIG), GPT(CONFIG)
    b.load_state_dict(a.state_dict())
    x = stream(200)[:128].view(8, 16)
    for model in (a, b):
        model(x, targets=x).loss.backward()
    ours = clip_grad_norm(list(a.parameters()), max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(list(b.parameters()), max_norm)
    assert torch.allclose(ours, theirs, rtol=1e-6)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-12)


def test_weight_decay_only_on_matrices():
    groups = param_groups(GPT(CONFIG), 0.1)
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and groups[0]["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[1]["weight_decay"] == 0.0
    n = sum(p.numel() for g in groups for p in g["params"])
    assert n == sum(p.numel() for p in GPT(CONFIG).parameters())  # tied matrix counted once


# --- the loop ------------------------------------------------------------------------------

def run(config, seed=1, **kwargs):
    torch.manual_seed(seed)
    model = GPT(dataclasses.replace(CONFIG, dropout=0.1))
    ids = stream()
    history = train(model, lambda g: random_windows(ids, 4, 16, g), config,
                    eval_batches=sequential_windows(stream(300, 1), 8, 16), progress=False,
                    **kwargs)
    return model, history


def test_seq2seq_loss_trains_an_encoder_decoder():
    from tfbook.models.transformer import Transformer, TransformerConfig
    from tfbook.train.loop import seq2seq_loss

    torch.manual_seed(0)
    config = dataclasses.replace(TransformerConfig.tiny(), src_vocab_size=12,
                                 tgt_vocab_size=12)
    model = Transformer(config)
    pairs = [([1, 2, 3], [3, 2, 1]), ([4, 5], [5, 4]), ([6, 7, 8, 9], [9, 8, 7, 6])]
    batch = seq2seq_batch([p[0] for p in pairs], [p[1] for p in pairs], pad_id=0, bos_id=11)
    # the padded target positions do not count: the loss equals the mean over real tokens
    logits = model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"],
                   tgt_mask=batch["tgt_mask"]).logits
    keep = batch["tgt_mask"]
    expected = torch.nn.functional.cross_entropy(logits[keep], batch["labels"][keep])
    assert torch.allclose(seq2seq_loss(model, batch), expected, atol=1e-6)
    history = train(model, lambda g: batch, TrainConfig(steps=40, lr=1e-2), loss_fn=seq2seq_loss,
                    eval_batches=[batch], progress=False)
    assert history.eval_loss[-1] < 0.2 * history.eval_loss[0]
    assert history.tokens[-1] == 40 * 9  # 9 real target tokens per batch


def test_loss_falls_and_init_loss_is_log_v():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    x = torch.arange(64).view(4, 16) % CONFIG.vocab_size  # a stream that repeats: learnable
    history = train(model, lambda g: (x, (x + 1) % CONFIG.vocab_size),
                    TrainConfig(steps=60, warmup=5), eval_batches=[(x, (x + 1) % 256)],
                    progress=False)
    assert history.eval_step[0] == -1
    assert abs(history.eval_loss[0] - math.log(CONFIG.vocab_size)) < 0.1  # untrained: uniform
    assert history.eval_loss[-1] < 0.5 * history.eval_loss[0]
    assert history.tokens[-1] == 60 * x.numel()


@THREAD_COUNTS
def test_same_seed_same_curve_and_other_seed_differs(n_threads):
    config = TrainConfig(steps=8, warmup=2, eval_every=4)
    with pinned_threads(n_threads):  # bit for bit: the same kernels in the same order
        _, h1 = run(config)
        _, h2 = run(config)
        _, h3 = run(dataclasses.replace(config, seed=1))
    assert h1.loss == h2.loss and h1.eval_loss == h2.eval_loss
    assert h1.loss != h3.loss


@THREAD_COUNTS
def test_resumed_run_equals_uninterrupted(tmp_path, n_threads):
    config = TrainConfig(steps=12, warmup=3, eval_every=4, checkpoint_every=5)
    with pinned_threads(n_threads):  # bit for bit: the same kernels in the same order
        whole, h_whole = run(dataclasses.replace(config, checkpoint_every=0))
        run(config, checkpoint_dir=tmp_path, stop_at=7)  # saved at 5 and at the stop, 7
        assert json.loads((tmp_path / "state.json").read_text())["loop"]["step"] == 7
        resumed, h_resumed = run(config, seed=99, checkpoint_dir=tmp_path, resume=True)
    assert h_resumed.loss == h_whole.loss and h_resumed.eval_loss == h_whole.eval_loss
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name


def test_checkpoint_round_trip_and_refusals(tmp_path):
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = adamw(model, 1e-3)
    x = stream(64)[:64].view(4, 16)
    model(x, targets=x).loss.backward()
    optimizer.step()
    save_checkpoint(tmp_path, model, optimizer, {"step": 1})
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.pkl"))
    copy = GPT(CONFIG)
    copy_opt = adamw(copy, 1e-3)
    state, _ = load_checkpoint(tmp_path, copy, copy_opt)
    assert state == {"step": 1}
    pairs = zip(model.parameters(), copy.parameters(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"],
                       copy_opt.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(ValueError, match="of another model: it holds GPT .* this model is GPT"):
        load_checkpoint(tmp_path, GPT(dataclasses.replace(CONFIG, d_model=64)))
    with pytest.raises(ValueError, match="another model: it holds GPT"):
        load_checkpoint(tmp_path, nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere", model)
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_checkpoint(tmp_path, model)


def test_checkpoint_with_missing_tensors(tmp_path):
    from safetensors.torch import load_file, save_file

    model = GPT(CONFIG)
    save_checkpoint(tmp_path, model)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors.pop(next(iter(tensors)))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="does not fit GPT: missing"):
        load_checkpoint(tmp_path, GPT(CONFIG))


def test_evaluate_restores_mode_and_counts_tokens():
    model = GPT(CONFIG).train()
    x = stream(64)[:32].view(2, 16)
    y = x.clone()
    y[1] = IGNORE_INDEX
    loss = evaluate(model, [(x, y)])
    assert model.training
    model.eval()
    with torch.no_grad():
        assert loss == pytest.approx(float(model(x[:1], targets=y[:1]).loss), rel=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": -1e-3}, "lr must be a finite number >= 0, got -0.001"),
    ({"lr": float("nan")}, "lr must be a finite number >= 0"),
    ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
    ({"warmup": 20, "steps": 10}, r"warmup \(20\) cannot exceed steps \(10\)"),
    ({"label_smoothing": 1.0}, r"label_smoothing must lie in \[0, 1\), got 1.0"),
    ({"label_smoothing": -0.1}, r"label_smoothing must lie in \[0, 1\)"),
    ({"steps": 0}, "steps must be a positive int, got 0"),
    ({"schedule": "step"}, "schedule must be one of"),
    ({"clip": 0}, "clip must be a number > 0 or None, got 0"),
    ({"betas": (0.9, 1.0)}, "betas must be two numbers in"),
    ({"schedule": "inverse_sqrt"}, "needs warmup >= 1"),
])
def test_train_config_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_train_bad_input(tmp_path):
    model = GPT(CONFIG)
    long = torch.zeros(1, CONFIG.max_len + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model.s context length 16"):
        train(model, lambda g: (long, long), TrainConfig(steps=1), progress=False)
    with pytest.raises(TypeError, match="config must be a TrainConfig, got dict"):
        train(model, lambda g: None, {"steps": 1})
    with pytest.raises(ValueError, match="need a checkpoint_dir"):
        train(model, lambda g: None, TrainConfig(steps=2, checkpoint_every=1))
    with pytest.raises(ValueError, match=r"stop_at must be an int in \[1, 2\], got 5"):
        train(model, lambda g: None, TrainConfig(steps=2), stop_at=5)
    x = stream(64)[:32].view(2, 16)
    train(model, lambda g: (x, x), TrainConfig(steps=1), checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="another TrainConfig"):
        train(model, lambda g: (x, x), TrainConfig(steps=3), checkpoint_dir=tmp_path,
              resume=True, progress=False)


def test_diverging_loss_is_reported():
    model = GPT(CONFIG)
    x = stream(64)[:32].view(2, 16)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="the loss became nan at step 0"):
        train(model, lambda g: (x, x), TrainConfig(steps=1), progress=False)


# --- bad input: config types, empty batches, sizes, schedule steps, damaged checkpoints -----


@pytest.mark.parametrize("kwargs, error, message", [
    ({"betas": 0.9}, TypeError, "betas must be a pair .* got float 0.9"),
    ({"betas": (0.9,)}, TypeError, r"betas must be a pair .* got tuple \(0.9,\)"),
    ({"betas": "ab"}, TypeError, "betas must be a pair .* got str"),
    ({"betas": (0.9, "x")}, ValueError, "betas must be two numbers in"),
    ({"seed": 2**64}, ValueError, r"seed must lie in \[0, 2\*\*64\)"),
    ({"seed": -1}, ValueError, "seed must be an int >= 0, got -1"),
    ({"seed": 1.5}, ValueError, "seed must be an int >= 0, got 1.5"),
])
def test_train_config_field_types(kwargs, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**kwargs)


def test_a_batch_without_counted_targets_is_named():
    x = stream(64)[:32].view(2, 16)
    ignored = torch.full_like(x, IGNORE_INDEX)
    with pytest.raises(ValueError, match="batch of step 0 has no counted target"):
        train(GPT(CONFIG), lambda g: (x, ignored), TrainConfig(steps=1), progress=False)


@pytest.mark.parametrize("call, message", [
    (lambda: random_windows(stream(), 0, 8), "batch_size must be a positive int, got 0"),
    (lambda: random_windows(stream(), 2, -1), "T must be a positive int, got -1"),
    (lambda: sequential_windows(stream(), 0, 8), "batch_size must be a positive int, got 0"),
    (lambda: sequential_windows(stream(), 4, 0), "T must be a positive int, got 0"),
    (lambda: split_stream(stream(10), 0.01), "leaves 10 for training and 0 for validation"),
    (lambda: split_stream(stream(10), 0.99), "leaves 0 for training and 10 for validation"),
])
def test_window_and_split_sizes_below_one(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call", [
    lambda: warmup_cosine(-1, 100, 10),
    lambda: warmup_linear(-3, 100, 10),
    lambda: inverse_sqrt(-1, 512, 4000),
    lambda: warmup_cosine(1.5, 100, 10),
    lambda: TrainConfig(steps=10).lr_at(-1),
    lambda: TrainConfig(steps=10, schedule="constant").lr_at(-2),
])
def test_negative_schedule_steps(call):
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        call()


def _saved_run(folder):
    """A 1-layer model trained 2 of 4 steps with a checkpoint in `folder`; the config."""
    config = TrainConfig(steps=4, warmup=1)
    x = stream(64)[:32].view(2, 16)
    torch.manual_seed(0)
    train(GPT(CONFIG), lambda g: (x, x), config, checkpoint_dir=folder, stop_at=2,
          progress=False)
    return config, lambda: train(GPT(CONFIG), lambda g: (x, x), config, checkpoint_dir=folder,
                                 resume=True, progress=False)


def _edit_state(folder, change):
    path = folder / "state.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize("change, message", [
    (lambda i: i["loop"].update(step=9), r"at step 9, outside the run \[1, 4\]"),
    (lambda i: i["loop"].update(step=0), r"at step 0, outside the run"),
    (lambda i: i["loop"].update(step="2"), r"at step '2', outside the run"),
    (lambda i: i["loop"].pop("history"), "must have the keys"),
    (lambda i: i["loop"].update(extra=1), "must have the keys"),
    (lambda i: i["loop"]["history"].pop("lr"), "history .* must have the fields"),
    (lambda i: i["loop"]["history"].update(more=[]), "history .* must have the fields"),
    (lambda i: i["loop"]["history"]["loss"].append(1.0), "does not fit step 2"),
    (lambda i: i["loop"]["history"].update(eval_loss=[1.0]), "does not fit step 2"),
    (lambda i: i["loop"]["history"].update(loss="low"), "loss must be a list of numbers"),
    (lambda i: i["loop"]["history"].update(seconds=None), "seconds must be a number"),
    (lambda i: i.update(note="hi"), "must hold 'model', 'loop'"),
    (lambda i: i.pop("loop"), "must hold 'model', 'loop'"),
    (lambda i: i.pop("optimizer"), "holds no optimiser state"),
    (lambda i: i["optimizer"]["param_groups"].pop(), "needs 2 parameter groups"),
    (lambda i: i["optimizer"]["param_groups"][0].pop("lr"), "group 0 must have the keys"),
    (lambda i: i["optimizer"]["param_groups"][1].update(params=[0]), "group 1 must list"),
    (lambda i: i["optimizer"]["param_groups"][0].update(betas=[0.9, 0.99, 0.5]),
     r"parameter group 0: betas must be a list of 2 numbers in \[0, 1\) \(as this "
     r"optimiser's \(0.9, 0.99\)\), got \[0.9, 0.99, 0.5\]"),
    (lambda i: i["optimizer"]["param_groups"][1].update(betas=[0.9, 1.5]),
     r"group 1: betas must be a list of 2 numbers in \[0, 1\)"),
    (lambda i: i["optimizer"]["param_groups"][0].update(betas=0.9), "betas must be a list of 2"),
    (lambda i: i["optimizer"]["param_groups"][0].update(lr=-1.0),
     "group 0: lr must be a finite number >= 0 .* got -1.0"),
    (lambda i: i["optimizer"]["param_groups"][0].update(eps="1e-8"),
     "eps must be a finite number >= 0 .* got '1e-8'"),
    (lambda i: i["optimizer"]["param_groups"][0].update(weight_decay=None),
     "weight_decay must be a finite number >= 0 .* got None"),
    (lambda i: i["optimizer"]["param_groups"][0].update(amsgrad="no"),
     "amsgrad must be true or false .* got 'no'"),
    (lambda i: i["model"].pop("class"),
     r"the 'model' entry must be \{'class': its class name, 'config': an object or null\}"),
    (lambda i: i["model"].update({"class": 3}), "the 'model' entry must be"),
    (lambda i: i["model"].update(config=[1, 2]), "the 'model' entry must be"),
])
def test_damaged_state_json_is_refused(tmp_path, change, message):
    _, resume = _saved_run(tmp_path)
    _edit_state(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        resume()


def _edit_tensors(folder, change):
    from safetensors.torch import load_file, save_file

    path = str(folder / "optimizer.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("state.0.exp_avg_sq"), "states hold different fields"),
    (lambda t: t.update({"state.0.exp_avg": torch.zeros(3)}), r"state.0.exp_avg has shape \(3,\)"),
    (lambda t: t.update({"state.0.step": torch.zeros(2)}), "step must be one number"),
    (lambda t: t.update({"state.99.exp_avg": torch.zeros(1)}), "state for parameter 99"),
    (lambda t: t.update({"momentum": torch.zeros(1)}), "unexpected tensor 'momentum'"),
    (lambda t: t.pop("rng.data"), "random states 'data' and 'torch'"),
    (lambda t: t.update({"rng.data": torch.zeros(3, dtype=torch.uint8)}), "do not fit"),
])
def test_damaged_optimizer_file_is_refused(tmp_path, change, message):
    _, resume = _saved_run(tmp_path)
    _edit_tensors(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        resume()


def test_checkpoint_arguments_are_checked(tmp_path):
    model = GPT(CONFIG)
    optimizer = adamw(model, 1e-3)
    for bad, message in ((None, "model must be an nn.Module, got NoneType"),):
        with pytest.raises(TypeError, match=message):
            save_checkpoint(tmp_path, bad)
        with pytest.raises(TypeError, match=message):
            load_checkpoint(tmp_path, bad)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer or None, "
                                        "got dict"):
        save_checkpoint(tmp_path, model, {"lr": 1})
    with pytest.raises(TypeError, match="directory must be a str or Path, got int"):
        load_checkpoint(3, model, optimizer)
    with pytest.raises(TypeError, match="state must be a dict .* got list"):
        save_checkpoint(tmp_path, model, optimizer, state=[1])
    with pytest.raises(TypeError, match="state must hold only what JSON can write"):
        save_checkpoint(tmp_path, model, optimizer, state={"w": torch.zeros(1)})
    with pytest.raises(TypeError, match="rng must be a dict of name -> tensor"):
        save_checkpoint(tmp_path, model, optimizer, rng={"torch": 3})
    assert not (tmp_path / "state.json").exists()  # nothing was written


def test_adamw_and_clipping_check_their_arguments():
    model = GPT(CONFIG)
    for bad in (None, 0.9, "ab"):
        with pytest.raises(TypeError, match=r"betas must be a pair of numbers \(beta1, "
                                            r"beta2\), got"):
            adamw(model, 1e-3, betas=bad)
    with pytest.raises(ValueError, match=r"betas must be a pair of numbers \(beta1, beta2\), "
                                         r"got \(0.9, 0.99, 0.5\)"):
        adamw(model, 1e-3, betas=(0.9, 0.99, 0.5))
    for bad in (-1e-8, math.nan, math.inf, "1e-8"):
        with pytest.raises(ValueError, match="eps must be >= 0 and finite, got"):
            adamw(model, 1e-3, eps=bad)
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        adamw("model", 1e-3)
    w = torch.nn.Parameter(torch.ones(3))
    w.grad = torch.full((3,), 4.0)
    assert float(clip_grad_norm(w, 1.0)) == pytest.approx(48 ** 0.5)  # one tensor: its norm
    assert float(w.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    for bad in (3, "w", None):
        with pytest.raises(TypeError, match="params must be a tensor or an iterable of tensors"):
            clip_grad_norm(bad, 1.0)
    with pytest.raises(TypeError, match="params must be a tensor or an iterable of tensors"):
        global_grad_norm([w, 1.0])


def test_stop_at_before_the_checkpoint_is_refused(tmp_path):
    config, _ = _saved_run(tmp_path)
    x = stream(64)[:32].view(2, 16)
    with pytest.raises(ValueError, match=r"stop_at \(1\) must come after the checkpoint's step"):
        train(GPT(CONFIG), lambda g: (x, x), config, checkpoint_dir=tmp_path, resume=True,
              stop_at=1, progress=False)
