"""FastMoE code on `furnace.moe.compat` with only its import line changed.

Checked against FastMoE v1.1's own definitions (laekov/fastmoe ``fmoe/*.py``): the
constructors' signatures, the gates' ``(idx, score)`` outputs and routing rules on
hand-built cases, the checkpoint keys and shapes, and FastMoE's documented usage
(`FMoETransformerMLP` in a Transformer block, the Transformer-XL activation, a custom
expert, custom gate subclasses, ``self.experts = _Expert(...)``,
`DistributedGroupedDataParallel`, loading a FastMoE checkpoint) on 1 and 2 gloo ranks.

References: furnace's native layer with the same weights (forward and every gradient);
a per-token brute force written here from FastMoE's definition
(``y_t = sum_k score_tk * expert_{idx_tk}(x_t)``, its ``BruteForceMoE``); and a single
process holding every expert for the multi-rank runs. Float64 with relative tolerance
1e-12 (the paths only reorder sums); each relative error has a floor tied to the inputs
(||x|| for outputs, ||w|| for input gradients, ||x|| * ||w|| for parameter gradients),
since a gradient a path never reads (an idle expert's) is exactly zero.
"""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

import furnace.moe.compat as fmoe
from furnace.moe import (
    ExpertParallelConfig,
    GateContext,
    MoETransformerMLP,
    gates,
)
from furnace.moe.compat import FMoE, FMoETransformerMLP
from furnace.moe.compat.distributed import DistributedGroupedDataParallel
from furnace.moe.compat.transformer import _Expert
from furnace.runtime import Communicator, run_distributed
from furnace.runtime.testing import assert_close, relative_error

TOL = 1e-12
D, F_HID = 8, 12


def floors(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float, float]:
    nx, nw = float(x.detach().norm()), float(w.norm())
    return nx, nw, nx * nw


def brute_force(x_TD: torch.Tensor, idx: torch.Tensor, score: torch.Tensor, top_k: int,
                expert) -> torch.Tensor:
    """FastMoE's definition, one token and one choice at a time."""
    idx_TK = idx.reshape(-1, top_k)
    score_TK = score.reshape(-1, top_k)
    rows = []
    for t in range(x_TD.shape[0]):
        acc = x_TD.new_zeros(x_TD.shape[1])
        for k in range(top_k):
            e = int(idx_TK[t, k])
            if e >= 0:
                acc = acc + score_TK[t, k] * expert(e, x_TD[t:t + 1])[0]
        rows.append(acc)
    return torch.stack(rows) if rows else x_TD.new_zeros(x_TD.shape)


def fused_expert(params: dict[str, torch.Tensor], activation, prefix: str = "experts."):
    """Expert e of a FastMoE fused bank, from its (v1.0 layout) tensors."""
    def run(e, x):
        h = x @ params[prefix + "htoh4.weight"][e].T + params[prefix + "htoh4.bias"][e]
        w2, b2 = params[prefix + "h4toh.weight"][e], params[prefix + "h4toh.bias"][e]
        return activation(h) @ w2.T + b2
    return run


# --- signatures: FastMoE v1.1's, parameter by parameter ------------------------------------

_GELU = object()  # FastMoE's default activation, torch.nn.GELU()
FASTMOE_SIGNATURES = {
    "FMoE": (FMoE, [("num_expert", 32), ("d_model", 1024), ("world_size", 1),
                    ("mp_group", None), ("slice_group", None), ("moe_group", None),
                    ("top_k", 2), ("gate", fmoe.gates.NaiveGate), ("expert", None),
                    ("gate_hook", None), ("mask", None), ("mask_dict", None),
                    ("gate_bias", True)]),
    "FMoETransformerMLP": (FMoETransformerMLP, [
        ("num_expert", 32), ("d_model", 1024), ("d_hidden", 4096), ("activation", _GELU),
        ("expert_dp_comm", "none"), ("expert_rank", 0)]),
    "FMoELinear": (fmoe.FMoELinear, [("num_expert", None), ("in_feat", None),
                                     ("out_feat", None), ("bias", True), ("rank", 0)]),
    "_Expert": (_Expert, [("num_expert", None), ("d_model", None), ("d_hidden", None),
                          ("activation", None), ("rank", 0)]),
    "BaseGate": (fmoe.gates.BaseGate, [("num_expert", None), ("world_size", None)]),
    "NaiveGate": (fmoe.gates.NaiveGate, [("d_model", None), ("num_expert", None),
                                         ("world_size", None), ("top_k", 2),
                                         ("gate_bias", True)]),
    "NoisyGate": (fmoe.gates.NoisyGate, [("d_model", None), ("num_expert", None),
                                         ("world_size", None), ("top_k", 2)]),
    "GShardGate": (fmoe.gates.GShardGate, [("d_model", None), ("num_expert", None),
                                           ("world_size", None), ("topk", 2),
                                           ("capacity", (1.2, 2.4)),
                                           ("random_routing", True), ("gate_bias", True)]),
    "DCGate": (fmoe.gates.DCGate, [("d_model", None), ("num_expert", None),
                                   ("world_size", None), ("topk", 2), ("capacity", (1.2, 2.4)),
                                   ("random_routing", True), ("gate_bias", True)]),
    "SwitchGate": (fmoe.gates.SwitchGate, [("d_model", None), ("num_expert", None),
                                           ("world_size", None), ("topk", 1),
                                           ("switch_eps", .1), ("capacity", (1.2, 2.4)),
                                           ("gate_bias", True)]),
    "SwipeGate": (fmoe.gates.SwipeGate, [("d_model", None), ("num_expert", None),
                                         ("world_size", None), ("top_k", 2),
                                         ("gate_bias", True)]),
    "FasterGate": (fmoe.gates.FasterGate, [("d_model", None), ("n_expert", None),
                                           ("world_size", None), ("node_rank", None),
                                           ("gate_bias", True)]),
    "ZeroGate": (fmoe.gates.ZeroGate, [("_1", None), ("num_expert", None),
                                       ("world_size", None), ("top_k", 2)]),
    "gen_faster_gate": (fmoe.gen_faster_gate, [("rank", None)]),
    "DistributedGroupedDataParallel": (DistributedGroupedDataParallel, [
        ("module", None), ("auto_allreduce", False), ("need_sync", True)]),
    "NaiveGate.forward": (fmoe.gates.NaiveGate.forward, [("self", None), ("inp", None),
                                                         ("return_all_scores", False)]),
    "allreduce_gradients": (DistributedGroupedDataParallel.allreduce_gradients, [
        ("self", None), ("no_scale", False), ("reduce_after", False),
        ("fp32_allreduce", False)]),
}


