"""Resharding DCP checkpoints (`furnace.hybrid.checkpoint`): save under one MoDa layout,
load under another, with a tiny fp64 MoE LM trained by AdamW.

Layout A trains 2 steps and saves; layout B builds a fresh model and optimizer and loads.
Then (a) every parameter B holds equals A's exactly (B's shard against the matching slice
of A's gathered full tensor), (b) so does every optimizer state tensor (exp_avg,
exp_avg_sq, step), (c) B's loss on the third batch equals the one A computed itself, to
1e-12 relative (fp64; the layouts only reorder the loss's sums), and B's parameters after
the third step equal A's to 1e-10 (the optimizer state is attached where it belongs).
Pairs: (W=4,P=4)->(W=2,P=2), (W=4,P=2)->(W=4,P=4), (W=2,P=2)->one process, one process
->(W=4,P=2). Two gloo jobs (W=4, then W=2) do every distributed save and load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from furnace.hybrid.checkpoint import (
    RECORD_FILE,
    load_moda_checkpoint,
    load_module_checkpoint,
    read_moda_metadata,
    save_moda_checkpoint,
    save_module_checkpoint,
)
from furnace.hybrid.layout import MoDaGroups, MoDaLayout
from furnace.hybrid.moda import MoDa, moda_parallel
from furnace.moe import MoELMConfig, MoETransformerLM
from furnace.runtime import run_distributed
from furnace.runtime.testing import max_relative_error
from furnace.runtime.training import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)

CONFIG = MoELMConfig(vocab_size=16, d_model=16, num_layers=2, num_heads=2, seq_len=8,
                     num_experts=4, top_k=2, d_hidden=8)
OTHER = MoELMConfig(vocab_size=16, d_model=16, num_layers=2, num_heads=2, seq_len=8,
                    num_experts=2, top_k=2, d_hidden=8)
GLOBAL_BATCH, LR = 4, 2e-2
LOSS_TOL, STEP_TOL = 1e-12, 1e-10
SINGLE = "single"


def build_model(config: MoELMConfig = CONFIG) -> MoETransformerLM:
    torch.manual_seed(3)
    model = MoETransformerLM(config).double()
    with torch.no_grad():
        for layer in model.moe_layers():
            layer.gate.scorer.bias[0] += 1.0  # uneven routing: shards see different loads
    return model


def make_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(3):
        seq = torch.randint(0, CONFIG.vocab_size, (GLOBAL_BATCH, CONFIG.seq_len + 1),
                            generator=gen)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, rows: slice,
          moda: MoDa | None) -> float:
    optimizer.zero_grad(set_to_none=True)
    x, y = batch
    _, loss = model(x[rows], y[rows])
    loss.backward()
    if moda is not None:
        moda.reduce_gradients()
    optimizer.step()
    return float(loss.detach())


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "state": {names[id(p)]: {k: v.clone() for k, v in s.items()}
                      for p, s in optimizer.state.items()}}


def _third_step(model, optimizer, rows: slice, moda: MoDa | None) -> dict[str, Any]:
    """The third batch: its loss before the step, and the parameters after it."""
    loss = _step(model, optimizer, batches()[2], rows, moda)
    return {"loss3": loss, "params3": {n: p.detach().clone()
                                       for n, p in model.named_parameters()}}


def _rank(rank: int, world_size: int, actions: list[tuple[str, int, str]],
          root: str) -> list[dict[str, Any]]:
    out = []
    b = GLOBAL_BATCH // world_size
    rows = slice(rank * b, (rank + 1) * b)
    for what, P, name in actions:
        groups = MoDaGroups.create(MoDaLayout(world_size=world_size, expert_parallel_size=P))
        path = Path(root) / name
        if what == "mismatch":
            moda = moda_parallel(build_model(), groups)
            try:
                load_moda_checkpoint(path, moda, make_optimizer(moda.model))
            except CheckpointMismatchError as exc:
                out.append({"error": str(exc), "path": exc.path})
            continue
        moda = moda_parallel(build_model(), groups)
        optimizer = make_optimizer(moda.model)
        if what == "train":
            losses, rng = [], torch.get_rng_state()
            for step, batch in enumerate(batches()[:2], start=1):
                losses.append(_step(moda.model, optimizer, batch, rows, moda))
                rng = torch.get_rng_state()
                # saving after step 1 too: step 2's save must replace it whole
                save_moda_checkpoint(path, moda, optimizer,
                                     metadata={"step": step, "losses": list(losses),
                                               "rng": rng})
            metadata = {"rng": rng}
        else:
            metadata = load_moda_checkpoint(path, moda, optimizer)
        run = {"P": P, "shard": groups.layout.shard_of(rank), "metadata": metadata,
               **_snapshot(moda.model, optimizer)}
        run.update(_third_step(moda.model, optimizer, rows, moda))
        out.append(run)
    return out


def _single(path: Path, *, load: bool) -> dict[str, Any]:
    model = build_model()
    optimizer = make_optimizer(model)
    metadata = None
    if load:
        metadata = load_module_checkpoint(path, model, optimizer)
    else:
        losses = [_step(model, optimizer, batch, slice(None), None) for batch in batches()[:2]]
        save_module_checkpoint(path, model, optimizer,
                               metadata={"step": 2, "losses": losses})
    run = {"P": 1, "shard": 0, "metadata": metadata, **_snapshot(model, optimizer)}
    run.update(_third_step(model, optimizer, slice(None), None))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """Every layout's runs: name -> list of per-rank runs (one entry for one process)."""
    root = tmp_path_factory.mktemp("ckpt")
    out: dict[str, Any] = {"root": root}
    out["train single"] = [_single(root / SINGLE, load=False)]
    four = run_distributed(_rank, 4, [("train", 4, "w4p4"), ("train", 2, "w4p2"),
                                      ("load", 2, SINGLE), ("load", 4, "w4p2")],
                           str(root), timeout_s=60)
    for j, key in enumerate(["train w4p4", "train w4p2", "load single->w4p2",
                             "load w4p2->w4p4"]):
        out[key] = [r[j] for r in four]
    save_module_checkpoint(root / "other", (m := build_model(OTHER)), make_optimizer(m),
                           metadata={})
    two = run_distributed(_rank, 2, [("train", 2, "w2p2"), ("load", 2, "w4p4"),
                                     ("mismatch", 2, "other")], str(root), timeout_s=60)
    for j, key in enumerate(["train w2p2", "load w4p4->w2p2", "mismatch"]):
        out[key] = [r[j] for r in two]
    out["load w2p2->single"] = [_single(root / "w2p2", load=True)]
    return out


