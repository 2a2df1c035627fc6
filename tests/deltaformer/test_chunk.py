"""Tests for the chunked DeltaFormer (Xu et al., NeurIPS 2025, Sec. 3.4): forward and every input
gradient against the literal recurrence of Sec. 3.2, the beta = 0 Transformer limit, the
linear-kernel DeltaNet limit of Sec. 3.1 / App. A, gradcheck, and input validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from furnace.deltaformer import KAPPA1_KINDS, deltaformer_chunk, deltaformer_naive
from furnace.deltaformer.chunk import deltanet_chunk
from furnace.deltaformer.naive import deltanet_naive
from furnace.runtime.testing import max_relative_error

# Max elementwise error over the reference's largest magnitude, floored at the scale the
# inputs set (see _gradient_floor, _output_floor): 1e-12 is ~1e4 float64 ulps of O(1) sums
# over T <= 130. The float32 1e-4 is ~1e3 ulps: the chunked path and the loop sum in other
# orders, and BLAS splits its sums differently with 1 or 2 threads; both stay ~1e-6 here.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-4}


def _make_inputs(batch, seq_len, heads, dim, dtype, kappa1, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k, v, w = (randn(batch, seq_len, heads, dim) for _ in range(4))
    if kappa1 != "softmax":
        # Unnormalised kernels can make u grow with T; unit-norm w, k keep the test well scaled.
        k = F.normalize(k, dim=-1)
        w = F.normalize(w, dim=-1)
    if kappa1 == "round":
        # Dyadic entries make every w.k exact in both dtypes and both summation orders, so the
        # rounding cannot land on different sides of a .005 boundary in the two paths.
        k = torch.round(k * 16) / 16
        w = torch.round(w * 16) / 16
    gen_uniform = torch.rand(2, batch, seq_len, heads, generator=generator, dtype=torch.float64)
    beta, alpha = gen_uniform[0], 0.5 + gen_uniform[1]
    return [x.to(dtype).requires_grad_() for x in (q, k, v, w, beta, alpha)]


def _relative_error(reference, candidate, floor=None):
    return max_relative_error(reference, candidate, scale=floor)


def _output_floor(v, alpha=None):
    """The magnitude the output is built from: o is a softmax mix of u = solve(alpha v)."""
    scaled = v.detach() if alpha is None else alpha.detach()[..., None] * v.detach()
    return scaled.abs().max().item()


def _gradient_floor(output, grad_out):
    """The magnitude every input gradient is built from: |output| times |upstream gradient|.

    At T = 1 the gradients of q, w and beta are exactly zero in the reference (the output is
    u_0 whatever they are), and SDPA's backward returns ~5e-16 there: a pure ratio would
    divide by zero. Rounding in any gradient is relative to this scale, not to zero.
    """
    return (output.detach().abs().max() * grad_out.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("kappa1", KAPPA1_KINDS)
@pytest.mark.parametrize("seq_len", [1, 7, 130])
def test_chunk_matches_naive_forward_and_grads(seq_len, kappa1, dtype):
    q, k, v, w, beta, alpha = inputs = _make_inputs(2, seq_len, 2, 8, dtype, kappa1)
    reference = deltaformer_naive(q, k, v, w, beta, kappa1=kappa1, alpha=alpha)
    grad_out = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    # At T = 1 the recurrence never reads w or beta: their gradients are exactly zero.
    reference_grads = torch.autograd.grad(
        reference, inputs, grad_out, allow_unused=True, materialize_grads=True
    )
    names = ("q", "k", "v", "w", "beta", "alpha")
    tol = TOLERANCE[dtype]
    floor = _gradient_floor(reference, grad_out)
    out_floor = _output_floor(v, alpha)
    for chunk_size in sorted({1, 16, 32, seq_len}):
        out = deltaformer_chunk(q, k, v, w, beta, kappa1=kappa1, alpha=alpha, chunk_size=chunk_size)
        assert out.shape == reference.shape and out.dtype == dtype
        err = _relative_error(reference, out, out_floor)
        assert err < tol, f"output, chunk_size={chunk_size}: {err:.2e}"
        grads = torch.autograd.grad(out, inputs, grad_out)
        for name, expected, got in zip(names, reference_grads, grads, strict=True):
            err = _relative_error(expected, got, floor)
            assert err < tol, f"d{name}, chunk_size={chunk_size}: {err:.2e}"


def test_default_alpha_is_one():
    q, k, v, w, beta, _ = _make_inputs(1, 20, 2, 4, torch.float64, "softmax")
    ones = torch.ones_like(beta)
    default = deltaformer_chunk(q, k, v, w, beta, chunk_size=8)
    explicit = deltaformer_chunk(q, k, v, w, beta, alpha=ones, chunk_size=8)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    torch.testing.assert_close(deltaformer_naive(q, k, v, w, beta), default, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kappa1", KAPPA1_KINDS)
def test_beta_zero_is_causal_softmax_attention(kappa1):
    q, k, v, w, beta, _ = _make_inputs(2, 45, 3, 8, torch.float64, kappa1)
    zero_beta = torch.zeros_like(beta)
    out = deltaformer_chunk(q, k, v, w, zero_beta, kappa1=kappa1, chunk_size=16)
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def _deltanet_recurrence(q, k, v, beta):
    """DeltaNet (Yang et al. 2024) written from its state update, independent of the package:
    S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T, o_t = S_t q_t. Returns the per-step
    written vectors beta_t (v_t - S_{t-1} k_t) and the outputs."""
    batch, seq_len, heads, dim = q.shape
    state = torch.zeros(batch, heads, v.shape[-1], dim, dtype=q.dtype)
    writes, outputs = [], []
    for t in range(seq_len):
        k_t, v_t, b_t = k[:, t], v[:, t], beta[:, t, :, None]
        write = b_t * (v_t - torch.einsum("bhvd,bhd->bhv", state, k_t))
        state = state + torch.einsum("bhv,bhd->bhvd", write, k_t)
        writes.append(write)
        outputs.append(torch.einsum("bhvd,bhd->bhv", state, q[:, t]))
    return torch.stack(writes, 1), torch.stack(outputs, 1)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_linear_kernel_with_w_equal_k_is_deltanet(chunk_size):
    # Design note Sec. 2.1: with S_t = sum_i beta_i u_i k_i^T, the DeltaNet write beta_t u_t
    # satisfies u'_t = beta_t v_t - beta_t sum_{i<t} (k_t . k_i) u'_i, i.e. DeltaFormer with
    # linear kappa1, w = k and alpha = beta. The read o_t = S_t q_t is then a *linear* kappa2:
    # o_t = sum_{i<=t} (q_t . k_i) u'_i, which we apply to the package's U here.
    q, k, v, _, beta, _ = _make_inputs(2, 40, 3, 6, torch.float64, "linear")
    k = F.normalize(k, dim=-1)
    writes, outputs = _deltanet_recurrence(q, k, v, beta)
    _, u = deltaformer_chunk(
        q, k, v, k, beta, kappa1="linear", alpha=beta, chunk_size=chunk_size, return_u=True
    )
    torch.testing.assert_close(u, writes, rtol=1e-12, atol=1e-12)
    seq_len = q.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    linear_read = torch.einsum("bthd,bihd->bhti", q, k).masked_fill(~causal, 0.0)
    torch.testing.assert_close(
        torch.einsum("bhti,bihv->bthv", linear_read, u), outputs, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(("seq_len", "chunk_size"), [(1, 16), (7, 1), (130, 16), (130, 32),
                                                   (130, 130)])
def test_chunked_deltanet_equals_its_token_loop(seq_len, chunk_size):
    """The DeltaNet baseline mixer's fast path against the state-update loop: output and the
    gradients of q, k, v, beta in float64 to 1e-12."""
    q, k, v, _, beta, _ = _make_inputs(2, seq_len, 3, 8, torch.float64, "linear")
    grad = torch.randn(2, seq_len, 3, 8, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(5))
    outs, grads = [], []
    for fn in (deltanet_naive, lambda *a: deltanet_chunk(*a, chunk_size=chunk_size)):
        out = fn(q, k, v, beta)
        grads.append(torch.autograd.grad(out, (q, k, v, beta), grad))
        outs.append(out.detach())
    # float64, the same sums in another order (chunk solve vs state updates): see TOLERANCE
    assert _relative_error(outs[0], outs[1], _output_floor(v)) < 1e-12
    floor = _gradient_floor(outs[0], grad)
    for name, ref, got in zip("q k v beta".split(), grads[0], grads[1], strict=True):
        assert _relative_error(ref, got, floor) < 1e-12, name


@pytest.mark.parametrize("kappa1", ["softmax", "linear", "relu"])
def test_gradcheck(kappa1):
    inputs = _make_inputs(1, 5, 2, 3, torch.float64, kappa1, seed=3)

    def fn(q, k, v, w, beta, alpha):
        return deltaformer_chunk(q, k, v, w, beta, kappa1=kappa1, alpha=alpha, chunk_size=2)

    assert torch.autograd.gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-8)


def test_naive_return_u_matches_chunk():
    q, k, v, w, beta, alpha = _make_inputs(1, 19, 2, 4, torch.float64, "softmax")
    o_ref, u_ref = deltaformer_naive(q, k, v, w, beta, alpha=alpha, return_u=True)
    o, u = deltaformer_chunk(q, k, v, w, beta, alpha=alpha, chunk_size=7, return_u=True)
    torch.testing.assert_close(u, u_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    # Row 0 has no strict prefix, so u_0 = alpha_0 v_0 exactly.
    torch.testing.assert_close(u[:, 0], alpha[:, 0, :, None] * v[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("fn", [deltaformer_chunk, deltaformer_naive], ids=["chunk", "naive"])
def test_bad_inputs_raise(fn):
    q, k, v, w, beta, alpha = (x.detach() for x in _make_inputs(1, 6, 2, 4, torch.float64, "relu"))
    cases = [
        dict(q=q[0]),
        dict(k=k[:, :5]),
        dict(w=w[..., :3]),
        dict(v=v[:, :, :1]),
        dict(beta=beta[..., None]),
        dict(alpha=alpha[:, :4]),
        dict(v=v.float()),
        dict(beta=beta.to(torch.int64)),
    ]
    base = dict(q=q, k=k, v=v, w=w, beta=beta, alpha=alpha)
    for overrides in cases:
        args = {**base, **overrides}
        alpha_arg = args.pop("alpha")
        with pytest.raises(ValueError):
            fn(**args, alpha=alpha_arg)
    with pytest.raises(ValueError):
        fn(q, k, v, w, beta, kappa1="exp")
    if fn is deltaformer_chunk:
        for bad in (0, -1, 2.0):
            with pytest.raises(ValueError):
                fn(q, k, v, w, beta, chunk_size=bad)


def test_value_dim_may_differ():
    q, k, _, w, beta, alpha = _make_inputs(1, 11, 2, 4, torch.float64, "softmax")
    v = torch.randn(1, 11, 2, 6, dtype=torch.float64)
    torch.testing.assert_close(
        deltaformer_chunk(q, k, v, w, beta, alpha=alpha, chunk_size=4),
        deltaformer_naive(q, k, v, w, beta, alpha=alpha),
        rtol=1e-12,
        atol=1e-12,
    )