@pytest.mark.parametrize("name", sorted(FASTMOE_SIGNATURES))
def test_signatures_are_fastmoes(name):
    obj, expected = FASTMOE_SIGNATURES[name]
    params = [p for p in inspect.signature(obj).parameters.values()
              if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in params] == [n for n, _ in expected]
    for p, (pname, default) in zip(params, expected):
        if default is None and p.default is inspect.Parameter.empty:
            continue
        if default is _GELU:
            assert isinstance(p.default, nn.GELU) and p.default.approximate == "none"
        else:
            assert p.default == default, f"{name}.{pname}: default {p.default!r}"


def test_names_and_namespaces():
    for name in ["FMoE", "FMoELinear", "FMoETransformerMLP", "DistributedGroupedDataParallel"]:
        assert hasattr(fmoe, name)
    for name in ["BaseGate", "NaiveGate", "NoisyGate", "GShardGate", "SwitchGate", "DCGate",
                 "SwipeGate", "FasterGate", "ZeroGate", "gen_faster_gate"]:
        assert getattr(fmoe.gates, name) is getattr(fmoe, name)
    assert fmoe.layers.FMoE is FMoE and fmoe.transformer.FMoETransformerMLP is FMoETransformerMLP
    assert fmoe.mark_parallel_comm is FMoE.mark_parallel_comm
    layer = FMoETransformerMLP(num_expert=2, d_model=4, d_hidden=6)
    assert isinstance(layer, MoETransformerMLP) and isinstance(layer, FMoE)
    fmoe.mark_module_parallel_comm(layer.gate, "world")
    assert all(p.dp_comm == "world" for p in layer.gate.parameters())
    layer.mark_parallel_comm("dp")
    assert all(p.dp_comm == "dp" for p in layer.experts.parameters())
    assert all(p.dp_comm == "gate" for p in layer.gate.parameters())


# --- the layer against furnace's native layer and the brute force ---------------------------

@pytest.mark.parametrize(("activation", "name"), [(nn.GELU(), "gelu"), (F.relu, "relu"),
                                                  ("silu", "silu")])
def test_transformer_mlp_equals_native_layer(activation, name):
    torch.manual_seed(0)
    layer = FMoETransformerMLP(num_expert=4, d_model=D, d_hidden=F_HID,
                               activation=activation).double()
    assert layer.num_experts == 4 and layer.top_k == 2 and layer.parallel is None
    native = MoETransformerMLP(d_model=D, d_hidden=F_HID, num_experts=4, top_k=2,
                               activation=name).double()
    with torch.no_grad():
        native.gate.scorer.weight.copy_(layer.gate.gate.weight)
        native.gate.scorer.bias.copy_(layer.gate.gate.bias)
        native.experts.w1_EDF.copy_(layer.experts.htoh4.weight.transpose(1, 2))
        native.experts.b1_EF.copy_(layer.experts.htoh4.bias)
        native.experts.w2_EFD.copy_(layer.experts.h4toh.weight.transpose(1, 2))
        native.experts.b2_ED.copy_(layer.experts.h4toh.bias)
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    x_native = x.detach().clone().requires_grad_()
    w = torch.randn(2, 5, D, dtype=torch.float64)
    y, y_native = layer(x), native(x_native)
    (y * w).sum().backward()
    (y_native * w).sum().backward()
    s_out, s_x, s_p = floors(x, w)
    assert_close("out", y_native, y, TOL, scale=s_out)
    assert_close("grad_x", x_native.grad, x.grad, TOL, scale=s_x)
    pairs = [(layer.gate.gate.weight.grad, native.gate.scorer.weight.grad),
             (layer.gate.gate.bias.grad, native.gate.scorer.bias.grad),
             (layer.experts.htoh4.weight.grad.transpose(1, 2), native.experts.w1_EDF.grad),
             (layer.experts.htoh4.bias.grad, native.experts.b1_EF.grad),
             (layer.experts.h4toh.weight.grad.transpose(1, 2), native.experts.w2_EFD.grad),
             (layer.experts.h4toh.bias.grad, native.experts.b2_ED.grad)]
    for i, (ours, theirs) in enumerate(pairs):
        assert_close(f"param {i}", theirs, ours, TOL, scale=s_p)


class CustomizedMoEPositionwiseFF(FMoETransformerMLP):
    """FastMoE's Transformer-XL example block (examples/transformer-xl/mem_transformer.py)."""

    def __init__(self, d_model, d_inner, dropout, pre_lnorm=False, moe_num_expert=64,
                 moe_top_k=2):
        activation = nn.Sequential(nn.ReLU(), nn.Dropout(dropout))
        super().__init__(num_expert=moe_num_expert, d_model=d_model, d_hidden=d_inner,
                         top_k=moe_top_k, activation=activation)
        self.pre_lnorm = pre_lnorm
        self.layer_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, inp):
        if self.pre_lnorm:
            return self.dropout(super().forward(self.layer_norm(inp))) + inp
        return self.layer_norm(inp + self.dropout(super().forward(inp)))


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_transformer_xl_block(pre_lnorm):
    torch.manual_seed(1)
    block = CustomizedMoEPositionwiseFF(D, F_HID, 0.25, pre_lnorm=pre_lnorm, moe_num_expert=4,
                                        moe_top_k=2).double()
    x = torch.randn(6, 3, D, dtype=torch.float64)  # [len, batch, d_model], as Transformer-XL
    # training: dropout inside the experts' activation is live
    block.train()
    y = block(x)
    y.square().sum().backward()
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert block.experts.htoh4.weight.grad.abs().sum() > 0
    # eval: the block equals its definition with FastMoE's experts written out
    block.eval()
    params = {k: v.detach() for k, v in block.state_dict().items()}
    inner = block.layer_norm(x) if pre_lnorm else x
    x_TD = inner.reshape(-1, D)
    idx, score = block.gate(x_TD)
    moe = brute_force(x_TD, idx, score, 2, fused_expert(params, F.relu)).reshape(x.shape)
    expected = moe + x if pre_lnorm else block.layer_norm(x + moe)
    assert_close("block", expected, block(x), TOL, scale=float(x.norm()))