def _full(ranks: list[dict[str, Any]], what: str) -> dict[str, Any]:
    """A layout's tensors as full tensors: expert shards of ranks 0..P-1 concatenated."""
    P = ranks[0]["P"]
    names = ranks[0][what]
    out: dict[str, Any] = {}

    def gather(name: str, get) -> torch.Tensor:
        if ".moe.experts." not in name:
            return get(ranks[0])
        return torch.cat([get(r) for r in ranks[:P]])

    for name in names:
        if what == "state":
            out[name] = {k: (gather(name, lambda r, n=name, k=k: r["state"][n][k])
                             if k != "step" else ranks[0]["state"][name][k])
                         for k in names[name]}
        else:
            out[name] = gather(name, lambda r, n=name: r[what][n])
    return out


def _slice(full: torch.Tensor, name: str, run: dict[str, Any]) -> torch.Tensor:
    if ".moe.experts." not in name or full.dim() == 0:
        return full
    E = CONFIG.num_experts // run["P"]
    return full[run["shard"] * E:(run["shard"] + 1) * E]


PAIRS = [("train w4p4", "load w4p4->w2p2"), ("train w4p2", "load w4p2->w4p4"),
         ("train w2p2", "load w2p2->single"), ("train single", "load single->w4p2")]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("saved", "loaded"), PAIRS)
