"""Position-wise FFN and its activations."""

import pytest
import torch
import torch.nn.functional as F

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.feedforward import FeedForward, activation, gelu, gelu_tanh, relu


def few_roundings(x: torch.Tensor) -> torch.Tensor:
    """A few units in the last place of float32 at |x|: two kernels of one formula agree to it."""
    return 4 * torch.finfo(torch.float32).eps * (1 + x.abs())


def test_activations_equal_torch():
    x = torch.linspace(-6, 6, 1001)
    assert torch.equal(relu(x), F.relu(x))
    assert ((gelu(x) - F.gelu(x)).abs() <= few_roundings(x)).all()
    assert ((gelu_tanh(x) - F.gelu(x, approximate="tanh")).abs() <= few_roundings(x)).all()


@pytest.mark.parametrize("name", ["relu", "gelu"])
def test_ffn_is_two_linears_and_acts_per_position(name):
    torch.manual_seed(0)
    ff = FeedForward(8, 32, name)
    x = torch.randn(2, 5, 8)
    act = F.relu if name == "relu" else F.gelu
    expected = act(x @ ff.fc_in.weight.T + ff.fc_in.bias) @ ff.fc_out.weight.T + ff.fc_out.bias
    assert torch.allclose(ff(x), expected, atol=1e-6)
    # position-wise: each position is transformed on its own
    assert torch.allclose(ff(x[:, 2:3]), ff(x)[:, 2:3], atol=1e-6)


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_fused_activation_is_the_same_function(name):
    x = torch.linspace(-6, 6, 1001)
    assert ((activation(name)(x) - activation(name, fused=True)(x)).abs()
            <= few_roundings(x)).all()


def test_unknown_activation():
    with pytest.raises(ValueError, match="one of .*got 'swish'"):
        activation("swish")


@THREAD_COUNTS
def test_swiglu_equals_its_formula_and_hugging_face(n_threads):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    from tfbook.feedforward import SwiGLU

    torch.manual_seed(0)
    ours = SwiGLU(8, 24)
    ref = LlamaMLP(LlamaConfig(hidden_size=8, intermediate_size=24, hidden_act="silu",
                                   num_attention_heads=2, num_key_value_heads=2))
    ref.gate_proj.weight.data.copy_(ours.fc_gate.weight)
    ref.up_proj.weight.data.copy_(ours.fc_in.weight)
    ref.down_proj.weight.data.copy_(ours.fc_out.weight)
    x = torch.randn(2, 5, 8)
    gate, value = x @ ours.fc_gate.weight.T, x @ ours.fc_in.weight.T
    by_formula = (gate * torch.sigmoid(gate) * value) @ ours.fc_out.weight.T
    assert (ours(x) - by_formula).abs().max() <= 1e-6
    fused = SwiGLU(8, 24, fused=True)  # torch's F.silu, the kernel Hugging Face calls
    fused.load_state_dict(ours.state_dict())
    with pinned_threads(n_threads):  # bit for bit: the same kernels, the same threads
        assert torch.equal(fused(x), ref(x))
    assert (ours(x) - ref(x)).abs().max() <= 1e-6  # our x * sigmoid(x): the same function


def test_unknown_ffn():
    from tfbook.feedforward import make_ffn

    with pytest.raises(ValueError, match=r"ffn must be one of \('mlp', 'swiglu'\), got 'moe'"):
        make_ffn("moe", 8, 16, "relu", 0.0, True, False)
