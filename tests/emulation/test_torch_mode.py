"""Tests of `furnace.emulation.torch_mode`: PyTorch models with emulated GEMMs.

PyTorch-level integration of Ape-style emulated types (Ma et al., ICS '22) is ours; design
note `emulated_types.md` section 6.6, MLP row. Two stand-in GEMMs: an exact one (float64
product rounded once to float32) must reproduce the plain float32 run, and a bf16 one on a
`DSA` must differ by about bf16's unit roundoff while still training.
"""

from __future__ import annotations

import sys
import types as pytypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from furnace.emulation.dsa import DSA
from furnace.emulation.formats import round_to
from furnace.emulation.torch_mode import (
    EmulatedGemmError,
    EmulatedMatmulMode,
    emulated_matmul,
)
from furnace.runtime.testing import relative_error


def exact_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def make_bf16_gemm(dsa: DSA):
    def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return dsa.mm(round_to(a, "bf16"), round_to(b, "bf16"), "bf16")

    return gemm


def make_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def data(seed: int = 1, n: int = 64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = torch.randn(n, 4, generator=g)
    return x, y


def forward_and_grads(model, x, y, mode=None):
    model.zero_grad()
    if mode is None:
        out = model(x)
        loss = F.mse_loss(out, y)
    else:
        with mode:
            out = model(x)
            loss = F.mse_loss(out, y)
    loss.backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Normwise relative error of a against b, with a floor tied to the inputs: data and
    weights here are O(1), so 1e-3 per entry is far below any tensor's typical entry."""
    return relative_error(b, a, scale=1e-3 * b.numel() ** 0.5)


def test_exact_gemm_reproduces_plain_forward_and_gradients():
    model = make_mlp()
    x, y = data()
    ref_out, ref_grads = forward_and_grads(model, x, y)
    mode = emulated_matmul(exact_gemm)
    out, grads = forward_and_grads(model, x, y, mode)
    assert rel(out, ref_out) < 1e-6
    for g, r in zip(grads, ref_grads, strict=True):
        assert rel(g, r) < 1e-6
    assert mode.calls["linear"] == 2
    # two forward products, and in backward dW for both layers plus dX for the second only
    # (the input x needs no gradient)
    assert mode.gemm_calls == 5
    assert mode.backward_gemm_calls == 3


def test_bf16_gemm_differs_by_about_bf16_roundoff():
    model = make_mlp()
    x, y = data()
    ref_out, ref_grads = forward_and_grads(model, x, y)
    dsa = DSA("toy")
    out, grads = forward_and_grads(model, x, y, emulated_matmul(make_bf16_gemm(dsa)))
    assert 1e-4 < rel(out, ref_out) < 2e-2
    for g, r in zip(grads, ref_grads, strict=True):
        assert 1e-4 < rel(g, r) < 5e-2
    # every product went to the bf16 matrix unit: 2 forward, 3 backward
    assert dsa.counters.ops["mm_bf16"].calls == 5


def test_linear_with_bias_on_3d_input_is_routed():
    torch.manual_seed(2)
    layer = nn.Linear(8, 5)
    x = torch.randn(3, 7, 8)
    with emulated_matmul(exact_gemm) as mode:
        out = layer(x)
    assert mode.calls["linear"] == 1
    assert mode.gemm_calls == 1  # leading dimensions folded into rows, one GEMM
    torch.testing.assert_close(out, layer(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((4, 5, 6), (6, 3)),
        ((4, 5, 6), (4, 6, 3)),
        ((2, 1, 5, 6), (3, 6, 3)),
        ((6,), (4, 6, 3)),
        ((4, 5, 6), (6,)),
        ((6,), (6,)),
        ((5, 6), (6,)),
    ],
)
def test_matmul_shapes_and_gradients_follow_torch(a_shape, b_shape):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(a_shape, generator=g, requires_grad=True)
    b = torch.randn(b_shape, generator=g, requires_grad=True)
    with emulated_matmul(exact_gemm) as mode:
        out = a @ b
    assert mode.calls["matmul"] == 1
    ref = torch.matmul(a, b)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    weights = torch.randn(ref.shape, generator=g)
    ga, gb = torch.autograd.grad((out * weights).sum(), (a, b))
    ra, rb = torch.autograd.grad((ref * weights).sum(), (a, b))
    torch.testing.assert_close(ga, ra, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb, rb, rtol=1e-5, atol=1e-5)


def test_mm_bmm_addmm_baddbmm_mv_dot_are_routed():
    g = torch.Generator().manual_seed(4)
    m, k, n = (
        torch.randn(4, 5, generator=g),
        torch.randn(5, 3, generator=g),
        torch.randn(4, 3, generator=g),
    )
    b1, b2, b0 = (
        torch.randn(2, 4, 5, generator=g),
        torch.randn(2, 5, 3, generator=g),
        torch.randn(2, 4, 3, generator=g),
    )
    v = torch.randn(5, generator=g)
    with emulated_matmul(exact_gemm) as mode:
        results = [
            torch.mm(m, k),
            m.mm(k),
            torch.bmm(b1, b2),
            torch.addmm(n, m, k, beta=0.5, alpha=2.0),
            torch.baddbmm(b0, b1, b2),
            torch.mv(m, v),
            torch.dot(v, v),
        ]
    expected = [
        m @ k,
        m @ k,
        b1 @ b2,
        0.5 * n + 2.0 * (m @ k),
        b0 + b1 @ b2,
        m @ v,
        v @ v,
    ]
    for r, e in zip(results, expected, strict=True):
        torch.testing.assert_close(r, e, rtol=1e-5, atol=1e-5)
    assert mode.calls == {"mm": 2, "bmm": 1, "addmm": 1, "baddbmm": 1, "mv": 1, "dot": 1}


def attention_inputs(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    shape = (2, 3, 6, 8)  # batch, heads, length, head dim
    return [torch.randn(shape, generator=g, requires_grad=True) for _ in range(3)]


def test_explicit_attention_block_is_routed():
    q, k, v = attention_inputs()

    def attend(q, k, v):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(scores, dim=-1) @ v

    with emulated_matmul(exact_gemm) as mode:
        out = attend(q, k, v)
    assert mode.calls["matmul"] == 2
    torch.testing.assert_close(out, attend(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_is_rewritten_with_emulated_matmuls(is_causal):
    q, k, v = attention_inputs()
    with emulated_matmul(exact_gemm) as mode:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert mode.calls["scaled_dot_product_attention"] == 1
    assert mode.gemm_calls == 2 * 2 * 3  # two products per (batch, head)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for gr, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(gr, r, rtol=1e-4, atol=1e-5)


def test_sdpa_bool_mask_is_applied():
    q, k, v = attention_inputs()
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(6)) > 0.3
    mask[:, 0] = True  # no fully masked row (that would be NaN both ways)
    with emulated_matmul(exact_gemm) as mode:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert mode.calls["scaled_dot_product_attention"] == 1
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class SelfAttention(nn.Module):
    """Attention as modern models write it: Linear projections and SDPA."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, dim))


def test_attention_module_is_routed():
    torch.manual_seed(7)
    block = SelfAttention()
    x = torch.randn(2, 5, 16)
    with emulated_matmul(exact_gemm) as mode:
        out = block(x)
    assert mode.calls == {"linear": 2, "scaled_dot_product_attention": 1}
    assert mode.gemm_calls == 2 + 2 * 2 * 2
    torch.testing.assert_close(out, block(x), rtol=1e-5, atol=1e-5)


def test_multihead_attention_module_is_reported_as_bypassed():
    # nn.MultiheadAttention's functional hands itself to the mode and then runs with the
    # mode off (see the module docstring): it must at least not pass silently
    torch.manual_seed(7)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    with emulated_matmul(exact_gemm) as mode:
        mha(x, x, x, need_weights=False)
    assert mode.bypassed["multi_head_attention_forward"] == 1
    with pytest.raises(NotImplementedError, match="multi_head_attention_forward"):
        with emulated_matmul(exact_gemm, strict=True):
            mha(x, x, x, need_weights=False)


def test_bf16_training_decreases_loss_and_stays_finite():
    x, y_true = data(seed=8, n=128)
    # a learnable target: the float32 and bf16 runs should both fit it
    torch.manual_seed(9)
    y = torch.tanh(x @ torch.randn(16, 4)) * 0.5 + y_true * 0.01

    def train(mode_factory) -> list[float]:
        model = make_mlp(seed=10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(30):
            opt.zero_grad()
            mode = mode_factory()
            if mode is None:
                loss = F.mse_loss(model(x), y)
            else:
                with mode:
                    loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    dsa = DSA("toy")
    gemm = make_bf16_gemm(dsa)
    plain = train(lambda: None)
    emulated = train(lambda: emulated_matmul(gemm))
    assert all(np.isfinite(emulated))
    assert emulated[-1] < 0.8 * emulated[0]
    assert abs(emulated[-1] - plain[-1]) / plain[-1] < 0.05
    assert dsa.counters.ops["mm_bf16"].calls == 30 * 5


def test_leaving_the_context_restores_native_matmul():
    calls = []

    def spy(a, b):
        calls.append(a.shape)
        return exact_gemm(a, b)

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with emulated_matmul(spy) as mode:
        a @ b
    assert len(calls) == 1
    a @ b
    torch.mm(a, b)
    F.linear(a, b.t())
    assert len(calls) == 1
    assert mode.calls["matmul"] == 1


def test_non_float32_passes_through_untouched():
    calls = []

    def spy(a, b):
        calls.append(a.shape)
        return exact_gemm(a, b)

    a64, b64 = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    ai, bi = torch.ones(3, 4, dtype=torch.int64), torch.ones(4, 2, dtype=torch.int64)
    with emulated_matmul(spy) as mode:
        out64 = a64 @ b64
        outi = ai @ bi
    assert out64.dtype == torch.float64 and outi.dtype == torch.int64
    assert calls == [] and not mode.calls
    torch.testing.assert_close(out64, a64 @ b64)


def test_unrouted_gemm_like_ops_are_tallied_or_refused():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with emulated_matmul(exact_gemm) as mode:
        torch.einsum("ij,jk->ik", a, b)
    assert mode.bypassed["einsum"] == 1
    with pytest.raises(NotImplementedError, match="einsum"):
        with emulated_matmul(exact_gemm, strict=True):
            torch.einsum("ij,jk->ik", a, b)


def test_bad_gemm_output_is_a_clear_error():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with pytest.raises(EmulatedGemmError, match="float32"):
        with emulated_matmul(lambda x, y: x.astype(np.float64) @ y.astype(np.float64)):
            a @ b
    with pytest.raises(EmulatedGemmError, match="shape"):
        with emulated_matmul(lambda x, y: np.zeros((1, 1), np.float32)):
            a @ b
    with pytest.raises(TypeError, match="callable"):
        EmulatedMatmulMode(42)


def test_object_with_gemm_method_is_accepted():
    class Exact:
        def gemm(self, a, b, dsa):
            return dsa.mm(round_to(a, "bf16"), round_to(b, "bf16"), "bf16")

    dsa = DSA("toy")
    with emulated_matmul(Exact(), dsa) as mode:
        torch.randn(3, 4) @ torch.randn(4, 2)
    assert mode.dsa is dsa
    assert dsa.counters.ops["mm_bf16"].calls == 1


def test_backward_inside_the_context_counts_each_product_once():
    model = make_mlp()
    x, y = data()
    ref_out, ref_grads = forward_and_grads(model, x, y)
    model.zero_grad()
    with emulated_matmul(exact_gemm) as mode:
        F.mse_loss(model(x), y).backward()
    assert mode.gemm_calls == 5 and mode.backward_gemm_calls == 3
    for p, r in zip(model.parameters(), ref_grads, strict=True):
        assert rel(p.grad, r) < 1e-6


def test_type_name_builds_the_gemm_from_the_catalogue():
    pytest.importorskip("furnace.emulation.types")
    dsa = DSA("toy")
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with emulated_matmul("BF16", dsa) as mode:
        out = a @ b
    assert mode.dsa is dsa and mode.gemm_calls == 1
    assert dsa.counters.calls > 0
    assert rel(out, a @ b) < 2e-2


def test_type_name_path_with_a_stand_in_catalogue(monkeypatch):
    # the glue to types.get_type, checked without depending on the real catalogue
    class StandIn:
        def gemm(self, a, b, dsa):
            return dsa.mm(round_to(a, "bf16"), round_to(b, "bf16"), "bf16")

    names = []

    def get_type(name):
        names.append(name)
        return StandIn()

    fake = pytypes.ModuleType("furnace.emulation.types")
    fake.get_type = get_type
    monkeypatch.setitem(sys.modules, "furnace.emulation.types", fake)
    with emulated_matmul("BF16") as mode:
        torch.randn(3, 4) @ torch.randn(4, 2)
    assert names == ["BF16"]
    assert mode.dsa.counters.ops["mm_bf16"].calls == 1


@pytest.mark.parametrize("type_name", ["FP32-F", "FP32-B", "BF16", "OZ2-N12", "DF32"])
def test_nan_and_inf_propagate_through_every_routed_op_as_in_torch(type_name):
    torch.manual_seed(0)
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    a[1, 2], a[3, 0], a[4, 1], a[4, 3] = float("nan"), float("inf"), float("inf"), -float("inf")
    b[0, 5] = 0.0  # inf * 0 in row 3: NaN
    w = torch.randn(7, 5)
    batch_a, batch_b = torch.stack([a, a.flip(0)]), torch.stack([b, b])
    native = {"matmul": a @ b, "linear": F.linear(a, w), "bmm": torch.bmm(batch_a, batch_b),
              "mv": torch.mv(a, b[:, 5])}
    with emulated_matmul(type_name, DSA("a100")) as mode:
        got = {"matmul": a @ b, "linear": F.linear(a, w), "bmm": torch.bmm(batch_a, batch_b),
               "mv": torch.mv(a, b[:, 5])}
    assert mode.gemm_calls == 5
    tol = 1e-2 if type_name == "BF16" else 1e-6
    for name, ref in native.items():
        out = got[name]
        assert torch.equal(out.isnan(), ref.isnan()), name
        assert torch.equal(out[ref.isinf()], ref[ref.isinf()]), name
        finite = ref.isfinite()
        assert relative_error(ref[finite], out[finite],
                              scale=1e-3 * float(finite.sum()) ** 0.5) < tol, name


def test_nan_in_a_gradient_flows_back_as_in_torch():
    torch.manual_seed(1)
    x = torch.randn(4, 3)
    x[2, 1] = float("nan")
    layer = nn.Linear(3, 2)
    layer(x).sum().backward()
    native = layer.weight.grad.clone()
    layer.zero_grad()
    with emulated_matmul("FP32-F", DSA("a100")):
        layer(x).sum().backward()
    assert torch.equal(layer.weight.grad.isnan(), native.isnan())
    assert native.isnan().any()


def test_fp64_types_round_once_to_float32_and_int16_is_refused():
    torch.manual_seed(2)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with emulated_matmul("OZ2-N16", DSA("a100")):
        out = a @ b
    exact = (a.double() @ b.double()).float()
    assert out.dtype == torch.float32 and torch.equal(out, exact)
    with pytest.raises(ValueError, match="integers"):
        emulated_matmul("INT16")