class NaiveExpert(nn.Module):
    """FastMoE's test expert (tests/moe.py): called as expert(x, fec)."""

    def __init__(self, d_model):
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)
        self.calls = []

    def forward(self, x, fec=None):
        self.calls.append((x.shape[0], fec))
        return self.linear(x)


class LinearExpert(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(d_model, d_model * 2), nn.ReLU(),
                                   nn.Linear(d_model * 2, d_model))

    def forward(self, x, fec=None):
        return self.model(x)


def _module_reference(layer: FMoE, x: torch.Tensor, w: torch.Tensor):
    """Brute-force output and gradients of a module-expert layer, on copies of it."""
    ref = copy.deepcopy(layer)
    x_ref = x.detach().clone().requires_grad_()
    idx, score = ref.gate(x_ref)
    y_ref = brute_force(x_ref, idx, score, layer.top_k, lambda e, r: ref.experts[e](r))
    (y_ref * w).sum().backward()
    return y_ref, x_ref.grad, ref


@pytest.mark.parametrize("expert", [NaiveExpert, LinearExpert, [NaiveExpert, LinearExpert]],
                         ids=["naive", "linear", "list"])
def test_custom_expert_matches_brute_force(expert):
    torch.manual_seed(2)
    layer = FMoE(num_expert=3, d_model=D, expert=expert, top_k=2).double()
    E = 2 if isinstance(expert, list) else 3
    assert layer.num_expert == E and layer.num_experts == E and not layer.experts_fused
    assert all(isinstance(m, expert[i] if isinstance(expert, list) else expert)
               for i, m in enumerate(layer.experts))
    x = torch.randn(7, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, D, dtype=torch.float64)
    y_ref, gx_ref, ref = _module_reference(layer, x, w)
    y = layer(x)
    (y * w).sum().backward()
    s_out, s_x, s_p = floors(x, w)
    assert_close("out", y_ref, y, TOL, scale=s_out)
    assert_close("grad_x", gx_ref, x.grad, TOL, scale=s_x)
    for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
        assert_close(name, p_ref.grad, p.grad, TOL, scale=s_p)
    if expert is NaiveExpert:
        # FastMoE's call: expert(rows, tensor([rows]))
        calls = [c for m in layer.experts for c in m.calls]
        assert calls and all(isinstance(fec, torch.Tensor) and fec.tolist() == [n]
                             for n, fec in calls)


class MyMoE(FMoE):
    """FastMoE's tests/test_numerical.py pattern: assign fused experts after construction."""

    def __init__(self, num_expert, d_model, d_hidden, world_size, top_k, activation,
                 moe_group=None):
        super().__init__(num_expert=num_expert, d_model=d_model, gate=fmoe.gates.NaiveGate,
                         world_size=world_size, top_k=top_k, moe_group=moe_group)
        self.experts = _Expert(num_expert, d_model, d_hidden, activation)


def test_assigned_fused_experts():
    torch.manual_seed(3)
    layer = MyMoE(4, D, F_HID, 1, 2, F.gelu).double()
    assert isinstance(layer.experts, _Expert) and layer.experts_fused
    assert set(layer.state_dict()) == {"gate.gate.weight", "gate.gate.bias",
                                       "experts.htoh4.weight", "experts.htoh4.bias",
                                       "experts.h4toh.weight", "experts.h4toh.bias"}
    x = torch.randn(9, D, dtype=torch.float64)
    params = {k: v.detach() for k, v in layer.state_dict().items()}
    idx, score = layer.gate(x)
    expected = brute_force(x, idx, score, 2, fused_expert(params, F.gelu))
    assert_close("out", expected, layer(x), TOL, scale=float(x.norm()))
    # FastMoE's init: U(-b, b) with b = 1/sqrt(out * in), zero bias
    assert layer.experts.htoh4.weight.abs().max() <= 1 / math.sqrt(F_HID * D)
    assert torch.equal(layer.experts.htoh4.bias, torch.zeros(4, F_HID, dtype=torch.float64))

    class Fused(nn.Module):
        """A user's fused module (no ExpertBank): fine on one worker."""

        def __init__(self):
            super().__init__()
            self.inner = fmoe.FMoELinear(4, D, D)

        def forward(self, inp, fwd_expert_count):
            assert isinstance(fwd_expert_count, torch.Tensor)
            return self.inner(inp, fwd_expert_count)

    layer.experts = Fused().double()
    params = {"w": layer.experts.inner.weight.detach(), "b": layer.experts.inner.bias.detach()}
    expected = brute_force(x, idx, score, 2, lambda e, r: r @ params["w"][e].T + params["b"][e])
    assert_close("opaque", expected, layer(x), TOL, scale=float(x.norm()))
    with pytest.raises(ValueError, match="experts"):
        layer.experts = _Expert(3, D, F_HID, F.gelu)


class TemperatureGate(fmoe.gates.NaiveGate):
    """A FastMoE-style gate subclass: overrides forward, uses self.gate and set_loss."""

    def __init__(self, d_model, num_expert, world_size, top_k=2, gate_bias=True):
        super().__init__(d_model, num_expert, world_size, top_k, gate_bias)
        self.temperature = 2.0

    def forward(self, inp, return_all_scores=False):
        logits = self.gate(inp) / self.temperature
        val, idx = torch.topk(logits, k=self.top_k, dim=-1)
        self.set_loss(logits.square().mean())
        return idx, F.softmax(val, dim=-1)


