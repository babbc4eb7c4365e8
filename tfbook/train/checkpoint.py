"""Checkpoints without pickle: tensors in safetensors files, everything else in JSON.

    <dir>/model.safetensors      the model's weights (a tied matrix stored once)
    <dir>/optimizer.safetensors  AdamW's moments per parameter, and the random-number states
    <dir>/state.json             the model's class and config, the optimiser's settings, the
                                 loop's step and history

Loading a pickle can run any code its author chose; these files hold only numbers and text.
A checkpoint refuses to load into a model of another class or config, or with tensors missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from tfbook.config import is_number

MODEL_FILE, OPTIMIZER_FILE, STATE_FILE = "model.safetensors", "optimizer.safetensors", "state.json"


def describe_model(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint must match: the model's class and its config (as plain JSON)."""
    config = getattr(model, "config", None)
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None
    return {"class": type(model).__name__, "config": json.loads(json.dumps(fields))}


def with_new_defaults(found: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """A stored model description with the config fields it lacks set to their defaults.

    A config field added later (such as GPTConfig's qk_norm or sliding_window) has a default
    that keeps the models built before it unchanged; a checkpoint written before the field
    existed describes such a model, so it is read as holding the default.
    """
    config = getattr(model, "config", None)
    stored = found.get("config") if isinstance(found, dict) else None
    if not dataclasses.is_dataclass(config) or not isinstance(stored, dict):
        return found
    defaults = {f.name: f.default for f in dataclasses.fields(config)
                if f.default is not dataclasses.MISSING and f.name not in stored}
    return {**found, "config": {**stored, **json.loads(json.dumps(defaults))}}


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """AdamW's state as flat tensors 'state.<param index>.<name>' plus its JSON settings."""
    saved = optimizer.state_dict()
    tensors = {}
    for index, state in saved["state"].items():
        for name, value in state.items():
            tensors[f"state.{index}.{name}"] = torch.as_tensor(value).contiguous()
    groups = [{k: v for k, v in group.items()} for group in saved["param_groups"]]
    return tensors, {"param_groups": groups}


def save_checkpoint(
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
    state: dict[str, Any] | None = None, rng: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write model (+ optimiser, random states, loop state) into `directory`; return it."""
    _check_objects(directory, model, optimizer)
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"state must be a dict (the loop's state) or None, got "
                        f"{type(state).__name__}")
    if rng is not None and not (isinstance(rng, dict) and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in rng.items())):
        raise TypeError(f"rng must be a dict of name -> tensor (random states) or None, got "
                        f"{rng!r:.80}")
    try:
        json.dumps(state or {})
    except (TypeError, ValueError) as error:
        raise TypeError(f"state must hold only what JSON can write (numbers, strings, lists, "
                        f"dicts): {error}") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / MODEL_FILE))
    info = {"model": describe_model(model), "loop": state or {}}
    tensors = {f"rng.{k}": v.contiguous() for k, v in (rng or {}).items()}
    if optimizer is not None:
        opt_tensors, info["optimizer"] = _optimizer_tensors(optimizer)
        tensors.update(opt_tensors)
    save_file(tensors or {"empty": torch.zeros(0)}, str(directory / OPTIMIZER_FILE))
    (directory / STATE_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
    return directory


def _check_objects(directory: object, model: object, optimizer: object) -> None:
    """The arguments both save_checkpoint and load_checkpoint take, checked."""
    if not isinstance(directory, str | Path):
        raise TypeError(f"directory must be a str or Path, got {type(directory).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")


def _read_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {directory}: {STATE_FILE} is missing")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(info, dict) or not isinstance(info.get("model"), dict):
        raise ValueError(f"{path} must hold an object with a 'model' entry, got {info!r:.80}")
    model = info["model"]
    if set(model) != {"class", "config"} or not isinstance(model["class"], str) or not (
            model["config"] is None or isinstance(model["config"], dict)):
        raise ValueError(f"{path}: the 'model' entry must be {{'class': its class name, "
                         f"'config': an object or null}}, got {model!r:.120}")
    extra = sorted(set(info) - {"model", "loop", "optimizer"})
    if extra or not isinstance(info.get("loop"), dict):
        raise ValueError(f"{path} must hold 'model', 'loop' (an object) and optionally "
                         f"'optimizer', got keys {sorted(info)}")
    return info


def _optimizer_state(tensors: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                     where: Path) -> dict[int, dict[str, torch.Tensor]]:
    """The 'state.<index>.<name>' tensors as torch's optimiser state, checked against the
    optimiser's parameters: known indices, one set of names for all, shapes that fit."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("rng.") or key == "empty":
            continue
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise ValueError(f"{where} holds an unexpected tensor {key!r}: expected "
                             "'state.<param index>.<name>' or 'rng.<name>'")
        index = int(parts[1])
        if index >= len(params):
            raise ValueError(f"{where} holds state for parameter {index}, but the optimiser "
                             f"has {len(params)} parameters")
        state.setdefault(index, {})[parts[2]] = value
    names = {frozenset(entry) for entry in state.values()}
    if len(names) > 1:
        raise ValueError(f"{where}: the parameters' states hold different fields "
                         f"{sorted(sorted(n) for n in names)}: some are missing")
    for index, entry in state.items():
        for name, value in entry.items():
            shape = params[index].shape
            if name == "step" and value.numel() != 1:
                raise ValueError(f"{where}: state.{index}.step must be one number, got shape "
                                 f"{tuple(value.shape)}")
            if name != "step" and value.shape != shape:
                raise ValueError(f"{where}: state.{index}.{name} has shape "
                                 f"{tuple(value.shape)}, its parameter {tuple(shape)}")
    return state


RATES = ("lr", "initial_lr", "eps", "weight_decay", "momentum", "dampening")  # numbers >= 0


def _check_setting(key: str, saved: object, current: object, where: str) -> None:
    """A saved setting must be of the kind the optimiser's own is: true/false for a flag, a
    finite number for a number (>= 0 for RATES), as many numbers as a tuple (betas: each in
    [0, 1)). What JSON cannot hold (a tensor) or None is left to torch."""
    if isinstance(current, bool):
        ok, expected = isinstance(saved, bool), "true or false"
    elif isinstance(current, numbers.Real):
        low = 0 if key in RATES else -math.inf
        ok = is_number(saved) and math.isfinite(saved) and saved >= low
        expected = "a finite number" + (" >= 0" if key in RATES else "")
    elif isinstance(current, tuple | list):
        low, high = (0.0, 1.0) if key == "betas" else (-math.inf, math.inf)
        ok = isinstance(saved, list | tuple) and len(saved) == len(current) and all(
            is_number(x) and math.isfinite(x) and low <= x < high for x in saved)
        expected = f"a list of {len(current)} numbers" + (" in [0, 1)" if key == "betas" else "")
    else:
        return
    if not ok:
        raise ValueError(f"{where}: {key} must be {expected} (as this optimiser's "
                         f"{current!r}), got {saved!r:.60}")


def _param_groups(saved: object, optimizer: torch.optim.Optimizer, where: Path) -> list[dict]:
    """The saved settings of each parameter group, checked against the optimiser's: as many
    groups, the same keys, as many parameters in each, each setting of the same kind."""
    current = optimizer.param_groups
    if not isinstance(saved, list) or len(saved) != len(current) or not all(
        isinstance(g, dict) for g in saved
    ):
        raise ValueError(f"{where}: the optimiser needs {len(current)} parameter groups "
                         f"(objects), got {saved!r:.80}")
    groups = []
    for i, (old, new) in enumerate(zip(saved, current, strict=True)):
        if set(old) != set(new):
            raise ValueError(f"{where}: parameter group {i} must have the keys {sorted(new)}, "
                             f"got {sorted(old)}")
        if not isinstance(old["params"], list) or len(old["params"]) != len(new["params"]):
            raise ValueError(f"{where}: parameter group {i} must list {len(new['params'])} "
                             f"parameters, got {old['params']!r:.60}")
        for key, value in old.items():
            if key != "params":
                _check_setting(key, value, new[key], f"{where}: parameter group {i}")
        betas = old.get("betas")
        groups.append({**old, "betas": tuple(betas)} if isinstance(betas, list) else old)
    return groups  # JSON made the betas tuple a list


def load_checkpoint(
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Load weights (and the optimiser's state) in place; return (loop state, random states).

    Raises ValueError if the checkpoint belongs to another model class or config, or if a
    tensor is missing, extra or of another shape.
    """
    _check_objects(directory, model, optimizer)
    directory = Path(directory)
    info = _read_state(directory)
    expected, found = describe_model(model), with_new_defaults(info["model"], model)
    if expected != found:
        raise ValueError(
            f"the checkpoint in {directory} is of another model: it holds {found['class']} "
            f"{found.get('config')}, this model is {expected['class']} {expected['config']}"
        )
    try:
        missing, unexpected = load_model(model, str(directory / MODEL_FILE), strict=False)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise ValueError(f"cannot load {directory / MODEL_FILE}: {error}") from None
    if missing or unexpected:
        raise ValueError(f"{directory / MODEL_FILE} does not fit {expected['class']}: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    try:
        tensors = load_file(str(directory / OPTIMIZER_FILE))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"cannot load {directory / OPTIMIZER_FILE}: {error}") from None
    if optimizer is not None:
        if not isinstance(info.get("optimizer"), dict):
            raise ValueError(f"the checkpoint in {directory} holds no optimiser state")
        state = _optimizer_state(tensors, optimizer, directory / OPTIMIZER_FILE)
        groups = _param_groups(info["optimizer"].get("param_groups"), optimizer,
                               directory / STATE_FILE)
        try:
            optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError) as error:
            raise ValueError(f"the optimiser state in {directory} does not fit: {error}") from None
    rng = {k[4:]: v for k, v in tensors.items() if k.startswith("rng.")}
    return info["loop"], rng
