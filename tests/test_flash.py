"""tfbook.flash against torch's scaled_dot_product_attention: outputs, gradients, the online
softmax step by step, the autograd Function's interface (any leading dims, L saved), and
refused inputs.

Error bounds. Both sides round; a first-order worst-case analysis (Higham, ch. 3: a sum of n
products is off by at most n u sum|a_i b_i|, u the unit roundoff) bounds each entry of each
result by u times the same computation done on absolute values, times the length of the chain
of sums that feed it. `derived_bounds` computes that entrywise (in float64) and the tests
assert the difference stays below it (the sum of both sides' bounds). It is pessimistic
(n u instead of the sqrt(n) u rounding usually shows), so the tests also check the target the
book states: max |ours - torch| <= 1e-6 (float32) or 1e-12 (float64) times max(1, M), M the
magnitude of the terms the result sums (e.g. max P |V| for O; for dQ the terms of
dS = P (dP - D) before dP and D cancel). Over 4 seeds of every case and under scalar, AVX2 and
AVX-512 kernels the worst float32 error was about 0.4 of that target and 0.06 of the bound.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tfbook.attention import scaled_dot_product_attention
from tfbook.flash import (
    FlashAttention,
    flash_attention,
    flash_backward,
    flash_forward,
    online_softmax,
    online_softmax_steps,
    online_softmax_update,
    tile_map,
    tile_status,
)
from tfbook.masks import causal_mask

TARGET = {torch.float32: 1e-6, torch.float64: 1e-12}


def inputs(B, H, H_kv, T, S, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, H_kv, S, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, H_kv, S, D, generator=g, dtype=dtype).requires_grad_()
    grad_out = torch.randn(B, H, T, D, generator=g, dtype=dtype)
    return q, k, v, grad_out


def random_mask(B, T, S, seed=1):
    """(B, 1, T, S) with about half the keys hidden; every query keeps at least one key that
    the causal mask also leaves it (query i at position S - T + i sees keys j <= S - T + i)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, 1, T, S, generator=g) < 0.5
    visible = (torch.rand(T, generator=g) * (torch.arange(T) + S - T + 1)).long()
    mask[..., torch.arange(T), visible] = True
    return mask


def derived_bounds(q, k, v, grad_out, mask, dtype):
    """Entrywise worst-case rounding bounds of (O, dQ, dK, dV) for one side, first order."""
    u = torch.finfo(dtype).eps / 2  # unit roundoff
    q, k, v, g = (t.detach().double() for t in (q, k, v, grad_out))
    rep = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # (B, H, S, D)
    T, D, S = q.size(-2), q.size(-1), k.size(-2)
    scale = 1 / math.sqrt(D)
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    p = torch.softmax(s, dim=-1)  # (B, H, T, S), exact enough (float64)
    o = p @ v
    # scores: a dot product of length D; the probabilities inherit twice that error (the
    # score and the max or log-sum-exp subtracted from it), plus the exp, the division and a
    # rescaling per block (at most S of them) in relative terms
    score_err = (D + 2) * u * (q.abs() @ k.abs().transpose(-2, -1)) * scale  # (B, H, T, S)
    rel_p = 2 * score_err.amax(-1, keepdim=True) + (S + 4) * u  # (B, H, T, 1)
    err_o = rel_p * (p @ v.abs()) + (S + 1) * u * (p @ v.abs())  # (B, H, T, D)
    dp = g @ v.transpose(-2, -1)  # (B, H, T, S)
    delta = (g * o).sum(-1, keepdim=True)  # (B, H, T, 1)
    err_dp = (D + 1) * u * (g.abs() @ v.abs().transpose(-2, -1))
    err_delta = ((D + 1) * u * (g.abs() * o.abs()).sum(-1, keepdim=True)
                 + (g.abs() * err_o).sum(-1, keepdim=True))
    ds = p * (dp - delta)
    err_ds = rel_p * p * (dp - delta).abs() + p * (err_dp + err_delta + 2 * u * (dp - delta).abs())
    n = max(T, S) + 2
    err_dq = (err_ds + n * u * ds.abs()) @ k.abs() * scale  # (B, H, T, D)
    err_dk = (err_ds + n * u * ds.abs()).transpose(-2, -1) @ q.abs() * scale  # (B, H, S, D)
    err_dv = ((rel_p + n * u) * p).transpose(-2, -1) @ g.abs()  # (B, H, S, D)

    def fold(x):  # query heads sharing a key/value head add their gradients
        return x.unflatten(1, (-1, rep)).sum(2)

    # the magnitude of the terms each result sums (its size if no term cancelled another;
    # dS = P (dP - D) subtracts two numbers of size |dO| |V| that may cancel)
    ds_terms = p * (dp.abs() + delta.abs())  # (B, H, T, S)
    magnitudes = [(p @ v.abs()).max(), (ds_terms @ k.abs() * scale).max(),
                  fold(ds_terms.transpose(-2, -1) @ q.abs() * scale).max(),
                  fold(p.transpose(-2, -1) @ g.abs()).max()]
    return (err_o, err_dq, fold(err_dk), fold(err_dv)), [m.item() for m in magnitudes]