class FirstExpertsGate(fmoe.gates.BaseGate):
    """A gate from FastMoE's BaseGate: fixed experts, learned scores."""

    def __init__(self, d_model, num_expert, world_size, top_k=2):
        super().__init__(num_expert, world_size)
        self.top_k = top_k
        self.proj = nn.Linear(d_model, top_k)

    def forward(self, inp):
        idx = (torch.arange(self.top_k) % self.tot_expert).expand(inp.shape[0], -1)
        return idx.reshape(-1), F.softmax(self.proj(inp), dim=-1).unsqueeze(1)


@pytest.mark.parametrize("gate", [TemperatureGate, FirstExpertsGate])
def test_custom_gate_subclass(gate):
    torch.manual_seed(4)
    hooked = []
    layer = FMoETransformerMLP(num_expert=3, d_model=D, d_hidden=F_HID, gate=gate,
                               gate_hook=lambda i, s, _: hooked.append(i.shape)).double()
    assert type(layer.gate) is gate
    x = torch.randn(5, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, D, dtype=torch.float64)
    ref = copy.deepcopy(layer)
    x_ref = x.detach().clone().requires_grad_()
    params = dict(ref.experts.named_parameters(prefix="experts"))
    idx, score = ref.gate(x_ref)
    y_ref = brute_force(x_ref, idx, score, 2, fused_expert(params, F.gelu))
    (y_ref * w).sum().backward()
    y = layer(x)
    (y * w).sum().backward()
    s_out, s_x, s_p = floors(x, w)
    assert_close("out", y_ref, y, TOL, scale=s_out)
    assert_close("grad_x", x_ref.grad, x.grad, TOL, scale=s_x)
    for (name, p), p_ref in zip(layer.gate.named_parameters(), ref.gate.parameters()):
        assert_close(name, p_ref.grad, p.grad, TOL, scale=s_p)
    assert len(hooked) == 1
    if gate is TemperatureGate:
        assert torch.equal(layer.balance_loss, layer.gate.get_loss())
        assert not layer.gate.has_loss


# --- gates: FastMoE's outputs and rules -------------------------------------------------------

def _identity(gate: nn.Module, n: int) -> None:
    """Make a NaiveGate-family scorer the identity (D = N, no bias): rows are logits."""
    with torch.no_grad():
        gate.gate.weight.copy_(torch.eye(n))


def test_naive_gate_matches_native_and_returns_fastmoe_tuples():
    torch.manual_seed(5)
    gate = fmoe.gates.NaiveGate(D, 3, 2, top_k=2)
    assert gate.tot_expert == 6 and gate.gate.weight.shape == (6, D)
    native = gates.NaiveGate(D, 6, 2)
    native.scorer.load_state_dict(gate.gate.state_dict())
    x = torch.randn(10, D)
    idx, score = gate(x)
    out = native(x)
    assert idx.shape == score.shape == (10, 2)
    assert torch.equal(idx, out.expert_ids_TK) and torch.equal(score, out.scores_TK)
    assert torch.equal(gate.get_loss(), torch.zeros(1))
    idx2, score2, logits = gate(x, return_all_scores=True)
    assert torch.equal(idx2, idx) and torch.equal(logits, gate.gate(x))
    assert fmoe.gates.NaiveGate(D, 3, 1, gate_bias=False).gate.bias is None


def test_noisy_gate():
    torch.manual_seed(6)
    gate = fmoe.gates.NoisyGate(4, 2, 2, 2)
    assert {n: tuple(p.shape) for n, p in gate.named_parameters()} == {
        "w_gate": (4, 4), "w_noise": (4, 4)}
    # FastMoE's init: kaiming_uniform(a=sqrt(5)); torch's fan-in of [4, 4] is 4
    assert gate.w_gate.abs().max() <= 0.5 and gate.w_gate.abs().min() > 0
    gate.eval()
    with torch.no_grad():
        gate.w_gate.copy_(torch.eye(4))
    x = torch.tensor([[4.0, 3.0, 0.0, 0.0], [0.0, 1.0, 5.0, 2.0], [9.0, 0.0, 0.0, 8.0]])
    idx, score = gate(x)
    assert idx.shape == (6,) and score.shape == (3, 1, 2)
    assert idx.reshape(3, 2).tolist() == [[0, 1], [2, 3], [0, 3]]
    # loss: cv^2(importance) + cv^2(load) with the unbiased variance
    gates_TN = torch.zeros(3, 4).scatter(1, idx.reshape(3, 2), score.reshape(3, 2))
    load = torch.tensor([2.0, 1.0, 1.0, 2.0])

    def cv2(v):
        return v.var() / (v.mean() ** 2 + 1e-10)

    torch.testing.assert_close(gate.get_loss(), cv2(gates_TN.sum(0)) + cv2(load))
    gate.train()
    idx, score = gate(torch.randn(16, 4))
    gate.get_loss().backward()
    assert gate.w_noise.grad is not None and gate.w_noise.grad.abs().sum() > 0


def test_gshard_gate_capacity_random_routing_and_loss():
    gate = fmoe.gates.GShardGate(4, 2, 2, random_routing=False)
    assert gate.capacity == (1.2, 2.4) and gate.top_k == 2
    _identity(gate, 4)
    with torch.no_grad():
        gate.gate.bias.zero_()
    # 5 tokens preferring (0, 1): capacity ceil(1.2 * 5) * 2 // 4 = 3 per expert in
    # training, taken in token-major order (t0c0, t0c1, t1c0, ...)
    x = torch.tensor([[3.0, 2.0, 0.0, 0.0]] * 5)
    gate.train()
    idx, score = gate(x)
    assert idx.tolist() == [[0, 1]] * 3 + [[-1, -1]] * 2
    p = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    torch.testing.assert_close(score, p.expand(5, 2))
    # eval: ceil(2.4 * 5) * 2 // 4 = 6, everything fits
    gate.eval()
    assert (gate(x)[0] >= 0).all()
    # loss: FastMoE's mean(c_e * m_e) * num_expert^2, num_expert per worker (= native / W^2)
    native = gates.GShardGate(4, 4, 2, random_routing=False, bias=False)
    native.scorer.weight.data.copy_(gate.gate.weight)
    torch.testing.assert_close(gate.get_loss(), native(x).balance_loss / 2**2)
    # random routing drops second choices only, in eval too (FastMoE applies it always)
    rr = fmoe.gates.GShardGate(4, 2, 2, capacity=(100.0, 100.0)).eval()
    torch.manual_seed(7)
    y = torch.randn(200, 4)
    idx, score = rr(y)
    assert (idx[:, 0] >= 0).all() and (idx[:, 1] == -1).any() and (idx[:, 1] >= 0).any()


