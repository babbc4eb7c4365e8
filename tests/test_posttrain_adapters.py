"""tfbook.posttrain.adapters: SmolLM2 + LoRA built from a seed, adapters saved and loaded back
bit for bit, switched off, and every malformed adapter directory refused with a clear error
before the base model's weights are read.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tfbook.lora import lora_layers
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.posttrain import adapters
from tfbook.posttrain.adapters import (
    ADAPTER_FILE,
    CONFIG_FILE,
    adapters_disabled,
    load_adapter,
    read_adapter_config,
    save_adapter,
    smollm2_with_lora,
)

IDS = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2]])  # any SmolLM2 ids


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """SmolLM2 + LoRA with B set to random values (as after training), saved once."""
    model = smollm2_with_lora(r=4, alpha=8, seed=3)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.01)
    directory = save_adapter(model, tmp_path_factory.mktemp("adapter"), meta={"steps": 7})
    return model, directory


def _tiny(monkeypatch):
    """load_smollm2 replaced by a tiny GPT, to test the seeding without reading the GGUF."""
    config = GPTConfig(max_len=16, vocab_size=32, n_layers=2, n_heads=2, d_model=16, d_ff=32)
    tiny = GPT(config).eval()  # built once: each call hands out a copy (no random draws)
    monkeypatch.setattr(adapters, "load_smollm2", lambda layout: copy.deepcopy(tiny))


def test_same_seed_same_adapters_and_global_generator_untouched(monkeypatch):
    _tiny(monkeypatch)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = {n: m.lora_A.clone() for n, m in lora_layers(smollm2_with_lora(seed=5)).items()}
    assert torch.equal(torch.get_rng_state(), state)
    b = {n: m.lora_A.clone() for n, m in lora_layers(smollm2_with_lora(seed=5)).items()}
    c = {n: m.lora_A.clone() for n, m in lora_layers(smollm2_with_lora(seed=6)).items()}
    assert a.keys() == b.keys() == c.keys() and len(a) == 4  # q_proj and v_proj of 2 blocks
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not any(torch.equal(a[n], c[n]) for n in a)
    model = smollm2_with_lora(targets=("q_proj",), r=2)
    assert {n.rsplit(".", 1)[-1] for n in lora_layers(model)} == {"q_proj"}
    assert not model.training
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_round_trip_bit_for_bit(trained):
    model, directory = trained
    assert sorted(p.name for p in directory.iterdir()) == sorted([ADAPTER_FILE, CONFIG_FILE])
    config = read_adapter_config(directory)
    assert config == {"format": 1, "base": "SmolLM2-135M-Instruct", "layout": "hf",
                      "targets": ["q_proj", "v_proj"], "r": 4, "alpha": 8,
                      "meta": {"steps": 7}}
    stored = load_file(directory / ADAPTER_FILE)
    assert len(stored) == 30 * 2 * 2  # 30 blocks, q and v, A and B: nothing of the base model
    loaded = load_adapter(directory)
    assert not loaded.training
    ours = dict(loaded.named_parameters())
    for name, tensor in model.named_parameters():
        assert torch.equal(ours[name], tensor), name
    with torch.no_grad():
        logits = model(IDS).logits
        assert torch.equal(loaded(IDS).logits, logits)
        with adapters_disabled(loaded):
            base = loaded(IDS).logits
        assert not torch.equal(base, logits)
        assert torch.equal(loaded(IDS).logits, logits)  # switched back on after the block


def test_adapters_off_is_the_base_model_and_load_into_it(trained):
    model, directory = trained
    fresh = smollm2_with_lora(r=4, alpha=8, seed=3)  # B = 0: exactly SmolLM2
    with torch.no_grad(), adapters_disabled(model):
        assert torch.equal(model(IDS).logits, fresh(IDS).logits)
    base = {n: p.clone() for n, p in fresh.named_parameters() if "lora_" not in n}
    assert load_adapter(directory, into=fresh) is fresh  # no second read of the GGUF
    ours = dict(fresh.named_parameters())
    for name, tensor in model.named_parameters():
        assert torch.equal(ours[name], tensor), name
    assert all(torch.equal(ours[n], t) for n, t in base.items())
    with pytest.raises(TypeError, match="into must be a SmolLM2 GPT"):
        load_adapter(directory, into="model")
    config = GPTConfig(max_len=16, vocab_size=32, n_layers=1, n_heads=2, d_model=16, d_ff=32)
    with pytest.raises(ValueError, match="belong to SmolLM2-135M-Instruct"):
        load_adapter(directory, into=GPT(config))
    copy_dir = directory.parent / "r8"
    save_adapter(fresh, copy_dir)
    _edit_json(copy_dir, alpha=4)  # same tensors, another alpha
    with pytest.raises(ValueError, match="are not the adapter's"):
        load_adapter(copy_dir, into=fresh)


def _copy(directory, tmp_path):
    target = tmp_path / "copy"
    target.mkdir(parents=True)
    for name in (ADAPTER_FILE, CONFIG_FILE):
        (target / name).write_bytes((directory / name).read_bytes())
    return target


def _edit_json(directory, **changes):
    config = json.loads((directory / CONFIG_FILE).read_text())
    config.update(changes)
    (directory / CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    ({"base": "SmolLM2-360M-Instruct"}, "not for SmolLM2-135M-Instruct"),
    ({"layout": "mlx"}, "layout must be one of"),
    ({"format": 2}, "format 2"),
    ({"r": 0}, "rank r must be an int >= 1"),
    ({"alpha": -1}, "alpha must be a finite number > 0"),
    ({"targets": "q_proj"}, "targets must be a non-empty list"),
    ({"targets": ["q_proj", "w_proj"]}, "has no layer named ['w_proj']"),
    ({"r": 8}, "must be float32 of shape (8, 576)"),
    ({"targets": ["q_proj"]}, "extra ['blocks.0.attn.v_proj.lora_A'"),
    ({"targets": ["q_proj", "v_proj", "k_proj"]}, "missing ['blocks.0.attn.k_proj.lora_A'"),
    ({"meta": [1]}, "meta must be a dict"),
])
def test_bad_config_refused(trained, tmp_path, changes, message):
    directory = _copy(trained[1], tmp_path)
    _edit_json(directory, **changes)
    with pytest.raises(ValueError) as error:
        load_adapter(directory)
    assert message in str(error.value)


def test_bad_directories_refused(trained, tmp_path):
    with pytest.raises(ValueError, match="adapter.json does not exist"):
        load_adapter(tmp_path / "nowhere")
    with pytest.raises(TypeError, match="directory must be a str or Path"):
        load_adapter(3)
    directory = _copy(trained[1], tmp_path)
    (directory / CONFIG_FILE).write_text('{"format": 1, "base": ')  # cut short
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_adapter(directory)
    (directory / CONFIG_FILE).write_text('{"format": 1}')
    with pytest.raises(ValueError, match="must hold the keys"):
        load_adapter(directory)
    (directory / CONFIG_FILE).write_text("[]")
    with pytest.raises(ValueError, match="must hold the keys"):
        load_adapter(directory)
    directory = _copy(trained[1], tmp_path / "second")
    (directory / ADAPTER_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="is not a safetensors file"):
        load_adapter(directory)
    (directory / ADAPTER_FILE).unlink()
    with pytest.raises(ValueError, match="adapter.safetensors does not exist"):
        load_adapter(directory)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("blocks.29.attn.v_proj.lora_B"), "missing ['blocks.29.attn.v_proj.lora_B']"),
    (lambda t: t.update(extra=torch.zeros(1)), "extra ['extra']"),
    (lambda t: t.update({"blocks.0.attn.q_proj.lora_A": torch.zeros(4, 575)}), "shape (4, 576)"),
    (lambda t: t.update({"blocks.0.attn.q_proj.lora_A": torch.zeros(4, 576, dtype=torch.float64)}),
     "must be float32"),
    (lambda t: t["blocks.3.attn.v_proj.lora_B"].fill_(float("nan")), "NaN or infinite"),
])
def test_bad_tensors_refused(trained, tmp_path, edit, message):
    directory = _copy(trained[1], tmp_path)
    tensors = load_file(directory / ADAPTER_FILE)
    edit(tensors)
    save_file(tensors, directory / ADAPTER_FILE)
    with pytest.raises(ValueError) as error:
        load_adapter(directory)
    assert message in str(error.value)


def test_save_refuses_what_it_cannot_store(trained, tmp_path):
    model, _ = trained
    config = GPTConfig(max_len=16, vocab_size=32, n_layers=1, n_heads=2, d_model=16, d_ff=32)
    with pytest.raises(ValueError, match="has no LoRA layers"):
        save_adapter(GPT(config), tmp_path)
    from tfbook.lora import add_lora
    with pytest.raises(ValueError, match="belong to SmolLM2-135M-Instruct"):
        save_adapter(add_lora(GPT(config)), tmp_path)
    with pytest.raises(ValueError, match="JSON-serialisable"):
        save_adapter(model, tmp_path, meta={"x": float("nan")})
    with pytest.raises(TypeError, match="meta must be a dict"):
        save_adapter(model, tmp_path, meta=[1])
    with pytest.raises(TypeError, match="directory must be a str or Path"):
        save_adapter(model, None)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        save_adapter("model", tmp_path)
    with pytest.raises(ValueError, match="seed must be an int"):
        smollm2_with_lora(seed=-1)