CASES = [  # B, H, H_kv, T, S, D, causal, mask, block_q, block_k
    (2, 2, 2, 37, 37, 8, False, None, 16, 16),  # T not a multiple of the blocks
    (2, 2, 2, 37, 37, 8, True, None, 16, 8),
    (1, 4, 2, 33, 50, 8, True, None, 8, 16),  # grouped heads, T != S: causal bottom-right
    (2, 6, 2, 40, 40, 8, False, "random", 16, 16),  # grouped heads with a mask
    (2, 2, 1, 25, 60, 8, True, "padding", 64, 64),  # one block larger than T and S
    (1, 2, 2, 48, 48, 8, True, "random", 1, 7),  # one query per block
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_equals_torch_sdpa_outputs_and_gradients(case, dtype):
    B, H, H_kv, T, S, D, causal, mask_kind, bq, bk = case
    q, k, v, grad_out = inputs(B, H, H_kv, T, S, D, dtype)
    mask = None
    if mask_kind == "random":
        mask = random_mask(B, T, S)
    elif mask_kind == "padding":
        mask = (torch.arange(S) < torch.tensor([S, S - 5])[:B, None])[:, None, None, :]
    full = mask
    if causal:
        full = causal_mask(T, S) if mask is None else mask & causal_mask(T, S)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=H != H_kv)
    out = flash_attention(q, k, v, mask=mask, causal=causal, block_q=bq, block_k=bk)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    bounds, magnitudes = derived_bounds(q, k, v, grad_out, full, dtype)
    for name, a, b, bound, magnitude in zip(("O", "dQ", "dK", "dV"), (out, *grads),
                                            (ref, *ref_grads), bounds, magnitudes, strict=True):
        err = (a - b).detach().abs().double()
        assert bool((err <= 2 * bound).all()), (name, (err / bound).max().item())
        assert err.max().item() <= TARGET[dtype] * max(1.0, magnitude), (name, err.max().item())


def test_fully_masked_rows_give_zeros_like_the_reference():
    q, k, v, grad_out = inputs(2, 2, 2, 20, 20, 8, torch.float64)
    mask = random_mask(2, 20, 20)
    mask[:, :, 3] = False  # query 3 sees nothing
    out = flash_attention(q, k, v, mask=mask, block_q=8, block_k=8)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert not a.isnan().any()