def test_switch_gate_noise_capacity_and_loss():
    gate = fmoe.gates.SwitchGate(3, 3, 1)
    assert gate.capacity == (1.2, 2.4) and gate.switch_eps == 0.1 and gate.top_k == 1
    _identity(gate, 3)
    with torch.no_grad():
        gate.gate.bias.zero_()
    x = torch.tensor([[5.0, 0.0, 0.0]] * 4 + [[0.0, 5.0, 0.0]])
    # eval capacity ceil(2.4 * 5 / 3) = 4: all fit; training ceil(1.2 * 5 / 3) = 2
    gate.eval()
    idx, score = gate(x)
    assert idx.tolist() == [[0]] * 4 + [[1]]
    probs = torch.softmax(x, -1)
    torch.testing.assert_close(score[:, 0], probs.max(-1).values)
    fraction = torch.tensor([4.0, 1.0, 0.0]) / 5
    torch.testing.assert_close(gate.get_loss(), (fraction * probs.sum(0) / 5).sum() * 3)
    gate.train()
    torch.manual_seed(8)
    noise = torch.rand(5, 3) * 0.2 + 0.9
    torch.manual_seed(8)
    idx, score = gate(x)
    noisy = torch.softmax(x + noise, -1)
    assert idx.tolist() == [[0], [0], [-1], [-1], [1]]
    torch.testing.assert_close(score[:, 0], noisy.max(-1).values)
    kept = torch.tensor([2.0, 1.0, 0.0]) / 3
    torch.testing.assert_close(gate.get_loss(), (kept * noisy.sum(0) / 3).sum() * 3)
    with pytest.raises(ValueError, match="topk should be 1"):
        fmoe.gates.SwitchGate(3, 3, 1, 2)


def test_faster_gate_takes_node_rank_positionally():
    # 8 experts, 2 per worker, 2 workers per node: node 0 = experts 0-3, node 1 = 4-7
    gate = fmoe.gates.FasterGate(8, 2, 4, 1, gpus_per_node=2, outgoing_fraction=0.25)
    assert gate.node_rank == 1 and gate.top_k == 2
    assert gate.mask.tolist() == [True] * 4 + [False] * 4
    _identity(gate, 8)
    with torch.no_grad():
        gate.gate.bias.zero_()
    x = torch.zeros(8, 8)
    # every token's top-1 is remote (expert 0..3) with strength 9 - t; top-2 local 4 + t%4
    for t in range(8):
        x[t, t % 4] = 10.0 - t
        x[t, 4 + t % 4] = 1.0
        x[t, 4 + (t + 1) % 4] = 0.5
    idx, score = gate(x)
    # budget int(8 * 0.25) = 2: tokens 0 and 1 (strongest remote) keep it as choice 2
    assert idx[:, 0].tolist() == [4 + t % 4 for t in range(8)]
    assert idx[:, 1].tolist() == [0, 1] + [4 + (t + 1) % 4 for t in range(2, 8)]
    torch.testing.assert_close(score, torch.softmax(x.gather(1, idx), -1))
    # plain top-2 when few tokens have a remote top-1
    y = torch.zeros(8, 8)
    y[:, 4], y[:, 5] = 2.0, 1.0
    y[0, 0] = 5.0
    assert gate(y)[0].tolist() == [[0, 4]] + [[4, 5]] * 7
    made = fmoe.gen_faster_gate(3, gpus_per_node=2)(8, 2, 4)
    assert made.node_rank == 1 and made.ne_per_node == 4
    with pytest.raises(ValueError, match="2 local experts"):
        fmoe.gates.FasterGate(4, 1, 4, 0, gpus_per_node=1)


def test_zero_gate_ignores_its_first_argument():
    gate = fmoe.gates.ZeroGate("ignored", 3, 2, 2)
    assert list(gate.parameters()) == [] and gate.tot_expert == 6
    idx, score = gate(torch.randn(4, 5, dtype=torch.float64))
    assert idx.tolist() == [0] * 8 and score.shape == (4, 1, 2) and (score == 0.5).all()
    assert not gate.has_loss
    # in the layer: every token runs expert 0 once per choice with weight 1/2: expert 0(x)
    torch.manual_seed(9)
    layer = FMoETransformerMLP(num_expert=3, d_model=D, d_hidden=F_HID,
                               gate=fmoe.gates.ZeroGate).double()
    x = torch.randn(6, D, dtype=torch.float64)
    expert0 = layer.experts.run_local(0, x)
    assert_close("zero gate", expert0, layer(x), TOL, scale=float(x.norm()))


def test_swipe_gate_single_worker():
    torch.manual_seed(10)
    gate = fmoe.gates.SwipeGate(D, 4, 1, 2)
    x = torch.randn(12, D)
    gate.eval()
    idx, score = gate(x)
    top = torch.topk(gate.gate(x), 2)
    assert torch.equal(idx, top.indices) and not gate.has_loss
    # one worker takes all its tokens: SWIPE keeps every preference
    gate.train()
    assert torch.equal(gate(x)[0], top.indices)


# --- checkpoints -------------------------------------------------------------------------------

