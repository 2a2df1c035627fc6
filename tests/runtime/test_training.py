"""Tests of the shared training loop (`furnace.runtime.training`): it learns, leaves the
caller's RNGs alone, resumes exactly, refuses to overwrite, names a corrupt file, extends a
run by a warm restart, and calls its progress callback and hooks.

The model is a tiny MLP with dropout regressing a fixed linear map, so a run is fast and
draws from both the batch generator and the (forked) global RNG, which resume must restore.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from furnace.runtime.testing import assert_close
from furnace.runtime.training import (
    CheckpointExistsError,
    CheckpointFormat,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TrainHooks,
    TrainLoopConfig,
    TrainResult,
    load_checkpoint,
    train_loop,
)

FORMAT = CheckpointFormat(tag="furnace.tests.training", version=1,
                          description="a test training checkpoint")
TARGET = torch.linspace(-1.0, 1.0, 8)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))


def _batches(generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        x_BD = torch.randn(16, 8, generator=generator)
        yield x_BD, x_BD @ TARGET


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x_BD, y_B = batch
    return ((model(x_BD).squeeze(-1) - y_B) ** 2).mean()


def _evaluate(model: nn.Module) -> dict[str, float]:
    x_BD = torch.linspace(-1.0, 1.0, 64).reshape(8, 8)
    return {"val": float(_loss(model, (x_BD, x_BD @ TARGET)))}


def _train(steps: int = 40, *, checkpoint: Path | None = None, schedule: str = "one_cycle",
           **kw) -> TrainResult:
    loop_kw = {k: kw.pop(k) for k in ("checkpoint_every", "eval_every", "seed") if k in kw}
    config = TrainLoopConfig(steps=steps, lr=1e-2, schedule=schedule, checkpoint=checkpoint,
                             **loop_kw)
    return train_loop(config, build_model=_model, batches=_batches, loss=_loss,
                      result=TrainResult(), evaluate=_evaluate,
                      checkpoint_format=FORMAT if checkpoint is not None else None, **kw)


def _params(result: TrainResult) -> torch.Tensor:
    assert result.model is not None
    return torch.cat([p.detach().flatten() for p in result.model.parameters()])


def test_the_loop_lowers_the_loss_and_evaluates():
    result = _train(60, eval_every=20)
    assert len(result.losses) == len(result.lrs) == result.steps_done == 60
    assert np.mean(result.losses[-5:]) < 0.5 * np.mean(result.losses[:5])
    assert [step for step, _ in result.eval_history] == [20, 40, 60]
    # the final evaluation is that of the last step, not a second measurement
    assert result.final_metrics == result.eval_history[-1][1]
    assert result.finished and result.model is not None and not result.model.training
    assert result.params == sum(p.numel() for p in _model().parameters())


def test_the_callers_rngs_are_untouched():
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    numpy_state = np.random.get_state()
    first = _train(10, seed=3)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == python_state
    after = np.random.get_state()
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
    # and the run itself does not depend on the caller's RNG
    torch.manual_seed(99)
    assert _train(10, seed=3).losses == first.losses
    assert _train(10, seed=4).losses != first.losses


def test_resume_gives_the_parameters_of_an_uninterrupted_run(tmp_path):
    straight = _train(30)
    ckpt = tmp_path / "run.pt"
    first = _train(30, checkpoint=ckpt, checkpoint_every=5, stop_at=12)
    assert first.steps_done == 12 and not first.finished and first.final_metrics is None
    assert load_checkpoint(ckpt, FORMAT)["step"] == 12
    torch.manual_seed(12345)  # resume must not depend on the caller's global RNG
    resumed = _train(30, checkpoint=ckpt, checkpoint_every=5, resume=True)
    assert resumed.losses == straight.losses and resumed.lrs == straight.lrs
    # same float operations in the same order; the tolerance only guards the comparison
    assert_close("parameters", _params(straight), _params(resumed), ratio=1e-6)


def test_a_fresh_run_refuses_to_overwrite_a_checkpoint(tmp_path):
    ckpt = tmp_path / "run.pt"
    _train(3, checkpoint=ckpt)
    before = ckpt.read_bytes()
    with pytest.raises(CheckpointExistsError, match="run.pt.*exists"):
        _train(3, checkpoint=ckpt, seed=1)
    assert ckpt.read_bytes() == before
    _train(3, checkpoint=ckpt, seed=1, overwrite=True)
    assert load_checkpoint(ckpt, FORMAT)["config"]["seed"] == 1
    with pytest.raises(ValueError, match="exclude"):
        _train(3, checkpoint=ckpt, resume=True, overwrite=True)


def test_resume_needs_the_file_and_the_same_config(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="missing.pt.*does not exist"):
        _train(3, checkpoint=tmp_path / "missing.pt", resume=True)
    ckpt = tmp_path / "run.pt"
    _train(3, checkpoint=ckpt, seed=2)
    with pytest.raises(CheckpointMismatchError) as info:
        _train(3, checkpoint=ckpt, seed=5, resume=True)
    assert info.value.differences == [("seed", 2, 5)]
    assert "seed 2 (checkpoint) vs 5 (now)" in str(info.value)
    with pytest.raises(CheckpointMismatchError, match="not shrink"):
        _train(2, checkpoint=ckpt, seed=2, resume=True)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "other-format", "future-version"])
def test_a_corrupt_checkpoint_is_one_error_naming_the_file(tmp_path, kind):
    good, ckpt = tmp_path / "good.pt", tmp_path / f"{kind}.pt"
    _train(2, checkpoint=good)
    state = torch.load(good, weights_only=True)
    if kind == "garbage":
        ckpt.write_bytes(b"not a checkpoint at all")
    elif kind == "truncated":
        ckpt.write_bytes(good.read_bytes()[:200])
    elif kind == "other-format":
        torch.save({**state, "format": "someone.else"}, ckpt)
    else:
        torch.save({**state, "version": 2}, ckpt)
    with pytest.raises(CorruptCheckpointError) as info:
        _train(2, checkpoint=ckpt, resume=True)
    message = str(info.value)
    assert str(ckpt) in message and "\n" not in message and info.value.path == ckpt


def test_extending_steps_is_a_warm_restart_of_the_schedule(tmp_path):
    ckpt = tmp_path / "run.pt"
    original = _train(8, checkpoint=ckpt)
    extended = _train(12, checkpoint=ckpt, resume=True)
    assert extended.lr_cycles == [8, 12] and extended.losses[:8] == original.losses
    fresh_cycle = _train(4)
    # a second OneCycle cycle over the 4 added steps: its learning rates, not a longer cycle's
    assert extended.lrs[8:] == fresh_cycle.lrs
    assert extended.lrs != _train(12).lrs


def test_progress_gets_every_step_and_its_metrics():
    seen: list[tuple[int, dict[str, float]]] = []
    result = _train(6, eval_every=3, progress=lambda step, metrics: seen.append((step, metrics)))
    assert [step for step, _ in seen] == [1, 2, 3, 4, 5, 6]
    assert [m["loss"] for _, m in seen] == result.losses
    assert [m["lr"] for _, m in seen] == result.lrs
    assert [("val" in m) for _, m in seen] == [False, False, True, False, False, True]


def test_a_constant_schedule_keeps_the_learning_rate():
    assert _train(5, schedule="constant").lrs == [1e-2] * 5


def test_hooks_supply_parameter_groups_and_see_every_backward():
    calls: list[bool] = []
    groups_seen: list[int] = []

    def groups(model: nn.Module) -> list[dict]:
        first, *rest = list(model.parameters())
        groups_seen.append(len(rest) + 1)
        return [{"params": [first], "weight_decay": 0.0}, {"params": rest}]

    def after_backward(model: nn.Module) -> None:
        # gradients exist here: this is where a data-parallel trainer all-reduces them
        calls.append(all(p.grad is not None for p in model.parameters()))

    hooks = TrainHooks(param_groups=groups, after_backward=after_backward)
    plain = _train(4)
    hooked = _train(4, hooks=hooks)
    assert calls == [True] * 4 and groups_seen == [4]
    # a group without weight decay changes the trajectory after the first step
    assert hooked.losses[0] == plain.losses[0] and hooked.losses != plain.losses


def test_skip_step_skips_exactly_those_optimizer_updates():
    # the hook sees the parameters before each step's update: a skipped step leaves them
    # for the next step as they were, and the loss, lr and schedule still count the step
    before: list[torch.Tensor] = []
    skipped = {2, 3}

    def skip_step(model: nn.Module) -> bool:
        before.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        return len(before) in skipped

    result = _train(5, hooks=TrainHooks(skip_step=skip_step))
    after = _params(result)
    changed = [not torch.equal(a, b) for a, b in zip(before, [*before[1:], after])]
    assert changed == [True, False, False, True, True]
    assert result.steps_done == 5 and len(result.losses) == 5 and result.finished
    assert result.lrs == _train(5).lrs


def test_a_loss_that_is_not_finite_stops_the_run_before_any_update():
    def nan_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return _loss(model, batch) * float("nan")

    config = TrainLoopConfig(steps=5, lr=1e-2)
    result = train_loop(config, build_model=_model, batches=_batches, loss=nan_loss,
                        result=TrainResult(), evaluate=_evaluate)
    assert result.diverged_at == 1 and result.losses == [] and result.steps_done == 0
    assert not result.finished and result.final_metrics is None


@pytest.mark.parametrize("kw", [dict(steps=0), dict(lr=0.0), dict(lr=float("inf")),
                                dict(clip=0.0), dict(schedule="cosine"),
                                dict(eval_every=-1)])
def test_bad_loop_configs_raise(kw):
    with pytest.raises(ValueError):
        TrainLoopConfig(**{"steps": 3, "lr": 1e-3, **kw})
