"""Tests for the DeltaFormer training loop (Xu et al., NeurIPS 2025, Sec. 4.1 swap task and the LM
recipe of design note Sec. 7): a tiny run learns, and checkpoint + resume reproduces an
uninterrupted run exactly."""

from __future__ import annotations

import importlib

import pytest
import torch

from furnace.deltaformer import TrainConfig, train
from furnace.deltaformer.train import TrainDataError, train_many

# the module, not the `train` function the package exports under the same name
train_module = importlib.import_module("furnace.deltaformer.train")


def _tiny(**kw) -> TrainConfig:
    base = dict(task="swap", d_model=16, num_layers=1, num_heads=2, steps=30, batch_size=32,
                eval_sequences=64)
    return TrainConfig(**{**base, **kw})


def test_tiny_swap_run_lowers_the_loss_and_reports_accuracies():
    result = train(_tiny())
    assert len(result.losses) == 30
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5
    assert 0 <= result.token_acc <= 1 and 0 <= result.last_acc <= 1
    assert result.val_loss is None and result.seconds > 0


def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path):
    straight = train(_tiny(steps=20))
    ckpt = tmp_path / "run.pt"
    first = train(_tiny(steps=20, checkpoint=ckpt, checkpoint_every=5), stop_at=10)
    assert first.steps_done == 10 and first.last_acc is None and ckpt.exists()
    torch.manual_seed(12345)  # resume must not depend on the caller's global RNG
    resumed = train(_tiny(steps=20, checkpoint=ckpt, checkpoint_every=5), resume=True)
    assert resumed.steps_done == 20
    assert resumed.losses == straight.losses
    assert (resumed.token_acc, resumed.last_acc) == (straight.token_acc, straight.last_acc)


def test_training_leaves_the_callers_rng_alone_and_reports_each_step():
    torch.manual_seed(1)
    state = torch.get_rng_state()
    seen = []
    result = train(_tiny(steps=4), progress=lambda step, metrics: seen.append((step, metrics)))
    # the model is initialised in a forked RNG seeded with config.seed
    assert torch.equal(torch.get_rng_state(), state)
    assert [step for step, _ in seen] == [1, 2, 3, 4]
    assert [m["loss"] for _, m in seen] == result.losses
    assert [m["lr"] for _, m in seen] == result.lrs
    torch.manual_seed(2)
    assert train(_tiny(steps=4)).losses == result.losses


def test_tiny_lm_run_reports_validation_loss():
    result = train(TrainConfig(task="lm", mixer="attention", d_model=16, num_heads=2,
                               length=16, steps=3, batch_size=4, eval_sequences=20,
                               corpus_bytes=200_000))
    assert result.token_acc is None and 0 < result.val_loss < 10


def test_longer_evaluation_lengths_are_reported_and_the_training_length_matches():
    result = train(_tiny(task="parity", eval_lengths=(16, 40)))
    assert set(result.last_acc_at) == {16, 40}
    # the same fresh sequences at the training length: the same accuracy
    assert result.last_acc_at[16] == result.last_acc
    assert 0 <= result.last_acc_at[40] <= 1


def test_a_run_whose_loss_is_not_finite_stops_and_says_where():
    # unnormalised linear kappa1 over 128 positions: u overflows in the first forward
    result = train(_tiny(task="parity", length=128, d_model=32, num_heads=1, kappa1="linear",
                         steps=5, eval_sequences=8))
    assert result.diverged_at == 1 and result.losses == [] and result.steps_done == 0
    assert result.last_acc is None and result.token_acc is None


def test_train_many_in_processes_equals_training_one_by_one():
    configs = [_tiny(steps=8), _tiny(steps=8, mixer="attention", seed=1)]
    serial = train_many(configs, workers=1)  # in this process, one thread, one by one
    parallel = train_many(configs, workers=2)
    for one, other in zip(serial, parallel, strict=True):
        assert one.config == other.config
        assert one.losses == other.losses
        assert (one.token_acc, one.last_acc) == (other.token_acc, other.last_acc)
    with pytest.raises(ValueError, match="workers"):
        train_many(configs, workers=0)


@pytest.mark.parametrize("kw", [dict(task="nope"), dict(steps=0), dict(num_heads=3),
                                dict(kappa1="bogus"), dict(lr=-1.0), dict(eval_lengths=(0,)),
                                dict(task="lm", eval_lengths=(32,))])
def test_bad_config_raises(kw):
    with pytest.raises(ValueError):
        _tiny(**kw)


@pytest.mark.parametrize("stop_at", [0, -1, 2.5, True])
def test_bad_stop_at_raises(stop_at):
    with pytest.raises(ValueError, match="stop_at"):
        train(_tiny(steps=2), stop_at=stop_at)


def test_an_lm_context_longer_than_a_split_is_refused_before_training(monkeypatch):
    def refuse(config):
        raise AssertionError("a model was built before the data was checked")

    monkeypatch.setattr(train_module, "build_model", refuse)
    config = TrainConfig(task="lm", mixer="attention", d_model=16, num_heads=2, length=100_000,
                         steps=1, batch_size=1, eval_sequences=1, corpus_bytes=200_000)
    with pytest.raises(TrainDataError, match="split .* is shorter than one window"):
        train(config)


def test_the_cli_reports_data_that_cannot_serve_the_config_as_a_length_error(monkeypatch,
                                                                            capsys):
    from furnace.cli import main

    def short(config, generator):
        raise TrainDataError("the validation split (10 bytes) is shorter than one window")

    monkeypatch.setattr(train_module, "_Batches", short)
    rc = main(["deltaformer", "train", "--task", "lm", "--length", "64", "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--length" in err