def test_fastmoe_checkpoints_load():
    torch.manual_seed(11)
    E = 3
    v10 = {"gate.gate.weight": torch.randn(E, D), "gate.gate.bias": torch.randn(E),
           "experts.htoh4.weight": torch.randn(E, F_HID, D),
           "experts.htoh4.bias": torch.randn(E, F_HID),
           "experts.h4toh.weight": torch.randn(E, D, F_HID),
           "experts.h4toh.bias": torch.randn(E, D)}
    layer = FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID)
    assert {k: v.shape for k, v in layer.state_dict().items()} == {k: v.shape
                                                                    for k, v in v10.items()}
    layer.load_state_dict(v10)
    for k, v in layer.state_dict().items():
        assert torch.equal(v, v10[k]), k
    x = torch.randn(7, D)
    idx, score = layer.gate(x)
    expected = brute_force(x, idx, score, 2, fused_expert(v10, F.gelu))
    assert_close("v1.0", expected, layer(x), 1e-6, scale=float(x.norm()))
    # FastMoE v1.1 keeps one _Expert(1, ...) per expert: experts.<i>.htoh4.weight [1, F, D]
    v11 = {k: v for k, v in v10.items() if k.startswith("gate.")}
    for i in range(E):
        for name in ("htoh4.weight", "htoh4.bias", "h4toh.weight", "h4toh.bias"):
            v11[f"experts.{i}.{name}"] = v10[f"experts.{name}"][i:i + 1]
    other = FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID)
    other.load_state_dict(v11)
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(),
                                                 layer.state_dict().values()))
    missing = {k: v for k, v in v11.items() if not k.startswith("experts.2.")}
    with pytest.raises(RuntimeError, match="experts"):
        FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID).load_state_dict(missing)
    # gates keep FastMoE's names: NoisyGate's w_gate / w_noise, ZeroGate none
    noisy = FMoETransformerMLP(num_expert=2, d_model=D, d_hidden=F_HID, gate=fmoe.NoisyGate)
    assert {"gate.w_gate", "gate.w_noise"} <= set(noisy.state_dict())
    zero = FMoETransformerMLP(num_expert=2, d_model=D, d_hidden=F_HID, gate=fmoe.ZeroGate)
    assert not [k for k in zero.state_dict() if k.startswith("gate.")]


# --- what is refused, by name ------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"mp_group": object()}, ValueError, "own tokens"),
    ({"slice_group": object()}, ValueError, "own tokens"),
    ({"mask": torch.zeros(3)}, ValueError, "kept"),
    ({"mask_dict": {}}, ValueError, "kept"),
    ({"expert": NaiveExpert}, TypeError, "expert"),
    ({"activation": 3}, ValueError, "callable"),
    ({"activation": "swish"}, ValueError, "activation"),
    ({"gate": gates.NaiveGate}, ValueError, "furnace gate class"),
    ({"gate": 3}, ValueError, "gate"),
    ({"gate": lambda *a: 1.0}, ValueError, "nn.Module"),
    ({"gate": fmoe.ZeroGate, "gate_bias": False}, ValueError, "gate_bias"),
    ({"gate": fmoe.SwitchGate}, ValueError, "topk should be 1"),
    ({"world_size": 2}, ValueError, "initialized default process group"),
    ({"moe_group": "world", "world_size": 2}, ValueError, "moe_group"),
    ({"parallel_config": ExpertParallelConfig()}, ValueError, "parallel_config"),
    ({"world_size": 0}, ValueError, "world_size"),
    ({"top_k": 5}, ValueError, "top_k"),
])
def test_unsupported_arguments_raise(kwargs, error, message):
    assert not dist.is_initialized()
    with pytest.raises(error, match=message):
        FMoETransformerMLP(num_expert=2, d_model=4, d_hidden=8, **kwargs)


def test_furnace_gate_names_still_work():
    # a furnace extension: FMoE takes a furnace gate by name (it returns a GateOutput)
    layer = FMoE(num_expert=4, d_model=4, top_k=1, gate="switch")
    assert isinstance(layer.gate, gates.SwitchGate) and layer.gate.num_experts == 4
    assert layer(torch.randn(3, 4)).shape == (3, 4)


def test_other_refusals():
    layer = FMoETransformerMLP(num_expert=2, d_model=4, d_hidden=8)
    with pytest.raises(TypeError, match="one tensor"):
        layer({"a": torch.randn(2, 4)})

    class Overrides(FMoE):
        def expert_fn(self, inp, fwd_expert_count):
            return inp

    with pytest.raises(NotImplementedError, match="expert_fn"):
        Overrides(num_expert=2, d_model=4)
    faster = fmoe.FasterGate(4, 2, 1, 0)
    faster.policy_fn = lambda *a: None
    with pytest.raises(NotImplementedError, match="shadowing"):
        faster(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="group"):
        fmoe.SwitchGate(4, 2, 2).train()(torch.randn(3, 4))


# --- 1 and 2 gloo ranks -----------------------------------------------------------------------

PER_RANK = 2
SHAPES = [(2, 3, D), (4, 2, D)]  # per rank, unequal, with a leading batch dim


class _Largest(TorchDispatchMode):
    """Records the largest tensor any op creates (a proxy for peak construction memory)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


class Block(nn.Module):
    """A Transformer block's MLP half: LayerNorm, FastMoE MLP, residual."""

    def __init__(self, moe: nn.Module):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.moe = moe

    def forward(self, x):
        return x + self.moe(self.norm(x))


def _data(world_size: int):
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in SHAPES[:world_size]]
    ws = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in SHAPES[:world_size]]
    return xs, ws


def _compare(errors: dict, label: str, ref, actual, scale: float) -> None:
    errors[label] = relative_error(ref, actual, scale)


