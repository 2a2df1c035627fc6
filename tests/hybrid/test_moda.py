"""MoDa training against the single-process reference: 3 AdamW steps of a tiny fp64 MoE
LM on 2, 4 and 8 gloo ranks, expert-parallel groups equal to and smaller than the world.

Every rank builds the same global model (same seed), applies `moda_parallel` and trains
on its own equal shard of the same global batches; the parent runs
`reference_training` on the whole batches once and compares, at every step, the global
loss, every gradient after `reduce_gradients` and every parameter after the optimizer
step (an expert shard against its slice of the reference tensor). The first step is the
one-step check; steps 2-3 check that the optimizer states stay equal too.

Tolerance 1e-10 relative (fp64, the parallel path only reorders sums), elementwise-max
form, with the floor of each comparison the peak of the whole reference tensor (an
expert shard no token reached has an exactly zero reference gradient), and the peak of
every reference gradient of the step where the whole tensor is zero.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from furnace.hybrid.alltoall import emulated_supernode_topology
from furnace.hybrid.experiments import equality_errors
from furnace.hybrid.layout import MoDaGroups, MoDaLayout
from furnace.hybrid.moda import moda_parallel, train_moda
from furnace.hybrid.naive import ReferenceStep, lm_loss, reference_training
from furnace.moe import MoELMConfig, MoETransformerLM
from furnace.runtime import init_from_env, run_distributed
from furnace.runtime.testing import max_relative_error
from furnace.runtime.topology import Topology
from furnace.runtime.training import TrainLoopConfig, TrainResult, train_loop

TOL = 1e-10
GLOBAL_BATCH, STEPS, LR = 8, 3, 2e-2
# the loop's clip is far below the first step's gradient norm, so the global-norm clip acts
LOOP = TrainLoopConfig(steps=STEPS, lr=LR, weight_decay=0.1, clip=0.05, seed=0)
CONFIG = MoELMConfig(vocab_size=16, d_model=8, num_layers=1, num_heads=2, seq_len=6,
                     num_experts=8, top_k=2, d_hidden=6)


def build_model() -> MoETransformerLM:
    torch.manual_seed(11)
    model = MoETransformerLM(CONFIG).double()
    with torch.no_grad():
        # a hot expert in every layer: uneven loads, and experts some shards never see
        for layer in model.moe_layers():
            layer.gate.scorer.bias[0] += 1.5
    return model


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(STEPS):
        seq = torch.randint(0, CONFIG.vocab_size, (GLOBAL_BATCH, CONFIG.seq_len + 1),
                            generator=gen)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


@cache
def reference() -> list[ReferenceStep]:
    return reference_training(build_model(), global_batches(), make_optimizer)


def _train_rank(rank: int, world_size: int, expert_parallel_sizes: list[int],
                topology: Topology | None, loop_size: int | None = None) -> dict:
    """One MoDa run per EP size; per step: loss, gradients, parameters (this rank's).
    With ``loop_size``, also a `train_moda` run with that EP size."""
    runs = []
    for P in expert_parallel_sizes:
        groups = MoDaGroups.create(MoDaLayout(world_size=world_size, expert_parallel_size=P,
                                              topology=topology))
        moda = moda_parallel(build_model(), groups)
        optimizer = make_optimizer(moda.model.parameters())
        b = GLOBAL_BATCH // world_size
        steps = []
        for x, y in global_batches():
            optimizer.zero_grad(set_to_none=True)
            _, loss = moda.model(x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b])
            loss.backward()
            moda.reduce_gradients()
            grads = {n: p.grad.clone() for n, p in moda.model.named_parameters()}
            # a bound no gradient reaches: the global norm, nothing clipped
            norm = moda.clip_gradients(1e9)
            optimizer.step()
            steps.append({"loss": float(loss), "norm": norm,
                          "grads": grads,
                          "params": {n: p.detach().clone()
                                     for n, p in moda.model.named_parameters()}})
        runs.append({"P": P, "shard": groups.layout.shard_of(rank), "kinds": moda.kinds,
                     "steps": steps})
    out: dict = {"runs": runs}
    if world_size == 2:
        # unequal shards (3 and 5 rows): the loss weighted by the rank's share of the tokens
        groups = MoDaGroups.create(MoDaLayout(world_size=2, expert_parallel_size=2))
        moda = moda_parallel(build_model(), groups)
        x, y = global_batches()[0]
        rows = slice(0, 3) if rank == 0 else slice(3, GLOBAL_BATCH)
        _, loss = moda.model(x[rows], y[rows])
        (loss * moda.loss_weight(x[rows].numel())).backward()
        moda.reduce_gradients()
        out["unequal"] = {"P": 2, "shard": rank, "kinds": moda.kinds,
                          "grads": {n: p.grad.clone() for n, p in moda.model.named_parameters()}}
    if loop_size is not None:
        groups = MoDaGroups.create(MoDaLayout(world_size=world_size,
                                              expert_parallel_size=loop_size))
        result = train_moda(LOOP, groups, build_model=build_model,
                            global_batches=lambda generator: iter(global_batches()),
                            loss=lm_loss, result=TrainResult())
        assert result.model is not None
        out["loop"] = {"P": loop_size, "shard": groups.layout.shard_of(rank),
                       "losses": result.losses,
                       "params": {n: p.detach().clone()
                                  for n, p in result.model.named_parameters()}}
    return out


def _errors(run: dict, ref: list[ReferenceStep]) -> dict[str, float]:
    """Worst relative error per (step, kind of value, parameter) of one rank's run."""
    return equality_errors(run, ref, CONFIG.num_experts)


def _check_loop(ranks: list[dict]) -> None:
    """`train_moda` on W ranks against `train_loop` in one process on the global batches."""
    single = train_loop(LOOP, build_model=build_model,
                        batches=lambda generator: iter(global_batches()), loss=lm_loss,
                        result=TrainResult())
    assert single.model is not None
    expected = dict(single.model.named_parameters())
    W = len(ranks)
    for i, loss in enumerate(single.losses):
        mean = sum(r["losses"][i] for r in ranks) / W
        assert abs(mean - loss) <= TOL * abs(loss), (i, mean, loss)
    for rank, run in enumerate(ranks):
        E = CONFIG.num_experts // run["P"]
        lo, hi = run["shard"] * E, (run["shard"] + 1) * E
        for name, actual in run["params"].items():
            full = expected[name].detach()
            want = full[lo:hi] if ".moe.experts." in name else full
            err = max_relative_error(want, actual, float(full.abs().max()) or 1.0)
            assert err <= TOL, f"train_moda rank {rank}: {name} error {err:.2e}"


def _check(world_size: int, sizes: list[int], topology: Topology | None = None,
           loop_size: int | None = None) -> None:
    out = run_distributed(_train_rank, world_size, sizes, topology, loop_size,
                          timeout_s=150)
    per_rank = [o["runs"] for o in out]
    ref = reference()
    if loop_size is not None:
        _check_loop([o["loop"] for o in out])
    if world_size == 2:
        for rank, o in enumerate(out):
            run = dict(o["unequal"], steps=[{"grads": o["unequal"]["grads"], "params": {}}])
            for key, err in _errors(run, ref[:1]).items():
                assert err <= TOL, f"unequal shards, rank {rank}: {key} error {err:.2e}"
    for j, P in enumerate(sizes):
        for i, ref_step in enumerate(ref):
            # equal shards: the global mean loss is the mean of the ranks' mean losses
            loss = sum(runs[j]["steps"][i]["loss"] for runs in per_rank) / world_size
            assert abs(loss - ref_step.loss) <= TOL * abs(ref_step.loss), (P, i, loss)
    for rank, runs in enumerate(per_rank):
        for run in runs:
            for step, ref_step in zip(run["steps"], ref):
                ref_norm = float(torch.cat([g.reshape(-1) for g in ref_step.grads.values()])
                                 .norm())
                assert abs(step["norm"] - ref_norm) <= TOL * ref_norm
            kinds = set(run["kinds"].values())
            assert kinds == {"dense", "gate", "expert"}
            # every reference parameter is checked: the shard holds all of them by name
            assert set(run["steps"][0]["params"]) == set(ref[0].params)
            for key, err in _errors(run, ref).items():
                assert err <= TOL, f"rank {rank}, P={run['P']}: {key} error {err:.2e}"


@pytest.mark.timeout(180)
def test_moda_matches_single_process_on_2_ranks():
    # P = W (BaGuaLu's machine-wide sharding) and P = 1 (every rank all experts); and
    # one step on unequal shards with MoDa.loss_weight
    _check(2, [2, 1])


@pytest.mark.timeout(180)
def test_moda_matches_single_process_on_4_ranks_with_ep_smaller_than_world():
    # and the thin trainer (train_loop with MoDa's hooks, clipping active) with P = 2
    _check(4, [2], loop_size=2)


@pytest.mark.timeout(180)
def test_moda_matches_single_process_on_8_ranks_laid_out_as_2x2x2():
    # EP group = one supernode (4 ranks), two replicas of each shard across supernodes
    # 2 supernodes x 2 nodes x 2 core groups: MoDa's layout rule sees the supernodes
    _check(8, [4], emulated_supernode_topology())


def test_reference_moves_every_parameter_and_routes_unevenly():
    """The oracle is not trivial: training changes every tensor, the loss is finite, and
    the hot expert takes more than its share (so the shards' loads differ)."""
    ref = reference()
    model = build_model()
    initial = dict(model.named_parameters())
    for name, value in ref[-1].params.items():
        assert not torch.equal(value, initial[name].detach()), name
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in ref)
    x, _ = global_batches()[0]
    model(x)
    counts = model.moe_layers()[0].last_routing.tokens_per_expert
    assert max(counts) > 2 * sum(counts) / len(counts)
    first_norm = torch.cat([g.reshape(-1) for g in ref[0].grads.values()]).norm()
    assert first_norm > 4 * LOOP.clip