def test_load_under_another_layout_restores_parameters_state_and_next_loss(runs, saved,
                                                                           loaded):
    a, b = runs[saved], runs[loaded]
    params, state, params3 = _full(a, "params"), _full(a, "state"), _full(a, "params3")
    assert len(params) == len(dict(build_model().named_parameters()))
    for run in b:
        assert set(run["params"]) == set(params)
        for name, value in run["params"].items():
            assert torch.equal(value, _slice(params[name], name, run)), name
        assert set(run["state"]) == set(state)
        for name, keys in run["state"].items():
            assert set(keys) == {"step", "exp_avg", "exp_avg_sq"}
            for key, value in keys.items():
                assert torch.equal(value, _slice(state[name][key], name, run)), (name, key)
        for name, value in run["params3"].items():
            full = params3[name]
            err = max_relative_error(_slice(full, name, run), value, float(full.abs().max()))
            assert err <= STEP_TOL, (name, err)
    # equal shards: the global loss is the mean of the ranks' losses
    loss_a = sum(r["loss3"] for r in a) / len(a)
    loss_b = sum(r["loss3"] for r in b) / len(b)
    assert abs(loss_b - loss_a) <= LOSS_TOL * abs(loss_a), (loss_a, loss_b)
    metadata = b[0]["metadata"]
    assert metadata["step"] == 2 and len(metadata["losses"]) == 2
    assert metadata["layout"]["world_size"] == len(a)
    assert metadata["layout"]["expert_parallel_size"] == a[0]["P"]
    assert metadata["layout"]["num_experts"] == CONFIG.num_experts


@pytest.mark.timeout(150)
def test_save_replaces_whole_and_leaves_no_temporary(runs):
    root = runs["root"]
    metadata = read_moda_metadata(root / "w4p2")
    # the step-2 save replaced the step-1 one; rank 0's metadata, rng state included
    assert metadata["step"] == 2
    assert torch.equal(metadata["rng"], runs["train w4p2"][0]["metadata"]["rng"])
    assert metadata["layout"] == {"world_size": 4, "expert_parallel_size": 2,
                                  "num_experts": 4,
                                  "experts_per_layer": {"blocks.0.moe": 4, "blocks.1.moe": 4}}
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]
    files = sorted(p.name for p in (root / "w4p2").iterdir())
    assert files == [".metadata", *(f"__{r}_0.distcp" for r in range(4)), RECORD_FILE]


@pytest.mark.timeout(150)
def test_checkpoint_of_another_model_is_refused_naming_the_path(runs):
    root = runs["root"]
    for rank in runs["mismatch"]:
        assert rank["path"] == root / "other"
        assert str(root / "other") in rank["error"] and "experts_per_layer" in rank["error"]
    model = build_model()
    with pytest.raises(CheckpointMismatchError, match="blocks.0.moe.experts.w1_EDF") as info:
        load_module_checkpoint(root / "other", model, make_optimizer(model))
    assert str(root / "other") in str(info.value)
    # nothing was loaded into the model
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), build_model().parameters()))


def test_missing_and_garbage_directories_are_refused(tmp_path):
    model = build_model()
    missing = tmp_path / "absent"
    with pytest.raises(CheckpointNotFoundError, match=str(missing)):
        read_moda_metadata(missing)
    with pytest.raises(CheckpointNotFoundError, match=str(missing)):
        load_module_checkpoint(missing, model, make_optimizer(model))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(CorruptCheckpointError, match=str(garbage)):
        read_moda_metadata(garbage)
    (garbage / RECORD_FILE).write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CorruptCheckpointError, match=f"{garbage}.*unreadable"):
        load_module_checkpoint(garbage, model, make_optimizer(model))
    # a directory that is not a checkpoint is never replaced by a save
    (garbage / RECORD_FILE).unlink()
    with pytest.raises(CheckpointError, match="not a furnace hybrid checkpoint"):
        save_module_checkpoint(garbage, model, make_optimizer(model), metadata={})
    assert (garbage / "notes.txt").read_text() == "not a checkpoint"