def _check_usage(rank: int, world_size: int) -> dict:
    """FastMoE's documented usage on this rank, against one process holding every expert."""
    W, E = world_size, PER_RANK
    xs, ws = _data(W)
    s_out, s_x, s_p = floors(torch.cat([x.reshape(-1) for x in xs]),
                             torch.cat([w.reshape(-1) for w in ws]))
    lo, hi = rank * E, (rank + 1) * E
    errors: dict[str, float] = {}
    facts: dict[str, object] = {}

    # 1. FMoETransformerMLP built per rank equals one process's layer with W*E experts
    def build(**kwargs):
        torch.manual_seed(11)
        layer = FMoETransformerMLP(d_model=D, d_hidden=F_HID, top_k=2, **kwargs).double()
        with torch.no_grad():
            layer.gate.gate.bias[0] += 2.0  # a hot expert: uneven traffic, idle experts
        return layer

    ref = build(num_expert=E * W)
    xs_ref = [x.clone().requires_grad_() for x in xs]
    params = dict(ref.experts.named_parameters(prefix="experts"))
    outs = []
    for x in xs_ref:
        idx, score = ref.gate(x.reshape(-1, D))
        outs.append(brute_force(x.reshape(-1, D), idx, score, 2,
                                fused_expert(params, F.gelu)).reshape(x.shape))
    sum((y * w).sum() for y, w in zip(outs, ws)).backward()
    variants = {"process_group": {"moe_group": dist.new_group(ranks=list(range(W)))},
                "communicator": {"moe_group": Communicator()},
                "default_group": {},
                "smart_shadow": {"moe_group": Communicator(),
                                 "parallel_config": ExpertParallelConfig(
                                     smart_schedule=True, group_size=1,
                                     shadow_mask=(True,) + (False,) * (W * E - 1))}}
    if W == 1:
        variants = {"default_group": {}}
    for name, kwargs in variants.items():
        with _Largest() as probe:
            layer = build(num_expert=E, world_size=W, **kwargs)
        # each rank allocates its own experts only (the largest tensor is its bank)
        facts[f"{name}/largest"] = probe.largest
        ref_state = ref.experts.state_dict()
        for key, p in layer.experts.state_dict().items():
            errors[f"{name}/init {key}"] = float(not torch.equal(p, ref_state[key][lo:hi]))
        x = xs[rank].clone().requires_grad_()
        y = layer(x)
        (y * ws[rank]).sum().backward()
        _compare(errors, f"{name}/out", outs[rank], y, s_out)
        _compare(errors, f"{name}/grad_x", xs_ref[rank].grad, x.grad, s_x)
        for key, p in layer.experts.named_parameters():
            _compare(errors, f"{name}/grad {key}", dict(ref.experts.named_parameters())[key]
                     .grad[lo:hi], p.grad, s_p)
        for key, p in layer.gate.named_parameters():
            summed = p.grad.clone()
            if W > 1:
                dist.all_reduce(summed)
            _compare(errors, f"{name}/grad gate {key}",
                     dict(ref.gate.named_parameters())[key].grad, summed, s_p)
        facts[f"{name}/marks"] = sorted({p.dp_comm for p in layer.parameters()})
        if layer.parallel is not None:
            facts[f"{name}/shadowed"] = layer.parallel.stats.shadowed
        facts[f"{name}/experts"] = (layer.experts.first_expert, layer.experts.num_experts)

    # 2. a Transformer block in DistributedGroupedDataParallel: dense and gate gradients
    #    averaged over the ranks, experts left local
    torch.manual_seed(12)
    block_ref = Block(FMoETransformerMLP(num_expert=E * W, d_model=D, d_hidden=F_HID)).double()
    torch.manual_seed(12)
    block = Block(FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID,
                                     world_size=W)).double()
    with torch.no_grad():
        block.norm.weight.add_(float(rank))  # DGDP's sync must undo this
    model = DistributedGroupedDataParallel(block)
    facts["synced"] = torch.equal(block.norm.weight, block_ref.norm.weight)
    sum((block_ref(x) * w).sum() for x, w in zip(xs, ws)).backward()
    (model(xs[rank]) * ws[rank]).sum().backward()
    model.allreduce_gradients()
    ref_params = dict(block_ref.named_parameters())
    for key, p in block.named_parameters():
        expected = ref_params[key].grad
        if "experts." in key:
            expected = expected[lo:hi]
        elif W > 1:
            expected = expected / W  # FastMoE averages replicated gradients
        _compare(errors, f"dgdp/{key}", expected, p.grad, s_p)
    facts["dgdp_comms"] = sorted(model.comms)

    # 3. a custom expert class, with FasterMoE's shadowing, against one process
    torch.manual_seed(13)
    cref = FMoE(num_expert=E * W, d_model=D, expert=LinearExpert).double()
    y_ref, gx_ref, cref = _module_reference(cref, torch.cat([x.reshape(-1, D) for x in xs]),
                                            torch.cat([w.reshape(-1, D) for w in ws]))
    torch.manual_seed(13)
    config = ExpertParallelConfig(shadow_mask=(False, True) + (False,) * (W * E - 2)) \
        if W > 1 else None
    custom = FMoE(num_expert=E, d_model=D, expert=LinearExpert, world_size=W,
                  parallel_config=config).double()
    x = xs[rank].reshape(-1, D).clone().requires_grad_()
    y = custom(x)
    (y * ws[rank].reshape(-1, D)).sum().backward()
    if custom.parallel is not None:
        facts["custom/shadowed"] = custom.parallel.stats.shadowed
    start = sum(t.reshape(-1, D).shape[0] for t in xs[:rank])
    rows = slice(start, start + x.shape[0])
    _compare(errors, "custom/out", y_ref[rows], y, s_out)
    _compare(errors, "custom/grad_x", gx_ref[rows], x.grad, s_x)
    for i, module in enumerate(custom.experts):
        for (key, p), p_ref in zip(module.named_parameters(), cref.experts[lo + i].parameters()):
            _compare(errors, f"custom/expert {i} {key}", p_ref.grad, p.grad, s_p)

    # 4. FastMoE's test pattern (self.experts = _Expert(...)) and a per-rank checkpoint
    torch.manual_seed(14)
    mine = MyMoE(E, D, F_HID, W, 2, F.gelu).double()
    if W > 1:
        mine.mark_parallel_comm("none")
    state = mine.state_dict()
    fresh = MyMoE(E, D, F_HID, W, 2, F.gelu).double()
    fresh.load_state_dict(state)
    x = xs[rank].reshape(-1, D)
    facts["checkpoint"] = torch.equal(fresh(x), mine(x))
    facts["checkpoint_keys"] = sorted(state)

    # 5. torch DDP: correct with ddp_ignore_experts, refused without it
    outer = Block(FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID,
                                     world_size=W)).double()
    facts["ddp_refused"] = ""
    try:
        DistributedDataParallel(outer)(xs[rank])
    except RuntimeError as exc:
        facts["ddp_refused"] = str(exc)
    fmoe.ddp_ignore_experts(outer)
    DistributedDataParallel(outer)(xs[rank]).sum().backward()

    # 6. DGDP refuses to average different experts, or to leave replicas unreduced
    facts["dgdp_refusals"] = []
    if W > 1:
        wrong = FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID, world_size=W,
                                   expert_dp_comm="dp")
        replicated = FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID)
        for bad in (wrong, replicated):
            try:
                DistributedGroupedDataParallel(bad)
            except ValueError as exc:
                facts["dgdp_refusals"].append(str(exc))
        # replicated experts tagged "dp" are averaged, as dense parameters are
        torch.manual_seed(15)
        dp_layer = FMoETransformerMLP(num_expert=E, d_model=D, d_hidden=F_HID,
                                      expert_dp_comm="dp").double()
        dp_ref = copy.deepcopy(dp_layer)
        sum((dp_ref(x) * w).sum() for x, w in zip(xs, ws)).backward()
        dp_model = DistributedGroupedDataParallel(dp_layer)
        (dp_model(xs[rank]) * ws[rank]).sum().backward()
        dp_model.allreduce_gradients(no_scale=True)
        for (key, p), p_ref in zip(dp_layer.named_parameters(), dp_ref.parameters()):
            _compare(errors, f"dp-experts/{key}", p_ref.grad, p.grad, s_p)
    return {"errors": errors, "facts": facts}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [1, 2])
