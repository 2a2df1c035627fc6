"""Tests for the checkpoint rules of the DeltaFormer trainer (Xu et al., NeurIPS 2025; the
training recipes of design note Sec. 7), in the library (`train`) and the CLI
(`furnace deltaformer train`): no silent overwrite, no silent fresh start, the config stored
and checked on resume, extension of ``steps`` by a second OneCycle cycle, one clear error for
a corrupt file, atomic writes, and every check before any training.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from furnace.cli import main
from furnace.deltaformer.train import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TrainConfig,
    load_checkpoint,
    train,
)
from furnace.runtime.atomic import OutputError
from furnace.runtime.testing import assert_close

from .cli_bad_inputs import BAD_INPUTS
from .cli_bad_inputs import TINY_ARGV as TABLE_TINY_ARGV

DATA = Path(__file__).resolve().parent / "data"


def _fixture_script():
    # data/ is not a package (the central contract test reads it by path only)
    spec = importlib.util.spec_from_file_location("deltaformer_make_fixtures",
                                                  DATA / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the module, not the `train` function the package exports under the same name
train_module = importlib.import_module("furnace.deltaformer.train")
FIXTURES = _fixture_script()
TINY, TINY_ARGV = FIXTURES.TINY, FIXTURES.TINY_ARGV


def _tiny(**kw) -> TrainConfig:
    base = dict(task="swap", d_model=8, num_layers=1, num_heads=2, steps=12, batch_size=8,
                eval_sequences=16, length=8)
    return TrainConfig(**{**base, **kw})


@pytest.fixture
def no_training(monkeypatch):
    """Makes building a model fail: a check that passes this fixture ran before training."""

    def refuse(config):
        raise AssertionError("a model was built: the check ran after training started")

    monkeypatch.setattr(train_module, "build_model", refuse)


def _one_line_error(capsys, argv) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2, (rc, captured.err)
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


# ---- overwriting ----------------------------------------------------------------------------


def test_a_fresh_run_refuses_an_existing_checkpoint_unless_overwrite(tmp_path):
    ckpt = tmp_path / "run.pt"
    train(_tiny(steps=3, checkpoint=ckpt))
    before = ckpt.read_bytes()
    with pytest.raises(CheckpointExistsError, match="run.pt.*exists"):
        train(_tiny(steps=3, seed=1, checkpoint=ckpt))
    assert ckpt.read_bytes() == before
    replaced = train(_tiny(steps=3, seed=1, checkpoint=ckpt), overwrite=True)
    state = load_checkpoint(ckpt)
    assert state["config"]["seed"] == 1 and state["losses"] == replaced.losses


def test_the_cli_refuses_an_existing_checkpoint_unless_overwrite(tmp_path, capsys):
    ckpt = tmp_path / "run.pt"
    argv = ["deltaformer", "train", *TINY_ARGV, "--checkpoint", str(ckpt)]
    assert main(argv) == 0
    before = ckpt.read_bytes()
    capsys.readouterr()
    line = _one_line_error(capsys, argv)
    assert "--checkpoint" in line and "--overwrite" in line and str(ckpt) in line
    assert ckpt.read_bytes() == before
    assert main([*argv, "--seed", "3", "--overwrite"]) == 0
    assert load_checkpoint(ckpt)["config"]["seed"] == 3


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="exclude"):
        train(_tiny(checkpoint=tmp_path / "run.pt"), resume=True, overwrite=True)
    with pytest.raises(ValueError, match="checkpoint"):
        train(_tiny(), resume=True)


# ---- a missing checkpoint on resume -----------------------------------------------------------


def test_resume_from_a_missing_file_raises_before_training(tmp_path, no_training):
    with pytest.raises(CheckpointNotFoundError, match="missing.pt.*does not exist"):
        train(_tiny(checkpoint=tmp_path / "missing.pt"), resume=True)
    assert not (tmp_path / "missing.pt").exists()


# ---- the stored config -------------------------------------------------------------------------


def test_the_checkpoint_stores_the_config_and_format(tmp_path):
    ckpt = tmp_path / "run.pt"
    config = _tiny(steps=3, lr=2e-3, checkpoint=ckpt)
    train(config)
    state = load_checkpoint(ckpt)
    assert (state["format"], state["version"]) == (CHECKPOINT_FORMAT, CHECKPOINT_VERSION)
    assert state["config"]["lr"] == 2e-3 and state["config"]["d_model"] == 8
    assert state["config"]["checkpoint"] == str(ckpt)
    assert state["cycles"] == [3] and state["step"] == 3 and len(state["lrs"]) == 3


@pytest.mark.parametrize("change,fields", [
    (dict(lr=1e-3), ["lr"]),
    (dict(seed=1), ["seed"]),
    (dict(lr=1e-3, seed=1), ["lr", "seed"]),
    (dict(d_model=16), ["d_model"]),
    (dict(mixer="attention"), ["mixer"]),
    (dict(kappa1="softmax"), ["kappa1"]),
    (dict(batch_size=4), ["batch_size"]),
    (dict(steps=11), ["steps"]),
])
def test_resume_with_another_config_names_each_difference(tmp_path, change, fields,
                                                          no_training):
    ckpt = tmp_path / "run.pt"
    state = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
             "config": train_module._config_record(_tiny(checkpoint=ckpt)), "cycles": [12],
             "model": {}, "optimizer": {}, "scheduler": {}, "generator": torch.zeros(1),
             "torch_rng": torch.zeros(1), "losses": [], "lrs": [], "step": 0, "seconds": 0.0}
    torch.save(state, ckpt)
    with pytest.raises(CheckpointMismatchError) as info:
        train(_tiny(checkpoint=ckpt, **change), resume=True)
    assert [name for name, _, _ in info.value.differences] == fields
    message = str(info.value)
    assert str(ckpt) in message and "\n" not in message
    for name, old, new in info.value.differences:
        assert f"{name} {old!r} (checkpoint) vs {new!r} (now)" in message
    if "steps" in fields:
        assert "not shrink" in message


def test_where_checkpoints_go_and_what_is_evaluated_may_change_on_resume(tmp_path):
    ckpt = tmp_path / "run.pt"
    straight = train(_tiny(task="parity", steps=6))
    train(_tiny(task="parity", steps=6, checkpoint=ckpt, checkpoint_every=2), stop_at=4)
    moved = tmp_path / "moved.pt"
    ckpt.rename(moved)
    resumed = train(_tiny(task="parity", steps=6, checkpoint=moved, checkpoint_every=3,
                          eval_sequences=16, eval_lengths=(24,)), resume=True)
    assert resumed.losses == straight.losses
    assert resumed.last_acc == straight.last_acc and set(resumed.last_acc_at) == {24}


def test_the_cli_names_the_flags_and_both_values_on_a_mismatch(tmp_path, capsys):
    ckpt = tmp_path / "run.pt"
    assert main(["deltaformer", "train", *TINY_ARGV, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    line = _one_line_error(capsys, ["deltaformer", "train", *TINY_ARGV, "--lr", "0.01",
                                    "--seed", "4", "--checkpoint", str(ckpt), "--resume"])
    assert "--lr 0.003 (checkpoint) vs 0.01 (given)" in line
    assert "--seed 0 (checkpoint) vs 4 (given)" in line


# ---- extending steps ---------------------------------------------------------------------------


def _one_cycle_lrs(lr: float, total: int) -> list[float]:
    """The learning rates of a fresh OneCycle schedule over ``total`` steps, step by step."""
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_extending_steps_appends_a_second_one_cycle_cycle_deterministically(tmp_path):
    first, copy = tmp_path / "a.pt", tmp_path / "b.pt"
    original = train(_tiny(steps=8, checkpoint=first))
    copy.write_bytes(first.read_bytes())
    extended = train(_tiny(steps=12, checkpoint=first), resume=True)
    again = train(_tiny(steps=12, checkpoint=copy), resume=True)
    # the definition: steps 1..8 are the original run, 9..12 a fresh OneCycle over 4 steps
    assert extended.lr_cycles == [8, 12] and extended.steps_done == 12
    assert extended.losses[:8] == original.losses and extended.lrs[:8] == original.lrs
    # the same float operations in the same order: equal, not close
    assert extended.lrs[8:] == _one_cycle_lrs(3e-3, 4)
    # deterministic: the same checkpoint extended twice gives the same run
    assert extended.losses == again.losses and extended.last_acc == again.last_acc
    # and it is not the run a fresh 12-step schedule gives (README says so)
    assert extended.lrs != train(_tiny(steps=12)).lrs
    assert load_checkpoint(first)["cycles"] == [8, 12]


def test_extending_from_a_mid_run_checkpoint_equals_finishing_then_extending(tmp_path):
    mid, end = tmp_path / "mid.pt", tmp_path / "end.pt"
    train(_tiny(steps=8, checkpoint=mid), stop_at=5)
    train(_tiny(steps=8, checkpoint=end))
    from_mid = train(_tiny(steps=12, checkpoint=mid, checkpoint_every=2), resume=True)
    from_end = train(_tiny(steps=12, checkpoint=end), resume=True)
    assert from_mid.lr_cycles == from_end.lr_cycles == [8, 12]
    assert from_mid.losses == from_end.losses and from_mid.lrs == from_end.lrs
    assert (from_mid.token_acc, from_mid.last_acc) == (from_end.token_acc, from_end.last_acc)


def test_an_extended_run_resumed_inside_its_second_cycle_is_exact(tmp_path):
    ckpt, straight_ckpt = tmp_path / "run.pt", tmp_path / "straight.pt"
    train(_tiny(steps=6, checkpoint=ckpt))
    train(_tiny(steps=6, checkpoint=straight_ckpt))
    straight = train(_tiny(steps=10, checkpoint=straight_ckpt), resume=True)
    train(_tiny(steps=10, checkpoint=ckpt), resume=True, stop_at=8)
    assert load_checkpoint(ckpt)["step"] == 8
    resumed = train(_tiny(steps=10, checkpoint=ckpt), resume=True)
    assert resumed.losses == straight.losses and resumed.lrs == straight.lrs


def test_the_cli_says_when_it_extends_a_run(tmp_path, capsys):
    ckpt, out = tmp_path / "run.pt", tmp_path / "result.json"
    assert main(["deltaformer", "train", *TINY_ARGV, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    argv = ["deltaformer", "train", *TINY_ARGV, "--steps", "4", "--checkpoint", str(ckpt),
            "--resume", "--json", str(out)]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "resuming" in printed and "second OneCycle cycle" in printed
    result = json.loads(out.read_text())
    assert result["lr_cycles"] == [2, 4] and result["steps_done"] == 4


# ---- corrupt checkpoints -----------------------------------------------------------------------


def _valid_state(tmp_path) -> dict:
    ckpt = tmp_path / "valid.pt"
    train(_tiny(steps=2, checkpoint=ckpt))
    return torch.load(ckpt, weights_only=True)


class _Foreign:
    pass


@pytest.mark.parametrize("kind", ["garbage", "empty", "truncated", "foreign-tensors",
                                  "foreign-object", "no-version", "future-version",
                                  "missing-key", "inconsistent", "wrong-model"])
def test_a_corrupt_checkpoint_raises_one_error_naming_the_file(tmp_path, kind):
    ckpt = tmp_path / f"{kind}.pt"
    state = _valid_state(tmp_path)
    if kind == "garbage":
        ckpt.write_bytes(b"\x00\x01 definitely not a zip archive")
    elif kind == "empty":
        ckpt.write_bytes(b"")
    elif kind == "truncated":
        data = (tmp_path / "valid.pt").read_bytes()
        ckpt.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "foreign-tensors":
        torch.save({"weight": torch.ones(3)}, ckpt)
    elif kind == "foreign-object":
        torch.save({"format": CHECKPOINT_FORMAT, "thing": _Foreign()}, ckpt)
    elif kind == "no-version":
        torch.save({k: v for k, v in state.items() if k != "version"}, ckpt)
    elif kind == "future-version":
        torch.save({**state, "version": CHECKPOINT_VERSION + 1}, ckpt)
    elif kind == "missing-key":
        torch.save({k: v for k, v in state.items() if k != "optimizer"}, ckpt)
    elif kind == "inconsistent":
        torch.save({**state, "losses": state["losses"][:1]}, ckpt)
    elif kind == "wrong-model":
        torch.save({**state, "model": {"nonsense": torch.zeros(2)}}, ckpt)
    with pytest.raises(CorruptCheckpointError) as info:
        train(_tiny(steps=2, checkpoint=ckpt), resume=True)
    message = str(info.value)
    assert str(ckpt) in message and "\n" not in message and info.value.path == ckpt


def test_the_fixtures_are_what_the_bad_input_table_says(capsys):
    """data/tiny.pt is a valid checkpoint of TINY; the corrupt fixtures raise the error."""
    assert TABLE_TINY_ARGV == TINY_ARGV
    state = load_checkpoint(DATA / "tiny.pt")
    train_module.check_resumable(TrainConfig(**TINY), state, DATA / "tiny.pt")
    for name in ("garbage.pt", "truncated.pt", "foreign.pt", "future_version.pt"):
        with pytest.raises(CorruptCheckpointError):
            load_checkpoint(DATA / name)


def test_a_checkpoint_written_before_the_shared_loop_still_resumes(tmp_path):
    """data/tiny.pt predates `furnace.runtime.training`; the loop extends it like its own."""
    old, new = tmp_path / "old.pt", tmp_path / "new.pt"
    old.write_bytes((DATA / "tiny.pt").read_bytes())
    train(TrainConfig(**TINY, checkpoint=new))
    from_old = train(TrainConfig(**{**TINY, "steps": 4}, checkpoint=old), resume=True)
    from_new = train(TrainConfig(**{**TINY, "steps": 4}, checkpoint=new), resume=True)
    assert from_old.lr_cycles == [2, 4] and from_old.steps_done == 4
    assert from_old.losses[:2] == load_checkpoint(DATA / "tiny.pt")["losses"]
    assert from_old.lrs == from_new.lrs
    # the fixture was written on another machine, whose float rounding may differ a little
    assert_close("losses", torch.tensor(from_new.losses), torch.tensor(from_old.losses),
                 ratio=1e-4)


# ---- writable folder and atomic writes -----------------------------------------------------


def test_an_unwritable_checkpoint_folder_is_found_before_training(tmp_path, no_training):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(OutputError):
        train(_tiny(checkpoint=blocker / "run.pt"))
    with pytest.raises(OutputError, match="folder"):
        train(_tiny(checkpoint=tmp_path))


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    ckpt = tmp_path / "run.pt"
    train(_tiny(steps=6, checkpoint=ckpt), stop_at=3)
    before = ckpt.read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OutputError, match="run.pt"):
        train(_tiny(steps=6, checkpoint=ckpt), resume=True)
    monkeypatch.setattr(torch, "save", real_save)
    assert ckpt.read_bytes() == before and load_checkpoint(ckpt)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]  # no temporary left


# ---- the CLI's bad inputs ----------------------------------------------------------------------


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


@pytest.mark.parametrize("case,argv", BAD_INPUTS, ids=[case for case, _ in BAD_INPUTS])
def test_every_bad_input_exits_2_with_one_line_naming_its_flag(case, argv, capsys, no_training,
                                                               monkeypatch):
    from furnace.deltaformer import bench

    def no_bench(*args, **kwargs):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench, "bench_kernels", no_bench)
    before = _digest(DATA)
    line = _one_line_error(capsys, argv)
    assert any(token in line for token in argv[2:]), line
    assert _digest(DATA) == before  # the fixtures are read, never written