def test_one_rank_tags_kinds_and_leaves_gradients_alone():
    """At W = 1 MoDa is the plain model: every parameter tagged by where it lives, the
    reduction an identity and the global-norm clip torch's own."""
    with init_from_env(backend="gloo"):
        groups = MoDaGroups.create(MoDaLayout(world_size=1, expert_parallel_size=1))
        moda = moda_parallel(build_model(), groups)
        for name, kind in moda.kinds.items():
            expected = ("expert" if ".moe.experts." in name
                        else "gate" if ".moe.gate." in name else "dense")
            assert kind == expected, name
        assert {"dense", "gate", "expert"} == set(moda.kinds.values())
        x, y = global_batches()[0]
        _, loss = moda.model(x, y)
        loss.backward()
        before = {n: p.grad.clone() for n, p in moda.model.named_parameters()}
        moda.reduce_gradients()
        for n, p in moda.model.named_parameters():
            assert torch.equal(p.grad, before[n]), n
        clone = build_model()
        for p, g in zip(clone.parameters(), before.values()):
            p.grad = g.clone()
        expected_norm = float(torch.nn.utils.clip_grad_norm_(clone.parameters(), 0.05))
        assert abs(moda.clip_gradients(0.05) - expected_norm) <= TOL * expected_norm
        assert moda.loss_weight(7) == 1.0
        with pytest.raises(ValueError, match="no rank has any tokens"):
            moda.loss_weight(0)
        for p, q in zip(moda.model.parameters(), clone.parameters()):
            assert max_relative_error(q.grad, p.grad, expected_norm) <= TOL