def test_more_queries_than_keys_causal():
    """T > S: the first T - S queries sit before every key and get zeros."""
    q, k, v, grad_out = inputs(1, 2, 1, 30, 12, 8, torch.float64)
    out = flash_attention(q, k, v, causal=True, block_q=8, block_k=5)
    mask = torch.ones(30, 12, dtype=torch.bool).tril(diagonal=12 - 30)
    ref, _ = scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                          v.repeat_interleave(2, 1), mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert torch.equal(out[:, :, :18], torch.zeros_like(out[:, :, :18]))
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_gradcheck_of_the_hand_written_backward():
    q, k, v, _ = inputs(1, 4, 2, 9, 11, 4, torch.float64)
    mask = random_mask(1, 9, 11)

    def f(q, k, v):
        return flash_attention(q, k, v, mask=mask, causal=True, block_q=4, block_k=3)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_no_query_by_key_matrix_is_ever_allocated():
    """Forward and backward: every tensor an operation returns is far smaller than T x S."""

    class LargestOutput(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    T = S = 512
    q, k, v, grad_out = inputs(1, 1, 1, T, S, 4, torch.float32)
    with LargestOutput() as mode:
        out = flash_attention(q, k, v, causal=True, block_q=32, block_k=32)
        out.backward(grad_out)
    assert mode.largest == T * 4  # the outputs and gradients (T, D); a tile is 32 x 32 = 1024
    assert mode.largest * 64 <= T * S


# -- the online softmax ----------------------------------------------------------------------

def test_online_softmax_invariant_after_every_block():
    x = torch.randn(3, 50, dtype=torch.float64) * 4
    steps = list(online_softmax_steps(x, 8))
    assert [end for end, _, _ in steps] == [8, 16, 24, 32, 40, 48, 50]
    for end, m, denom in steps:
        assert torch.equal(m, x[:, :end].amax(-1))  # the max of what has been seen: exact
        torch.testing.assert_close(denom, torch.exp(x[:, :end] - m[:, None]).sum(-1),
                                   rtol=1e-14, atol=0)
    torch.testing.assert_close(online_softmax(x, 8), torch.softmax(x, -1), rtol=1e-14, atol=0)
    for block in (1, 7, 50, 64):  # any block size gives the same softmax
        torch.testing.assert_close(online_softmax(x, block), torch.softmax(x, -1),
                                   rtol=1e-14, atol=0)


def test_online_softmax_update_worked_example_and_masked_entries():
    m, denom = torch.tensor(-math.inf), torch.tensor(0.0, dtype=torch.float64)
    m, denom, p, alpha = online_softmax_update(m.double(), denom, torch.tensor([1.0, 2.0]).double())
    assert m.item() == 2.0 and alpha.item() == 0.0
    assert math.isclose(denom.item(), math.exp(-1) + 1, rel_tol=1e-15)
    m, denom, p, alpha = online_softmax_update(m, denom, torch.tensor([3.0]).double())
    assert math.isclose(denom.item(), (math.exp(-1) + 1) * math.exp(-1) + 1, rel_tol=1e-15)
    assert math.isclose(alpha.item(), math.exp(-1), rel_tol=1e-15)
    # a block with only masked scores leaves an empty row empty (no NaN)
    m0, l0 = torch.tensor([-math.inf]), torch.tensor([0.0])
    m1, l1, p1, _ = online_softmax_update(m0, l0, torch.full((1, 4), -math.inf))
    assert m1.item() == -math.inf and l1.item() == 0.0 and torch.equal(p1, torch.zeros(1, 4))
    # large scores do not overflow: everything is relative to the running max
    x = torch.tensor([[1000.0, 1001.0, 999.0]])
    torch.testing.assert_close(online_softmax(x, 2), torch.softmax(x, -1))


# -- the autograd Function: any leading dims, L saved (the CS336 assignment 2 interface) -----

@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_function_takes_any_leading_dims_and_saves_the_log_sum_exp(lead, is_causal):
    g = torch.Generator().manual_seed(2)
    T, D = 19, 8
    q, k, v = (torch.randn(*lead, T, D, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    out = FlashAttention.apply(q, k, v, is_causal)
    assert out.shape == (*lead, T, D)
    saved = [t for t in out.grad_fn.saved_tensors if t.shape == (*lead, T)]
    assert len(saved) == 1  # exactly one tensor of shape (..., T): L
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    if is_causal:
        scores = scores.masked_fill(~causal_mask(T), -math.inf)
    torch.testing.assert_close(saved[0], torch.logsumexp(scores, -1), rtol=0, atol=1e-12)
    ref = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_function_on_the_cs336_shapes_in_float32():
    """(4, 128, 64) float32 inputs, as the CS336 tests use, against a direct computation."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 128, 64, requires_grad=True) for _ in range(3))
    for is_causal in (False, True):
        out = FlashAttention.apply(q, k, v, is_causal)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


# -- the tiles -------------------------------------------------------------------------------

def test_tile_map_skips_the_blocks_above_the_diagonal():
    tiles = tile_map(64, 64, 16, 16, causal=True)
    assert [row.count("skipped") for row in tiles] == [3, 2, 1, 0]
    assert [row.count("partial") for row in tiles] == [1, 1, 1, 1]  # the diagonal
    assert all(s == "full" for row in tile_map(64, 64, 16, 16, causal=False) for s in row)
    # a cache: 4 new queries after 60 cached keys see every key block
    assert tile_status(0, 4, 0, 16, 4, 64, causal=True) == "full"
    assert tile_status(0, 4, 48, 64, 4, 64, causal=True) == "partial"


# -- refused inputs --------------------------------------------------------------------------

def test_refuses_bad_inputs_with_clear_messages():
    q, k, v, _ = inputs(1, 4, 2, 5, 6, 8, torch.float32)
    with pytest.raises(TypeError, match="block_q must be a positive int, got float"):
        flash_attention(q, k, v, block_q=16.0)
    with pytest.raises(TypeError, match="block_k must be a positive int, got bool"):
        flash_attention(q, k, v, block_k=True)
    with pytest.raises(ValueError, match="block_k must be a positive int, got 0"):
        flash_attention(q, k, v, block_k=0)
    with pytest.raises(ValueError, match=r"heads .* may be a multiple of k's"):
        flash_attention(q, k[:, :1].expand(1, 3, 6, 8), v[:, :1].expand(1, 3, 6, 8))
    with pytest.raises(ValueError, match="matching D"):
        flash_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="k, v sharing"):
        flash_attention(q, k, v[:, :, :5])
    with pytest.raises(TypeError, match="one dtype"):
        flash_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="floating-point"):
        flash_attention(q, k.long(), v)
    with pytest.raises(ValueError, match=r"expects q of shape \(B, H, T, D\)"):
        flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match="same batch size"):
        flash_attention(q.expand(2, 4, 5, 8), k, v)
    with pytest.raises(ValueError, match=r"mask must broadcast to \(1, 4, 5, 6\)"):
        flash_attention(q, k, v, mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        flash_attention(q, k, v, mask=torch.ones(5, 6))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        FlashAttention.apply(q, k, v, 1)
    with pytest.raises(ValueError, match="same leading dimensions"):
        FlashAttention.apply(q[0], k, v)
    with pytest.raises(TypeError, match="block must be a positive int"):
        online_softmax(torch.randn(4), 2.5)
    with pytest.raises(TypeError, match=r"online_softmax expects a floating-point tensor .*int64"):
        online_softmax(torch.arange(4), 2)


def test_head_size_zero_is_refused_before_torch_sees_it():
    """1 / sqrt(D) with D = 0 would divide by zero inside the kernel; v with Dv = 0 is a slip."""
    q, k, v, _ = inputs(1, 2, 2, 5, 6, 8, torch.float32)
    message = r"head sizes D .* and Dv .* must be at least 1, got q \(1, 2, 5, 0\)"
    with pytest.raises(ValueError, match=message):
        flash_attention(q[..., :0], k[..., :0], v[..., :0])
    with pytest.raises(ValueError, match=message):
        FlashAttention.apply(q[..., :0], k[..., :0], v[..., :0], False)
    with pytest.raises(ValueError, match=r"must be at least 1, got q \(1, 2, 5, 8\), "
                                         r"v \(1, 2, 6, 0\)"):
        flash_attention(q, k, v[..., :0])
    q5, k5, v5 = q[:, :, None, :, :0], k[:, :, None, :, :0], v[:, :, None, :, :0]
    with pytest.raises(ValueError, match="must be at least 1"):
        flash_forward(q5, k5, v5, None, False, 4, 4)


def test_tile_map_and_tile_status_refuse_bad_sizes():
    with pytest.raises(ValueError, match="T must be an int >= 0, got -3"):
        tile_map(-3, 5, 2, 2, causal=True)
    with pytest.raises(ValueError, match="S must be an int >= 0, got -1"):
        tile_map(3, -1, 2, 2, causal=False)
    with pytest.raises(TypeError, match="T must be an int >= 0, got float 3.0"):
        tile_map(3.0, 5, 2, 2, causal=True)
    with pytest.raises(TypeError, match="S must be an int >= 0, got bool True"):
        tile_map(3, True, 2, 2, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool, got str 'yes'"):
        tile_map(3, 5, 2, 2, causal="yes")
    with pytest.raises(ValueError, match="block_k must be a positive int, got -2"):
        tile_map(3, 5, 2, -2, causal=True)
    assert tile_map(0, 5, 2, 2, causal=True) == []  # no queries: no tiles
    with pytest.raises(ValueError, match=r"inside the \(T, S\) grid.*queries \[3, 1\)"):
        tile_status(3, 1, 0, 2, 4, 4, causal=True)
    with pytest.raises(ValueError, match=r"keys \[0, 5\), T=4, S=4"):
        tile_status(0, 2, 0, 5, 4, 4, causal=True)
    with pytest.raises(ValueError, match="i0 must be an int >= 0, got -1"):
        tile_status(-1, 2, 0, 2, 4, 4, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool, got int 1"):
        tile_status(0, 2, 0, 2, 4, 4, causal=1)


def test_flash_attention_refuses_wrong_types_and_devices():
    q, k, v, _ = inputs(1, 2, 2, 5, 6, 8, torch.float32)
    with pytest.raises(TypeError, match=r"expects q to be a torch.Tensor .*got list"):
        flash_attention([[1.0]], k, v)
    with pytest.raises(TypeError, match="causal must be a bool, got int 1"):
        flash_attention(q, k, v, causal=1)  # the name the caller used, not is_causal
    with pytest.raises(TypeError, match="causal must be a bool, got NoneType"):
        flash_attention(q, k, v, causal=None)
    with pytest.raises(ValueError, match=r"must be on one device, got q cpu, k meta, v cpu"):
        flash_attention(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="mask must be on q's device cpu, got meta"):
        flash_attention(q, k, v, mask=torch.ones(5, 6, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match=r"must share one dtype, got q torch.float32, "
                                        r"k torch.float32, v torch.float64"):
        flash_attention(q, k, v.double())


def test_the_grouped_kernels_refuse_a_wrong_layout():
    """flash_forward and flash_backward are public: they check the 5-d layout they assume."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 3, 7, 4, generator=g)  # (N, H_kv, n_rep, T, D)
    k, v = torch.randn(2, 1, 2, 1, 9, 4, generator=g).unbind(0)  # (N, H_kv, 1, S, D)
    out, lse = flash_forward(q, k, v, None, True, 4, 4)
    grad_out = torch.randn(out.shape, generator=g)
    with pytest.raises(ValueError,
                       match=r"expects q \(N, H_kv, n_rep, T, D\).*got q \(2, 3, 7, 4\)"):
        flash_forward(q[0], k, v, None, True, 4, 4)
    with pytest.raises(ValueError, match=r"k \(N, H_kv, 1, S, D\).*k \(1, 2, 3, 9, 4\)"):
        flash_forward(q, k.expand(1, 2, 3, 9, 4), v, None, True, 4, 4)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_forward(q, k, v, None, "yes", 4, 4)
    with pytest.raises(TypeError, match="block_q must be a positive int, got float"):
        flash_forward(q, k, v, None, True, 4.0, 4)
    with pytest.raises(TypeError, match="mask None or a boolean tensor"):
        flash_forward(q, k, v, torch.ones(1, 2, 3, 7, 9), True, 4, 4)
    with pytest.raises(ValueError, match=r"mask of shape \(N, H_kv, n_rep, T, S\) = "
                                         r"\(1, 2, 3, 7, 9\)"):
        flash_forward(q, k, v, torch.ones(7, 9, dtype=torch.bool), True, 4, 4)
    with pytest.raises(ValueError, match=r"expects lse of shape \(1, 2, 3, 7\), got \(1, 2, 3\)"):
        flash_backward(grad_out, q, k, v, out, lse[..., 0], None, True, 4, 4)
    with pytest.raises(ValueError, match=r"expects grad_out of shape \(1, 2, 3, 7, 4\)"):
        flash_backward(grad_out[..., :3], q, k, v, out, lse, None, True, 4, 4)
    with pytest.raises(TypeError, match=r"must share one dtype, got .*lse torch.float64"):
        flash_backward(grad_out, q, k, v, out, lse.double(), None, True, 4, 4)


def test_online_softmax_update_refuses_mismatched_running_values():
    m, denom = torch.full((3,), -math.inf), torch.zeros(3)
    with pytest.raises(ValueError, match=r"m \(3,\), denom \(2,\), scores \(3, 4\)"):
        online_softmax_update(m, denom[:2], torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"with n >= 1, got .*scores \(3, 0\)"):
        online_softmax_update(m, denom, torch.randn(3, 0))
    with pytest.raises(TypeError, match="one dtype, got m torch.float64, denom torch.float32"):
        online_softmax_update(m.double(), denom, torch.randn(3, 4))
    with pytest.raises(TypeError, match=r"floating-point tensors, got scores .*int64"):
        online_softmax_update(m, denom, torch.arange(12).view(3, 4))
    with pytest.raises(TypeError, match="floating-point tensors, got m float"):
        online_softmax_update(0.0, denom, torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"n >= 1, got tensor of shape \(3, 0\)"):
        online_softmax_steps(torch.randn(3, 0), 2)  # refused at the call, not at the first step
    with pytest.raises(ValueError, match=r"n >= 1, got tensor of shape \(\)"):
        online_softmax(torch.tensor(1.0), 2)
    with pytest.raises(TypeError, match="floating-point tensor .*got list"):
        online_softmax_steps([1.0, 2.0], 2)


def test_nan_inputs_reach_the_outputs_that_depend_on_them():
    """Not refused, but never hidden: as in torch, a NaN makes NaN of what depends on it."""
    q, k, v, _ = inputs(1, 1, 1, 6, 6, 4, torch.float64)
    q, k, v = (t.detach().clone() for t in (q, k, v))
    q[0, 0, 2, 0] = math.nan  # query 2
    out = flash_attention(q, k, v, causal=True, block_q=2, block_k=2)
    assert out[0, 0, 2].isnan().all() and not out[0, 0, [0, 1, 3, 4, 5]].isnan().any()
    q[0, 0, 2, 0] = 0.0
    v[0, 0, 3, 1] = math.nan  # key 3's value: seen by queries 3, 4, 5 under the causal mask
    out = flash_attention(q, k, v, causal=True, block_q=2, block_k=2)
    assert out[0, 0, 3:].isnan().any(-1).all()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out.isnan().any(-1)[0, 0, 3:], ref.isnan().any(-1)[0, 0, 3:])


def test_non_contiguous_inputs_as_multi_head_attention_passes_them():
    """split_heads gives (B, H, T, D) views of (B, T, H, D) tensors: strided, not contiguous."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 30, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 2, 30, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = x.transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous()
    out = flash_attention(q, k, v, causal=True, block_q=8, block_k=8)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, (x, kv), grad_out),
                    torch.autograd.grad(ref, (x, kv), grad_out), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_growth_exponent_ignores_the_constant_and_refuses_bad_lengths():
    from tfbook.measure import growth_exponent

    lengths = [256, 512, 1024, 2048]
    assert abs(growth_exponent(lengths, [300_000 + 8 * t for t in lengths]) - 1) < 1e-9
    assert abs(growth_exponent(lengths, [300_000 + 4 * t * t for t in lengths]) - 2) < 1e-9
    with pytest.raises(ValueError, match="lengths that double"):
        growth_exponent([256, 500, 1024], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 3 lengths"):
        growth_exponent([256, 512], [1, 2])
    with pytest.raises(ValueError, match="sizes that grow"):
        growth_exponent([256, 512, 1024], [3, 2, 4])


def test_attention_peaks_refuses_unknown_kernels_passes_and_lengths():
    from tfbook.measure import attention_peak, attention_peaks

    with pytest.raises(ValueError, match="kernel must be one of"):
        attention_peaks(256, kernels=["naive"])
    with pytest.raises(ValueError, match="pass must be one of"):
        attention_peaks(256, passes=["backward"])
    with pytest.raises(ValueError, match="positive int"):
        attention_peak("flash", "forward", 0)
    with pytest.raises(ValueError, match="at least one kernel"):
        attention_peaks(256, kernels=[])
