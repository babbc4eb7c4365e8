"""RoPE scaling: the rotary frequencies of a model run past the context it was trained on.

A model trained on sequences of length L has only seen the angles pos * theta_n with
pos < L. The four schemes below change the frequencies theta_n (and YaRN also the attention
scores) so that longer inputs stay close to what the model knows. Each takes its settings from
a `RopeScaling`, named as in a Hugging Face config's "rope_scaling" / "rope_parameters":

- "linear": position interpolation (Chen et al. 2023), every frequency divided by the factor.
- "dynamic": NTK-aware scaling (bloc97 2023) with a factor that grows with the current length.
- "yarn": YaRN (Peng et al. 2023), interpolation "by parts" plus an attention temperature.
- "llama3": Meta's Llama 3.1 rule, a smoothed by-parts interpolation by wavelength.

`rope_inverse_frequencies(D, base, scaling)` returns (theta, attention_factor): theta (D/2,)
in float64, fastest plane first, and the factor that multiplies cos and sin (1 except YaRN);
with precision="float32", theta in float32 computed as Hugging Face computes it.

In a model the scaling is a setting: `GPTConfig.rope_scaling` / `BlockConfig.rope_scaling`,
a Hugging Face style dict checked by `check_rope_scaling`; the model's rotary table then
comes from `scaled_rope_cos_sin` instead of `tfbook.rope.rope_cos_sin`.
"""

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from tfbook.rope import PRECISIONS, rope_cos_sin, rope_frequencies, scaled_rope_frequencies

ROPE_SCALING_TYPES = ("linear", "dynamic", "yarn", "llama3")
# which settings each type needs (besides rope_type and factor)
_REQUIRED = {
    "linear": (),
    "dynamic": ("original_max_position_embeddings",),
    "yarn": ("original_max_position_embeddings",),
    "llama3": ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}
_ONLY_FOR = {  # settings that only one type reads
    "beta_fast": "yarn", "beta_slow": "yarn", "attention_factor": "yarn", "mscale": "yarn",
    "mscale_all_dim": "yarn", "truncate": "yarn",
    "low_freq_factor": "llama3", "high_freq_factor": "llama3",
}


def _number(name: str, value: object, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"rope_scaling {name} must be a number, got {value!r} "
                        f"({type(value).__name__})")
    if positive and not value > 0:
        raise ValueError(f"rope_scaling {name} must be > 0, got {name}={value}")
    return float(value)


@dataclass(frozen=True)
class RopeScaling:
    """Settings of a RoPE scaling, in the words of a Hugging Face config's rope_scaling.

    rope_type: one of ROPE_SCALING_TYPES. factor: how many times the context is stretched.
    original_max_position_embeddings: the context L the model was trained on (for "dynamic"
    it is Hugging Face's max_position_embeddings). beta_fast, beta_slow, attention_factor,
    mscale, mscale_all_dim, truncate: YaRN's (defaults 32, 1, None, None, None, True).
    low_freq_factor, high_freq_factor: Llama 3.1's (1 and 4 in Meta's release).
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope_scaling rope_type must be one of {ROPE_SCALING_TYPES}, "
                             f"got {self.rope_type!r}")
        _number("factor", self.factor)
        for name in _REQUIRED[self.rope_type]:
            if getattr(self, name) is None:
                raise ValueError(f"rope_scaling of rope_type {self.rope_type!r} needs {name} "
                                 f"(all it needs: factor, {', '.join(_REQUIRED[self.rope_type])})")
        for name, owner in _ONLY_FOR.items():
            if getattr(self, name) is not None and owner != self.rope_type:
                raise ValueError(f"rope_scaling {name} belongs to rope_type {owner!r}, "
                                 f"not {self.rope_type!r}")
        L = self.original_max_position_embeddings
        if L is not None and (isinstance(L, bool) or not isinstance(L, int) or L <= 0):
            raise ValueError("rope_scaling original_max_position_embeddings must be a positive "
                             f"int, got {L!r}")
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor",
                     "high_freq_factor"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name))
        if self.attention_factor is not None:
            _number("attention_factor", self.attention_factor)
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise TypeError(f"rope_scaling truncate must be True or False, got {self.truncate!r}")
        if self.rope_type == "yarn" and not self.yarn_betas[0] > self.yarn_betas[1]:
            raise ValueError("rope_scaling beta_fast must be greater than beta_slow, got "
                             f"beta_fast={self.yarn_betas[0]}, beta_slow={self.yarn_betas[1]}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError("rope_scaling high_freq_factor must be greater than low_freq_factor,"
                             f" got high_freq_factor={self.high_freq_factor}, "
                             f"low_freq_factor={self.low_freq_factor}")

    @property
    def yarn_betas(self) -> tuple[float, float]:
        """(beta_fast, beta_slow) with YaRN's defaults (32, 1)."""
        return (32.0 if self.beta_fast is None else float(self.beta_fast),
                1.0 if self.beta_slow is None else float(self.beta_slow))

    @classmethod
    def from_dict(cls, config: dict) -> "RopeScaling":
        """From a config's rope_scaling dict ("type" is read as "rope_type"; rope_theta and
        partial_rotary_factor are left to the caller, who passes base and D)."""
        if not isinstance(config, dict):
            raise TypeError(f"rope_scaling must be a dict, got {type(config).__name__}")
        settings = {k: v for k, v in config.items() if k not in ("rope_theta", "type")}
        if "rope_type" not in settings and "type" in config:
            settings["rope_type"] = config["type"]
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"rope_scaling has unknown settings {unknown}; known: {known}")
        for name in ("rope_type", "factor"):
            if name not in settings:
                raise ValueError(f"rope_scaling needs {name}, got the settings {sorted(config)}")
        return cls(**settings)


