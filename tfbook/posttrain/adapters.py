"""SmolLM2 with LoRA adapters: build one, save only the adapters, load them back, switch them off.

Post-training SmolLM2-135M-Instruct with LoRA (`tfbook.lora`) changes a few hundred thousand
numbers (the A and B matrices) and leaves the 135 million of the base model as the GGUF file
holds them. So a run stores only the adapters:

    <dir>/adapter.safetensors   every lora_A (r, C_in) and lora_B (C_out, r), by parameter name
                                ("blocks.0.attn.q_proj.lora_A", ...); no pickle
    <dir>/adapter.json          {"format", "base", "layout", "targets", "r", "alpha", "meta"}

`load_adapter` rebuilds the base model from the GGUF, adds LoRA as the JSON says and loads the
tensors, strictly: a wrong base or layout, a missing, extra or mis-shaped tensor, a non-float32
tensor or a malformed JSON is a ValueError naming the file and what was expected, checked on
a shape-only ("meta") copy of the model before the 135M weights are read.
`adapters_disabled` (from `tfbook.posttrain.dpo`) switches the adapters off: inside it the
model computes the base model's outputs exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tfbook.checkpoints.smollm2 import (
    LAYOUTS,
    load_smollm2,
    read_smollm2_gguf,
    smollm2_hparams,
)
from tfbook.config import is_int, is_number
from tfbook.lora import _check_targets, add_lora, check_lora_args, lora_layers
from tfbook.models.gpt import GPT
from tfbook.models.llama import llama_config
from tfbook.posttrain.dpo import adapters_disabled

BASE = "SmolLM2-135M-Instruct"  # the only base model an adapter of this module fits
FORMAT = 1  # version of the adapter.json layout
ADAPTER_FILE, CONFIG_FILE = "adapter.safetensors", "adapter.json"
CONFIG_KEYS = ("format", "base", "layout", "targets", "r", "alpha", "meta")


def smollm2_config(layout: str = "hf"):
    """The GPTConfig `load_smollm2(layout)` builds, from the GGUF's metadata only (no weights)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    hp = smollm2_hparams(read_smollm2_gguf(metadata_only=True))
    if layout == "gguf":
        return llama_config(**hp)
    return llama_config(**hp, rope_convention="half", rope_precision="float32")


