"""Models and float32 bounds shared by the tests of tfbook.inspect's lens, attribution, scores.

Random tiny decoders whose norms have gains in [0.5, 1.5] (and LayerNorm biases in
[-0.5, 0.5]), so that a forgotten gain or bias changes the numbers: with the default all-ones
gains and zero biases such a mistake would pass unseen.
"""

import torch
from torch import Tensor

from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.normalization import LayerNorm

U = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff, 2^-24


def gamma(n: int) -> float:
    """n u / (1 - n u): the relative error bound of a float32 sum of n products (Higham)."""
    return n * U / (1 - n * U)


def tiny_decoder(kind: str, seed: int = 0) -> GPT:
    """A tiny GPT ("gpt": LayerNorm, biases, learned positions) or Llama ("llama": RMSNorm,
    grouped heads, RoPE), random weights, gains and biases of the norms too, eval mode."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny() if kind == "gpt" else tiny_llama()).eval()
    with torch.no_grad():
        for norm in [model.norm_f] + [n for b in model.blocks for n in (b.norm1, b.norm2)]:
            norm.weight.uniform_(0.5, 1.5)
            if isinstance(norm, LayerNorm) and norm.bias is not None:
                norm.bias.uniform_(-0.5, 0.5)
        for block in model.blocks:  # writes into the stream as large as the embeddings
            block.attn.out_proj.weight.mul_(10.0)
            block.ff.fc_out.weight.mul_(10.0)
    return model


def readout_bound(h: Tensor, W: Tensor) -> Tensor:
    """How far two float32 computations of the logits h W^T may differ, elementwise, when
    their normed vectors h (..., C) were each computed within gamma_{C+8} relative of the same
    exact one: 2 (gamma_C + gamma_{C+8}) |h| |W|^T."""
    C = h.size(-1)
    return 2 * (gamma(C) + gamma(C + 8)) * (h.double().abs() @ W.double().abs().T)


def tiny_run(kind: str, names_of, batch: int, seed: int):
    """(model, ids (batch, 9), output, cache of names_of(model)) of `tiny_decoder(kind)`."""
    from tfbook.inspect import run_with_cache

    model = tiny_decoder(kind)
    ids = torch.randint(0, 256, (batch, 9), generator=torch.Generator().manual_seed(seed))
    out, cache = run_with_cache(model, ids, names=names_of(model))
    return model, ids, out, cache


def eiffel_run(names_of):
    """(SmolLM2, its tokenizer, ids, output, cache of names_of(model)) on the factual prompt
    "The Eiffel Tower is in the city of" (the answer " Paris")."""
    from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
    from tfbook.inspect import run_with_cache

    model, tok = load_smollm2(), load_smollm2_tokenizer()
    ids = torch.tensor([tok.encode("The Eiffel Tower is in the city of")])
    out, cache = run_with_cache(model, ids, names=names_of(model))
    return model, tok, ids, out, cache
