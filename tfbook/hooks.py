"""Hook points: named places inside a model where a run can be read or changed.

A `HookPoint` is a module that returns its input unchanged. The blocks pass the tensors worth
looking at through one (the residual stream before and after each sub-layer, each head's
queries, keys, values, attention weights and output, the feed-forward hidden units), so each
has a name, its path in the model: `blocks.3.attn.weights`, `blocks.3.residual_post`,
`blocks.3.ff.hidden`. Nothing happens at a hook point until a hook is registered on it, as
on any module (`register_forward_hook`); `tfbook.inspect` does that by name, and removes
its hooks after each run. TransformerLens (Nanda & Bloom 2022) made this the common way to
open up a transformer.

One hook point changes what the model computes when it is watched: the attention weights.
The fast kernels never form them, so attention falls back to the reference kernel, which does,
whenever a hook sits on `attn.weights` (the two agree to float rounding; the tests check).
"""

from torch import Tensor, nn


class HookPoint(nn.Module):
    """The identity, with a name in the model: a place for hooks to read or replace a tensor."""

    def forward(self, x: Tensor) -> Tensor:
        """x -> x (a hook registered on this module may return a replacement)."""
        return x

    @property
    def watched(self) -> bool:
        """Whether any hook is registered on this point (then its tensor must be computed)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)
