"""The RoPE-rotations widget: the planes of q and k turning with position, and the score.

RoPE (Su et al. 2021) rotates plane n of a head vector by pos * theta_n. The widget draws
every plane of a query vector (rotated for position i) and of a key vector (rotated for
position j) as two arrows in a small circle: the fast planes (theta_n near 1) spin, the slow
ones barely move. Beside them, the score q_i . k_j against the offset m = j - i, and each
plane's term of that score. Python only provides the frequencies and the two vectors; the
page rotates them itself with the rotation formula, so sliders and hovers work without a
kernel. In Jupyter, a new head size, base or seed asks Python for new vectors.
"""

from __future__ import annotations

import torch
import traitlets

from tfbook.rope import apply_rope, rope_frequencies
from tfbook.widgets.base import Widget, bundle, rounded

MAX_HEAD_SIZE = 64  # at most 32 planes: each is drawn as its own circle
MAX_POSITIONS = 512


def _positive_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


class RopeExplorer(Widget):
    """Position sliders rotate the planes of q and k; the score is plotted against the offset."""

    _esm = bundle("rope.js")

    theta = traitlets.List().tag(sync=True)  # (D/2,) frequencies theta_n, fastest first
    q = traitlets.List().tag(sync=True)  # (D,) the query vector before rotation
    k = traitlets.List().tag(sync=True)  # (D,) the key vector before rotation
    head_size = traitlets.Int(16).tag(sync=True)  # D, the width of one head
    base = traitlets.Float(10000.0).tag(sync=True)  # theta_n = base^(-2n / D)
    seed = traitlets.Int(0).tag(sync=True)  # seed of the random q (and k)
    match = traitlets.Bool(True).tag(sync=True)  # True: k = q (a key that matches the query)
    n_positions = traitlets.Int(128).tag(sync=True)  # positions 0 .. N-1 on the sliders
    query_position = traitlets.Int(0).tag(sync=True)  # i
    key_position = traitlets.Int(0).tag(sync=True)  # j

    def __init__(self, head_size: int = 16, base: float = 10000.0, seed: int = 0,
                 match: bool = True, n_positions: int = 128, query_position: int = 0,
                 key_position: int = 3) -> None:
        super().__init__()
        self.n_positions = _positive_int("n_positions", n_positions, 2, MAX_POSITIONS)
        self.compute(head_size=head_size, base=base, seed=seed, match=match)
        last = self.n_positions - 1
        self.query_position = min(max(int(query_position), 0), last)
        self.key_position = min(max(int(key_position), 0), last)

    def compute(self, head_size: int | None = None, base: float | None = None,
                seed: int | None = None, match: bool | None = None) -> None:
        """New frequencies and vectors for a head size D, a base, a seed, k = q or not."""
        head_size = self.head_size if head_size is None else head_size
        base = self.base if base is None else base
        seed = self.seed if seed is None else seed
        match = self.match if match is None else match
        _positive_int("head_size", head_size, 2, MAX_HEAD_SIZE)
        if head_size % 2:
            raise ValueError(f"head_size must be even (RoPE rotates pairs), got {head_size}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base must be a number greater than 1, got {base!r}")
        _positive_int("seed", seed, 0, 2**31 - 1)
        if not isinstance(match, bool):
            raise TypeError(f"match must be True or False, got {match!r}")
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(head_size, generator=g, dtype=torch.float64)  # (D,)
        k = q.clone() if match else torch.randn(head_size, generator=g, dtype=torch.float64)
        with self.hold_sync():
            self.theta = rounded(rope_frequencies(head_size, float(base)), 8)
            self.q, self.k = rounded(q), rounded(k)
            self.head_size, self.base, self.seed, self.match = (
                head_size, float(base), seed, match)

    def scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Offsets m = j - i in [-(N-1), N-1] and the score q_0 . k_m there, by `apply_rope`.

        What the page computes with its own rotation formula; the tests compare the two.
        """
        N = self.n_positions
        q = torch.tensor(self.q, dtype=torch.float64)  # (D,)
        k = torch.tensor(self.k, dtype=torch.float64)  # (D,)
        positions = torch.arange(N)  # (N,)
        q_rot = apply_rope(q.expand(N, -1), positions, base=self.base)  # (N, D): q at i
        k_rot = apply_rope(k.expand(N, -1), positions, base=self.base)  # (N, D): k at j
        offsets = torch.arange(-(N - 1), N)  # (2N-1,)
        # for m >= 0 put q at 0 and k at m; for m < 0 put q at -m and k at 0
        scores = torch.stack([q_rot[max(-m, 0)] @ k_rot[max(m, 0)] for m in offsets.tolist()])
        return offsets, scores