EXAMPLE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}


class FrozenSettings(dict):
    """A dict that refuses to change: the rope_scaling a frozen config keeps (its own copy,
    still a dict for JSON and for `dataclasses.asdict`)."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a config's rope_scaling cannot be changed in place; make a new config "
                        "with dataclasses.replace(config, rope_scaling={...})")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple:  # copy, deepcopy and pickle rebuild it from a plain dict
        return (type(self), (dict(self),))


def check_rope_scaling(settings: Any, owner: str) -> FrozenSettings | None:
    """Check the rope_scaling field of a config (or a module's arguments) with its rope_base,
    d_model, n_heads and head_dim; errors name `owner`. -> a read-only copy of the dict or None.

    rope_scaling is None (plain RoPE) or a Hugging Face style dict such as
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}, read by
    `RopeScaling.from_dict`.
    """
    value = settings.rope_scaling
    if value is None:
        return None
    try:
        if not isinstance(value, dict):
            raise TypeError(f"rope_scaling must be None or a dict such as {EXAMPLE}, got "
                            f"{type(value).__name__}")
        scaling = RopeScaling.from_dict(value)
        D = getattr(settings, "head_dim", None) or settings.d_model // settings.n_heads
        if scaling.rope_type == "dynamic" and D < 4:
            raise ValueError(f"rope_scaling of rope_type 'dynamic' (NTK-aware) needs a head "
                             f"size D >= 4 (two planes), got D={D}")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: {error}") from None
    if settings.rope_base is None:
        raise ValueError(f"{owner}: rope_scaling scales the rotary frequencies, but there is "
                         "no RoPE here (rope_base=None)")
    return value if isinstance(value, FrozenSettings) else FrozenSettings(value)


def linear_frequencies(D: int, base: float, factor: float) -> Tensor:
    """Position interpolation (Chen et al. 2023): theta_n / factor, (D/2,) float64.

    Dividing every frequency by the factor is the same as dividing every position by it:
    positions 0 .. factor * L are squeezed back into the trained range 0 .. L.
    """
    return rope_frequencies(D, base) / factor


def dynamic_ntk_frequencies(D: int, base: float, factor: float, L: int, seq_len: int) -> Tensor:
    """Dynamic NTK-aware scaling (bloc97 2023; "dynamic" in Hugging Face), (D/2,) float64.

    NTK-aware scaling raises the base to base * s^(D / (D - 2)) for a stretch s; the dynamic
    form uses s = factor * T / L - (factor - 1) for the current length T = max(seq_len, L):
    s = 1 (plain RoPE) up to the trained length L, then growing by `factor` per further L.
    """
    T = max(seq_len, L)
    return scaled_rope_frequencies(D, factor * T / L - (factor - 1), "ntk", base)


def yarn_attention_factor(factor: float, mscale: float | None = None,
                          mscale_all_dim: float | None = None) -> float:
    """YaRN's attention temperature (Peng et al. 2023): sqrt(1/t) = 0.1 ln(s) + 1 for s > 1.

    cos and sin are multiplied by it, so every score q.k grows by its square. With DeepSeek's
    mscale and mscale_all_dim both set, it is m(s, mscale) / m(s, mscale_all_dim) with
    m(s, a) = 0.1 a ln(s) + 1 (and m = 1 for s <= 1).
    """
    def m(s: float, a: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * a * math.log(s) + 1.0

    if mscale and mscale_all_dim:
        return float(m(factor, mscale) / m(factor, mscale_all_dim))
    return m(factor)


def yarn_ramp(D: int, base: float, L: int, beta_fast: float, beta_slow: float,
              truncate: bool) -> tuple[float, float]:
    """(low, high): the planes where YaRN's ramp starts and ends (see `yarn_frequencies`)."""
    def plane(rotations: float) -> float:
        return D * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = plane(beta_fast), plane(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001  # as Hugging Face does: a step instead of a ramp
    return low, high


def yarn_frequencies(D: int, base: float, factor: float, L: int, beta_fast: float = 32.0,
                     beta_slow: float = 1.0, truncate: bool = True) -> Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2023), (D/2,) float64.

    Plane n turns L * theta_n / (2 pi) times over the trained context. Planes turning more
    than beta_fast times keep theta_n; planes turning fewer than beta_slow times get
    theta_n / factor (position interpolation); between them a linear ramp in n mixes the two.
    The plane that turns r times is n(r) = D ln(L / (2 pi r)) / (2 ln base); the ramp runs
    from n(beta_fast) to n(beta_slow) (floored and ceiled if truncate), clamped to 0 .. D - 1
    (D - 1 as in Hugging Face's code, although the planes stop at D/2 - 1).
    """
    low, high = yarn_ramp(D, base, L, beta_fast, beta_slow, truncate)
    n = torch.arange(D // 2, dtype=torch.float64)
    interpolated = ((n - low) / (high - low)).clamp(0, 1)  # 0: keep theta_n, 1: theta_n / factor
    theta = rope_frequencies(D, base)
    return theta / factor * interpolated + theta * (1 - interpolated)


def llama3_frequencies(D: int, base: float, factor: float, L: int, low_freq_factor: float,
                       high_freq_factor: float) -> Tensor:
    """Llama 3.1's frequencies (Meta, `apply_scaling` in llama-models), (D/2,) float64.

    By wavelength lambda_n = 2 pi / theta_n: planes with lambda_n < L / high_freq_factor keep
    theta_n, planes with lambda_n > L / low_freq_factor get theta_n / factor, and between them
    theta = (1 - s) theta_n / factor + s theta_n with s = (L / lambda_n - low) / (high - low).
    """
    theta = rope_frequencies(D, base)
    wavelength = 2 * math.pi / theta
    s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - s) * theta / factor + s * theta
    out = torch.where(wavelength > L / low_freq_factor, theta / factor, smoothed)
    return torch.where(wavelength < L / high_freq_factor, theta, out)


def rope_inverse_frequencies(
    D: int, base: float = 10000.0, scaling: RopeScaling | dict | None = None,
    seq_len: int | None = None, precision: str = "float64",
) -> tuple[Tensor, float]:
    """(theta, attention_factor): the D/2 frequencies (fastest first) and the factor that
    multiplies cos and sin, for `scaling` (a RopeScaling, a rope_scaling dict, or None for
    plain RoPE). seq_len is the current length, read by "dynamic" only (None: L).

    precision="float64" (the default) computes the formulas above in float64.
    precision="float32" computes theta in float32 operation for operation as Hugging Face
    (transformers 5.23) does, so that a model reproduces its rotary tables bit for bit
    (`hf_float32_frequencies`); as `tfbook.rope.rope_frequencies` does for plain RoPE.
    """
    if isinstance(D, bool) or not isinstance(D, int) or D <= 0 or D % 2:
        raise ValueError(f"RoPE needs a positive even head size D, got D={D!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    base = _number("base", base)
    if scaling is None:
        return rope_frequencies(D, base, precision), 1.0
    if isinstance(scaling, dict):
        scaling = RopeScaling.from_dict(scaling)
    if not isinstance(scaling, RopeScaling):
        raise TypeError("scaling must be a RopeScaling, a rope_scaling dict or None, got "
                        f"{type(scaling).__name__}")
    factor, L = float(scaling.factor), scaling.original_max_position_embeddings
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)
                                or seq_len <= 0):
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    if scaling.rope_type == "dynamic" and D < 4:
        raise ValueError(f"NTK-aware scaling needs D >= 4 (two planes), got D={D}")
    attention_factor = 1.0
    if scaling.rope_type == "yarn":
        attention_factor = (float(scaling.attention_factor)
                            if scaling.attention_factor is not None
                            else yarn_attention_factor(factor, scaling.mscale,
                                                       scaling.mscale_all_dim))
    if precision == "float32":
        return hf_float32_frequencies(D, base, scaling, seq_len), attention_factor
    if scaling.rope_type == "linear":
        return linear_frequencies(D, base, factor), 1.0
    if scaling.rope_type == "dynamic":
        return dynamic_ntk_frequencies(D, base, factor, L, L if seq_len is None else seq_len), 1.0
    if scaling.rope_type == "yarn":
        beta_fast, beta_slow = scaling.yarn_betas
        truncate = True if scaling.truncate is None else scaling.truncate
        theta = yarn_frequencies(D, base, factor, L, beta_fast, beta_slow, truncate)
        return theta, attention_factor
    return llama3_frequencies(D, base, factor, L, float(scaling.low_freq_factor),
                              float(scaling.high_freq_factor)), 1.0


def hf_float32_frequencies(D: int, base: float, scaling: RopeScaling,
                           seq_len: int | None = None) -> Tensor:
    """theta (D/2,) in float32, computed as transformers 5.23 computes its `inv_freq`.

    The same formulas as the float64 functions above, in Hugging Face's order of float32
    operations. "dynamic" follows HF's rotary module in a forward pass: up to the trained
    length L it keeps the table built at start (its base from Python floats); past L it
    rebuilds the table from the current length held as a tensor, so that the stretched base
    itself is computed in float32.
    """
    factor, L = float(scaling.factor), scaling.original_max_position_embeddings
    exponents = torch.arange(0, D, 2, dtype=torch.int64).to(torch.float32) / D  # (D/2,)
    if scaling.rope_type == "dynamic":
        if seq_len is not None and seq_len > L:
            T = torch.tensor(seq_len, dtype=torch.int64)  # as HF: max(position_ids) + 1
            base = base * ((factor * T / L) - (factor - 1)) ** (D / (D - 2))  # float32
        else:
            base = base * ((factor * L / L) - (factor - 1)) ** (D / (D - 2))  # Python float
    powers = base ** exponents  # (D/2,) base^(2n/D)
    theta = 1.0 / powers  # plain RoPE, as rope_frequencies(..., "float32")
    if scaling.rope_type == "dynamic":
        return theta
    if scaling.rope_type == "linear":
        return theta / factor
    if scaling.rope_type == "yarn":
        beta_fast, beta_slow = scaling.yarn_betas
        truncate = True if scaling.truncate is None else scaling.truncate
        low, high = yarn_ramp(D, base, L, beta_fast, beta_slow, truncate)
        interpolated = 1.0 / (factor * powers)
        ramp = ((torch.arange(D // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        kept = 1 - ramp  # HF's inv_freq_extrapolation_factor
        return interpolated * (1 - kept) + theta * kept
    low_f, high_f = float(scaling.low_freq_factor), float(scaling.high_freq_factor)
    wavelength = 2 * math.pi / theta
    low_wavelength, high_wavelength = L / low_f, L / high_f
    slowed = torch.where(wavelength > low_wavelength, theta / factor, theta)
    s = (L / wavelength - low_f) / (high_f - low_f)
    smoothed = (1 - s) * slowed / factor + s * slowed
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, slowed)


def scaled_rope_cos_sin(
    positions: Tensor, D: int, base: float, scaling: RopeScaling | dict,
    precision: str = "float64", dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """`tfbook.rope.rope_cos_sin` with a RoPE scaling: cos and sin of pos * theta_n for the
    scaled theta, both multiplied by the attention factor (YaRN's; 1 otherwise).

    "dynamic" reads the current length as Hugging Face does, max(positions) + 1 over the
    whole call (every row of a batch): a prefill of T tokens uses the table of length T for
    all of them, and each later step through a cache the table of its own length, while
    the keys already cached keep the rotation they were stored with.
    """
    if isinstance(scaling, dict):
        scaling = RopeScaling.from_dict(scaling)
    seq_len = None
    if isinstance(scaling, RopeScaling) and scaling.rope_type == "dynamic" and positions.numel():
        seq_len = int(positions.max()) + 1
    theta, factor = rope_inverse_frequencies(D, base, scaling, seq_len, precision)
    return rope_cos_sin(positions, D, base, precision, dtype, theta=theta, scale=factor)
