"""Packing a model's weights for decoding: fewer, larger matrix products, in the layout the
matrix library reads fastest.

A decode step at batch 1 multiplies one vector by every weight matrix, so it has to read every
weight once; on a CPU its speed is bounded by the memory bandwidth (`bench/bench_decode.py`
measures both). Two things keep a model written for reading and training away from that bound:

1. Many small products. Every call pays a fixed cost (Python, dispatch, waking the other
   threads) that a 1 MB matrix does not hide. The queries, keys and values are three products
   of the same input, and SwiGLU's gate and value two: stacked into one matrix they are one
   product, whose output is split afterwards,

       [q | k | v] = x [W_Q; W_K; W_V]^T        [g | u] = x [W_gate; W_1]^T

   (GPT-2's checkpoints store W_Q, W_K, W_V stacked as `c_attn`; serving engines such as vLLM
   stack them at load time).
2. The layout. A matrix-vector product with an (O, K) matrix stored row by row computes O
   dot products of length K; stored column by column it adds K scaled columns of length O.
   The two read the same bytes, but the matrix library's kernels for them differ in speed.
   With the MKL that torch ships, on the 2-core machine of the book's stored run, both ran
   on one thread, and the column-major kernel read the matrices with more outputs than
   inputs (K = 576 for SmolLM2's) faster. So a packed matrix with more outputs than inputs
   is stored column by column. Another library or processor may rank the two orders
   differently: `bench/bench_decode.py` measures both, and the threads each one uses.

`pack_for_decoding(model)` does both without changing any parameter's name, shape or value:
each parameter becomes a view into its packed matrix (a slice of its rows), so the state
dict, loading with `load_state_dict` and training (which updates the views in place) are
unchanged. A module uses its packed matrix only when gradients are off (the separate products
carry the gradients to their own parameters) and while its parameters still are those views:
after `.to()`, a deep copy or new parameters it computes the separate products again, the
plain path, with the same result.

The layout is chosen for decoding one sequence. With a batch of rows (beam search's beams, a
prefill) the products become matrix-matrix ones, which the library runs with other kernels
(and on every thread) in either layout: there the stacking saves calls, and the layout
matters much less (the benchmark's roofline points compare the two).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.attention import MultiHeadAttention
from tfbook.feedforward import SwiGLU
from tfbook.quantize import Int8Linear, int8_linear


def column_major(w: Tensor) -> Tensor:
    """The same (O, K) matrix stored column by column: strides (1, O) instead of (K, 1)."""
    return w.t().contiguous().t()


class PackedLinear:
    """The `nn.Linear` layers `names` of `owner`, which read the same input, stored as one
    (sum O_i, C) matrix.

    The layers' weights (and biases) become views of the packed matrix (each its own rows):
    one product computes every layer's output, and `split` cuts it into each layer's part.
    """

    def __init__(self, owner: nn.Module, names: Sequence[str], column: bool | None = None) -> None:
        layers = [getattr(owner, name, None) for name in names]
        kind = type(layers[0]) if layers else None
        if kind not in (nn.Linear, Int8Linear) or not all(type(x) is kind for x in layers):
            raise TypeError(f"PackedLinear packs nn.Linear layers (or Int8Linear ones), got "
                            f"{[type(layer).__name__ for layer in layers]} for {list(names)}")
        self.int8 = kind is Int8Linear
        stored = [layer.codes if self.int8 else layer.weight for layer in layers]
        for layer, w in zip(layers, stored, strict=True):
            if (w.size(1), w.dtype, w.device) != (stored[0].size(1), stored[0].dtype,
                                                  stored[0].device):
                raise ValueError(
                    "PackedLinear packs layers with the same input width, dtype and device, "
                    f"got {[(tuple(x.shape), str(x.dtype)) for x in stored]}")
            if (layer.bias is None) != (layers[0].bias is None):
                raise ValueError("PackedLinear packs layers that all have biases or none")
        self.owner, self.names, self.layers = owner, tuple(names), layers
        self.sizes = [layer.out_features for layer in layers]
        self.column = (not self.int8 and sum(self.sizes) > stored[0].size(1)
                       if column is None else bool(column))
        with torch.no_grad():
            weight = torch.cat(stored)  # (sum O_i, C): float weights or int8 codes
            self.weight = column_major(weight) if self.column else weight.contiguous()
            self.scale = torch.cat([layer.scale for layer in layers]) if self.int8 else None
            self.bias = (None if layers[0].bias is None
                         else torch.cat([layer.bias for layer in layers]))  # (sum O_i,)
            for i, layer in enumerate(layers):  # each tensor becomes a view of its rows
                for name, packed in (("codes" if self.int8 else "weight", self.weight),
                                     ("scale", self.scale), ("bias", self.bias)):
                    if packed is not None:
                        getattr(layer, name).data = packed.split(self.sizes)[i]
        self.pointers = self._pointers()

    def _pointers(self) -> list[int]:
        names = ("codes", "scale", "bias") if self.int8 else ("weight", "bias")
        return [t.data_ptr() for layer in self.layers for t in
                (getattr(layer, name) for name in names) if t is not None]

    def usable(self) -> bool:
        """True when the packed product equals the layers' own: no gradients are wanted, the
        owner still has these layers (not, say, LoRA-wrapped ones) and every parameter still
        is its view (not replaced by `.to()`, a copy or new weights)."""
        return (not torch.is_grad_enabled()
                and all(getattr(self.owner, name) is layer
                        for name, layer in zip(self.names, self.layers, strict=True))
                and self._pointers() == self.pointers)

    def __call__(self, x: Tensor) -> tuple[Tensor, ...]:
        """x (..., C) -> each layer's output (..., O_i), from one product."""
        if not self.int8:
            return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        return int8_linear(x, self.weight, self.scale, self.bias).split(self.sizes, dim=-1)


def pack_for_decoding(model: nn.Module) -> nn.Module:
    """Pack `model`'s weights for fast decoding, in place; returns the model.

    Every attention module's W_Q, W_K, W_V and every SwiGLU's W_gate, W_1 become one matrix
    each (`PackedLinear`); every other linear layer with more outputs than inputs (the
    output layer, an MLP's first layer) is stored column by column. Names, shapes and values
    of the parameters do not change; nor does any output beyond float rounding (one product
    sums in another order than three).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"pack_for_decoding needs an nn.Module, got {type(model).__name__}")
    packed: set[int] = set()
    for module in model.modules():
        groups = {MultiHeadAttention: ("packed_qkv", ("q_proj", "k_proj", "v_proj")),
                  SwiGLU: ("packed_gate_in", ("fc_gate", "fc_in"))}.get(type(module))
        if groups is None:
            continue
        attribute, names = groups
        kinds = {type(getattr(module, name)) for name in names}
        if kinds in ({nn.Linear}, {Int8Linear}):  # not LoRA, not a mix
            setattr(module, attribute, PackedLinear(module, names))
            packed.update(id(getattr(module, name)) for name in names)
    with torch.no_grad():
        for module in model.modules():
            if (type(module) is nn.Linear and id(module) not in packed
                    and module.out_features > module.in_features):
                module.weight.data = column_major(module.weight.data)
    return model