def smollm2_with_lora(
    targets: Sequence[str] = ("q_proj", "v_proj"), r: int = 8, alpha: float = 16, seed: int = 0,
    layout: str = "hf",
) -> GPT:
    """SmolLM2-135M-Instruct (`load_smollm2(layout)`) with LoRA on `targets`, in eval mode.

    The A matrices are drawn from torch's generator seeded with `seed` (the global generator
    is left as it was), B starts at zero: until the first step the model computes exactly what
    SmolLM2 computes. Only the adapters are trainable.
    """
    targets = _check_targets(targets)
    check_lora_args(r, alpha, 0.0)
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
    model = load_smollm2(layout=layout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        add_lora(model, targets, r=r, alpha=alpha)
    return model.eval()


def _adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every lora_A / lora_B of the model by parameter name."""
    return {f"{name}.{part}": getattr(layer, part)
            for name, layer in lora_layers(model).items() for part in ("lora_A", "lora_B")}


def _layout_of(model: nn.Module) -> str:
    """ "hf" or "gguf": which `load_smollm2` layout the model's config is; refuse any other."""
    config = getattr(model, "config", None)
    for layout in LAYOUTS:
        expected = smollm2_config(layout)
        if config is not None and replace(config, attention=expected.attention,
                                          fused_activation=expected.fused_activation,
                                          fused_norm=expected.fused_norm) == expected:
            return layout
    raise ValueError(f"these adapters belong to {BASE} (tfbook.checkpoints.smollm2."
                     f"load_smollm2), got a {type(model).__name__} with config {config}")


def save_adapter(model: nn.Module, directory: str | Path, meta: dict[str, Any] | None = None
                 ) -> Path:
    """Write the model's LoRA tensors and adapter.json into `directory` (created); return it.

    `meta` is any JSON-serialisable dict stored beside the settings (e.g. how it was trained).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(directory, str | Path):
        raise TypeError(f"directory must be a str or Path, got {type(directory).__name__}")
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"the {type(model).__name__} has no LoRA layers to save "
                         f"(tfbook.lora.add_lora or smollm2_with_lora first)")
    settings = {(layer.r, layer.alpha) for layer in layers.values()}
    if len(settings) != 1:
        raise ValueError(f"every LoRA layer must have the same r and alpha, got {settings}")
    if any(not isinstance(layer.dropout, nn.Identity) for layer in layers.values()):
        raise ValueError("save_adapter stores adapters without dropout (add_lora's dropout=0)")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict or None, got {type(meta).__name__}")
    try:
        meta = json.loads(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(f"meta must be JSON-serialisable (no NaN): {error}") from None
    (r, alpha), = settings
    targets = sorted({name.rsplit(".", 1)[-1] for name in layers})
    config = {"format": FORMAT, "base": BASE, "layout": _layout_of(model), "targets": targets,
              "r": r, "alpha": alpha, "meta": meta}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous().clone()
               for name, t in _adapter_tensors(model).items()}
    save_file(tensors, directory / ADAPTER_FILE, metadata={"base": BASE, "format": str(FORMAT)})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return directory


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    """adapter.json of `directory`, checked: every key, the base, the layout, targets, r, alpha."""
    if not isinstance(directory, str | Path):
        raise TypeError(f"directory must be a str or Path, got {type(directory).__name__}")
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: an adapter directory holds {CONFIG_FILE} and "
                         f"{ADAPTER_FILE} (save_adapter)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(config, dict) or set(config) != set(CONFIG_KEYS):
        got = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"{path} must hold the keys {sorted(CONFIG_KEYS)}, got {got}")
    if config["format"] != FORMAT:
        raise ValueError(f"{path} has format {config['format']!r}; this tfbook reads format "
                         f"{FORMAT}")
    if config["base"] != BASE:
        raise ValueError(f"{path} is an adapter for {config['base']!r:.60}, not for {BASE}")
    if config["layout"] not in LAYOUTS:
        raise ValueError(f"{path}: layout must be one of {LAYOUTS}, got {config['layout']!r:.40}")
    try:
        _check_targets(config["targets"])
        check_lora_args(config["r"], config["alpha"], 0.0)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None
    if not is_number(config["alpha"]) or not math.isfinite(config["alpha"]):
        raise ValueError(f"{path}: alpha must be a finite number, got {config['alpha']!r}")
    if not isinstance(config["meta"], dict):
        raise ValueError(f"{path}: meta must be a dict, got {type(config['meta']).__name__}")
    return config


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every adapter tensor the config asks for, on a shape-only model."""
    with torch.device("meta"):
        skeleton = GPT(smollm2_config(config["layout"]))
    try:
        add_lora(skeleton, config["targets"], r=config["r"], alpha=config["alpha"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"the adapter's settings do not fit {BASE}: {error}") from None
    return {name: tuple(t.shape) for name, t in _adapter_tensors(skeleton).items()}


def load_adapter(directory: str | Path, into: nn.Module | None = None) -> GPT:
    """SmolLM2 with the adapter saved in `directory` (save_adapter), in eval mode.

    Strict: the tensors must be exactly the ones the JSON's targets and r ask for, float32,
    with their shapes; anything else raises ValueError before the base model is loaded.
    `into`: a SmolLM2 with LoRA of the same layout, targets, r and alpha (smollm2_with_lora)
    to load the adapter into instead of building a new one (reading the GGUF again); its
    adapters are overwritten, its base weights are not touched.
    """
    config = read_adapter_config(directory)
    path = Path(directory) / ADAPTER_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: an adapter directory holds {CONFIG_FILE} and "
                         f"{ADAPTER_FILE} (save_adapter)")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a safetensors file: {error}") from None
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"{path} does not fit {CONFIG_FILE} (targets {config['targets']}, r="
                         f"{config['r']}): missing {missing[:3]}{'...' if len(missing) > 3 else ''}"
                         f" ({len(missing)}), extra {extra[:3]}{'...' if len(extra) > 3 else ''}"
                         f" ({len(extra)})")
    for name, shape in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape or tensor.dtype != torch.float32:
            raise ValueError(f"{path}: {name} must be float32 of shape {shape}, got "
                             f"{tensor.dtype} of shape {tuple(tensor.shape)}")
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{path}: {name} holds NaN or infinite values")
    if into is None:
        model = smollm2_with_lora(config["targets"], r=config["r"], alpha=config["alpha"],
                                  layout=config["layout"])
    else:
        model = _check_into(into, config, expected)
    with torch.no_grad():
        for name, parameter in _adapter_tensors(model).items():
            parameter.copy_(tensors[name])
    return model.eval()


def _check_into(model: object, config: dict[str, Any], expected: dict[str, tuple[int, ...]]
                ) -> GPT:
    """`into` must be SmolLM2 in the adapter's layout with exactly the adapter's LoRA layers."""
    if not isinstance(model, GPT):
        raise TypeError(f"into must be a SmolLM2 GPT with LoRA (smollm2_with_lora), got "
                        f"{type(model).__name__}")
    layout = _layout_of(model)
    if layout != config["layout"]:
        raise ValueError(f"into is SmolLM2 in layout {layout!r}, the adapter was trained in "
                         f"layout {config['layout']!r}")
    have = {name: tuple(t.shape) for name, t in _adapter_tensors(model).items()}
    settings = {(layer.r, layer.alpha) for layer in lora_layers(model).values()}
    if have != expected or settings != {(config["r"], config["alpha"])}:
        raise ValueError(f"into's LoRA layers ({len(have)} tensors, r and alpha {settings}) "
                         f"are not the adapter's (targets {config['targets']}, r={config['r']}, "
                         f"alpha={config['alpha']}): build it with smollm2_with_lora(targets, "
                         f"r, alpha)")
    return model


__all__ = ["ADAPTER_FILE", "BASE", "CONFIG_FILE", "adapters_disabled", "load_adapter",
           "read_adapter_config", "save_adapter", "smollm2_config", "smollm2_with_lora"]
