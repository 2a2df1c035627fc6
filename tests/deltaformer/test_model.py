"""Tests for the DeltaFormer layer and sequence models (Xu, Ao, He, Lu, Shi, Zhong, NeurIPS 2025,
Sec. 3.2-3.4; DeltaNet baseline: Yang et al. 2024): the layer against the literal recurrence on its
own projected tensors, per-head mixed kappa1, grouped heads against expanded heads (outputs, and
gradients with mixed kappa1), key-U cache decoding against the full forward, parameter counts per
mixer, the 2 sigmoid beta, bad configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from furnace.deltaformer import (
    DeltaFormerAttention,
    DeltaFormerLM,
    LMConfig,
    SequenceModel,
    TransformerLM,
    deltaformer_naive,
)
from furnace.deltaformer.model import _expand_heads
from furnace.runtime.testing import max_relative_error


def _layer(seed=0, **overrides):
    torch.manual_seed(seed)
    config = LMConfig(d_model=32, num_heads=4, chunk_size=5, max_len=64, **overrides)
    return DeltaFormerAttention(config).double()


def _inputs(batch=2, seq_len=13, width=32, seed=1):
    return torch.randn(batch, seq_len, width, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def _naive_per_head(layer, x):
    """Reference: project, expand every tensor to the query heads, naive per head, out-project."""
    cfg = layer.config
    p = layer.project(x)
    heads = cfg.num_heads
    k, v = _expand_heads(p.k, heads), _expand_heads(p.v, heads)
    w, beta = _expand_heads(p.w, heads), _expand_heads(p.beta[..., None], heads)[..., 0]
    outputs = [
        deltaformer_naive(p.q[:, :, h:h + 1], k[:, :, h:h + 1], v[:, :, h:h + 1],
                          w[:, :, h:h + 1], beta[:, :, h:h + 1], kappa1=kernel)
        for h, kernel in enumerate(cfg.kappa1_per_head)
    ]
    return layer.out(torch.cat(outputs, dim=2))


def _max_error(actual, reference, x):
    """max |actual - reference| over max |reference|, floored at max |x|.

    The layer's output is a linear map of mixes of projections of x, so |x| sets the scale
    its rounding is relative to; the floor keeps a reference that happens to be ~0 from
    turning float64 rounding into a large ratio.
    """
    return max_relative_error(reference, actual, scale=x.abs().max().item())


# float64 throughout: the two sides sum the same terms in another order (chunked solve vs
# token loop, cached vs full attention), ~1e-15 relative per operation over T <= 13 rows and
# a few layers of matmuls, so 1e-10 is loose for any thread count yet far below a real bug
TOLERANCE = 1e-10


@pytest.mark.parametrize("mixer", ["attention", "deltaformer", "deltanet"])
def test_shapes(mixer):
    config = LMConfig(vocab_size=11, d_model=32, num_heads=4, num_kv_heads=2, mixer=mixer,
                      max_len=16)
    tokens = torch.randint(0, 11, (3, 9))
    assert SequenceModel(config)(tokens).shape == (3, 9, 11)
    classifier = SequenceModel(dataclasses.replace(config, num_classes=5))
    assert classifier(tokens).shape == (3, 9, 5)


@pytest.mark.parametrize("kappa1", ["softmax", "linear"])
@pytest.mark.parametrize("w_source", ["k", "q", "own"])
def test_forward_equals_naive_on_projections(kappa1, w_source):
    layer = _layer(kappa1=kappa1, w_source=w_source, qk_norm=w_source == "own")
    x = _inputs()
    p = layer.project(x)
    direct = layer.out(deltaformer_naive(p.q, p.k, p.v, p.w, p.beta, kappa1=kappa1))
    assert _max_error(layer(x), direct, x) < TOLERANCE


def test_mixed_kappa1_per_head_equals_per_head_naive():
    layer = _layer(kappa1=("softmax", "linear", "relu", "linear"))
    x = _inputs()
    assert _max_error(layer(x), _naive_per_head(layer, x), x) < TOLERANCE


@pytest.mark.parametrize("w_source", ["k", "q", "own"])
def test_grouped_heads_equal_expanded_heads(w_source):
    layer = _layer(num_kv_heads=2, w_source=w_source, kappa1=("softmax", "softmax", "linear",
                                                              "linear"))
    x = _inputs()
    assert layer.beta_proj.out_features == (4 if w_source == "q" else 2)
    assert _max_error(layer(x), _naive_per_head(layer, x), x) < TOLERANCE


def _gradients(layer, x, forward, seed=3):
    """d/d(x, every parameter) of <forward(x), G> for a fixed random cotangent G."""
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y = forward(x)
    cotangent = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(seed))
    (y * cotangent).sum().backward()
    return {"x": x.grad, **{name: p.grad for name, p in layer.named_parameters()}}


@pytest.mark.parametrize("config", [
    *({"num_kv_heads": 2, "w_source": w, "kappa1": ("softmax", "softmax", "linear", "linear")}
      for w in ("k", "q", "own")),
    {"kappa1": ("softmax", "linear", "relu", "linear")},
], ids=["grouped-k", "grouped-q", "grouped-own", "mixed-kappa1"])
def test_layer_gradients_equal_per_head_naive(config):
    # the grouped and mixed-kappa1 paths against the literal recurrence per expanded head
    layer = _layer(**config)
    x = _inputs()
    fast = _gradients(layer, x, layer)
    reference = _gradients(layer, x, lambda x: _naive_per_head(layer, x))
    assert fast.keys() == reference.keys()
    largest = max(g.abs().max().item() for g in reference.values())
    for name, g in reference.items():
        assert g is not None and fast[name] is not None, f"no gradient for {name}"
        # each gradient relative to its own largest entry; one that happens to be ~0 against
        # a thousandth of the layer's largest, the magnitude its float64 rounding follows
        error = max_relative_error(g, fast[name], scale=1e-3 * largest)
        assert error < TOLERANCE, f"{name}: {error:.1e}"


@pytest.mark.parametrize("kappa1", ["softmax", "linear", ("softmax", "linear", "linear",
                                                          "softmax")])
@pytest.mark.parametrize("num_kv_heads,w_source", [(4, "k"), (2, "k"), (1, "own"), (2, "q")])
def test_decode_equals_full_forward(kappa1, num_kv_heads, w_source):
    if not isinstance(kappa1, str) and num_kv_heads < 4 and w_source != "q":
        kappa1 = ("softmax", "softmax", "linear", "linear") if num_kv_heads == 2 else "linear"
    layer = _layer(kappa1=kappa1, num_kv_heads=num_kv_heads, w_source=w_source)
    assert layer.config.rotary
    x = _inputs(seq_len=11)
    full = layer(x)
    cache = None
    for t in range(x.shape[1]):
        y_t, cache = layer.step(x[:, t], cache)
        assert _max_error(y_t, full[:, t], x) < TOLERANCE
    assert cache.length == x.shape[1]


def test_two_sigmoid_doubles_beta():
    plain = _layer(beta_activation="sigmoid")
    doubled = _layer(beta_activation="2sigmoid")
    doubled.load_state_dict(plain.state_dict())
    x = _inputs()
    torch.testing.assert_close(doubled.project(x).beta, 2 * plain.project(x).beta)


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_differ_only_by_mixer_projections():
    base = LMConfig(d_model=64, num_layers=2, num_heads=4)
    counts = {mixer: _count(SequenceModel(dataclasses.replace(base, mixer=mixer)))
              for mixer in ("attention", "deltaformer", "deltanet")}
    own_w = _count(SequenceModel(dataclasses.replace(base, w_source="own")))
    beta_params = 2 * (64 * 4 + 4)  # per layer: Linear(d_model, heads) with bias
    assert counts["deltaformer"] - counts["attention"] == beta_params
    assert counts["deltanet"] - counts["attention"] == beta_params
    assert own_w - counts["deltaformer"] == 2 * 64 * 64  # w_proj: d_model x heads * head_dim
    assert own_w == 140744
    assert counts == {"attention": 132032, "deltaformer": 132552, "deltanet": 132552}
    assert _count(TransformerLM(base)) == counts["attention"]
    assert _count(DeltaFormerLM(dataclasses.replace(base, mixer="attention"))) == counts[
        "deltaformer"]
    # Grouped heads shrink k, v (and beta, since U is per key-value head) for every mixer alike.
    grouped = dataclasses.replace(base, num_kv_heads=2)
    assert _count(SequenceModel(grouped)) < counts["deltaformer"]


@pytest.mark.parametrize("overrides", [
    {"num_heads": 4, "num_kv_heads": 3},
    {"mixer": "mamba"},
    {"kappa1": "exp"},
    {"kappa1": ("softmax", "nope", "linear", "linear")},
    {"w_source": "v"},
    {"kappa1": ("softmax", "linear")},
    {"beta_activation": "tanh"},
    {"num_heads": 5},
    {"num_kv_heads": 2, "kappa1": ("softmax", "linear", "linear", "linear")},
])
def test_bad_configs_raise(overrides):
    with pytest.raises(ValueError):
        LMConfig(d_model=32, **{"num_heads": 4, **overrides})


def test_deltanet_mixer_equals_linear_kappa1_u_stage():
    """Paper App. A: with w = k, alpha = beta and linear kappa1, beta_t u_t is the delta-rule
    write, so o_t = sum_{i<=t} (q_t . k_i) beta_i u_i reproduces the DeltaNet recurrence."""
    torch.manual_seed(0)
    config = LMConfig(d_model=32, num_heads=4, num_kv_heads=2, mixer="deltanet")
    mixer = SequenceModel(config).double().blocks[0].mixer
    x = _inputs(seq_len=9)
    q, k, v = mixer.qkv(x, torch.arange(9))
    k, v = _expand_heads(k, 4), _expand_heads(v, 4)
    q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    beta = torch.sigmoid(mixer.beta_proj(x))
    _, u = deltaformer_naive(q, k, v, k, beta, kappa1="linear", alpha=beta, return_u=True)
    scores = torch.einsum("bthc,bihc->bhti", q, k).tril()
    reference = mixer.out(torch.einsum("bhti,bihc->bthc", scores, u))
    assert _max_error(mixer(x), reference, x) < TOLERANCE