def test_fastmoe_usage_on_gloo_ranks(world_size):
    out = run_distributed(_check_usage, world_size, timeout_s=170)
    bank = PER_RANK * D * F_HID  # this rank's htoh4 weight: the largest tensor it needs
    for rank, res in enumerate(out):
        errors, facts = res["errors"], res["facts"]
        for name, err in errors.items():
            assert err <= TOL, f"rank {rank}: {name} relative error {err:.2e}"
        assert len(errors) > (60 if world_size > 1 else 25)
        for key, value in facts.items():
            if key.endswith("/largest"):
                assert value == bank, f"rank {rank}: {key} = {value}, the local bank is {bank}"
            if key.endswith("/experts"):
                assert value == (rank * PER_RANK, PER_RANK)
            if key.endswith("/marks"):
                assert value == ["gate", "none"]
            if key.endswith("/shadowed"):
                expected = {"smart_shadow/shadowed": [0], "custom/shadowed": [1]}.get(key, [])
                assert value == expected, f"rank {rank}: {key} = {value}"
        assert facts["synced"]
        assert facts["dgdp_comms"] == ["dp", "gate", "moe", "world"]
        assert facts["checkpoint"]
        assert facts["checkpoint_keys"] == ["experts.h4toh.bias", "experts.h4toh.weight",
                                            "experts.htoh4.bias", "experts.htoh4.weight",
                                            "gate.gate.bias", "gate.gate.weight"]
        if world_size > 1:
            assert "ddp_ignore_experts" in facts["ddp_refused"]
            assert len(facts["dgdp_refusals"]) == 2
            assert "different experts" in facts["dgdp_refusals"][0]
            assert "expert_dp_comm='dp'" in facts["dgdp_refusals"][1]
        else:
            # one worker holds every expert: DDP is plain data parallelism
            assert facts["ddp_refused"] == ""


def _check_group_gates(rank: int, world_size: int) -> dict:
    """Group-wide capacity (Switch, DC) and SWIPE on hand-built routings over 2 ranks."""
    comm = Communicator()
    out = {}

    def bound(gate):
        gate.bind(GateContext(rank=rank, world_size=2, num_experts_per_rank=1, comm=comm))
        _identity(gate, 2)
        with torch.no_grad():
            gate.gate.bias.zero_()
        return gate

    # every token of both ranks wants expert 0 (owned by rank 0)
    x = torch.tensor([[2.0, 0.0]] * 4)
    # Switch: capacity ceil(0.5 * 4 / 1) = 2 for the whole group, rank 0 first
    switch = bound(fmoe.SwitchGate(2, 1, 2, capacity=(0.5, 0.5))).eval()
    out["switch"] = switch(x)[0].reshape(-1).tolist()
    # DC: each owner's capacity is ceil(0.75 * its T): 3 for expert 0 (rank 0 has 4
    # tokens), 6 for expert 1 (rank 1 has 8); rank 0 prefers (0, 1), rank 1 (1, 0)
    dc = bound(fmoe.gates.DCGate(2, 1, 2, capacity=(0.75, 0.75), random_routing=False)).eval()
    x_dc = torch.tensor([[2.0, 1.0]] * 4) if rank == 0 else torch.tensor([[1.0, 2.0]] * 8)
    out["dc"] = dc(x_dc)[0].tolist()
    # SWIPE: rank 0 has 4 tokens, rank 1 has 2, all preferring worker 0 (capacity 4)
    swipe = bound(fmoe.SwipeGate(2, 1, 2, top_k=1)).train()
    out["swipe"] = swipe(x if rank == 0 else x[:2])[0].reshape(-1).tolist()
    return out


@pytest.mark.timeout(120)
def test_group_wide_gates_on_two_ranks():
    out = run_distributed(_check_group_gates, 2)
    assert out[0]["switch"] == [0, 0, -1, -1] and out[1]["switch"] == [-1, -1, -1, -1]
    # rank 0 claims first: 3 of its 4 on expert 0, all 4 on expert 1; rank 1 gets the
    # 2 places left on expert 1 and none on expert 0
    assert out[0]["dc"] == [[0, 1], [0, 1], [0, 1], [-1, 1]]
    assert out[1]["dc"] == [[1, -1], [1, -1]] + [[-1, -1]] * 6
    # worker 0 accepts rank 0's 4 tokens; rank 1's 2 move to worker 1 (expert 1)
    assert out[0]["swipe"] == [0, 0, 0, 0] and out[1]["swipe"] == [1, 1]
