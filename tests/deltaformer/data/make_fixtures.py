"""Writes the checkpoint fixtures of `tests/deltaformer/cli_bad_inputs.py` (DeltaFormer
trainer, Xu et al., NeurIPS 2025; checkpoint rules of `furnace.deltaformer.train`).

    .venv/bin/python tests/deltaformer/data/make_fixtures.py

- ``tiny.pt``: a finished 2-step run of `TINY` (a valid checkpoint of this version);
- ``truncated.pt``: its first half, as a full disk or a kill mid-write would leave it;
- ``garbage.pt``: text, not a torch file;
- ``foreign.pt``: a torch file of tensors without the trainer's format tag;
- ``future_version.pt``: the trainer's tag with a version this furnace does not read.

Rerun it when `CHECKPOINT_VERSION` or `TrainConfig` changes; `test_checkpoints.py` checks
that ``tiny.pt`` still loads and holds `TINY`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from furnace.deltaformer.train import CHECKPOINT_FORMAT, TrainConfig, train

DATA = Path(__file__).resolve().parent
# the smallest run the CLI can express: d_model 4 over 2 heads keeps rotary's even width
TINY = dict(task="swap", d_model=4, num_heads=2, num_layers=1, length=4, steps=2,
            batch_size=2, eval_sequences=2)
# the same run as `furnace deltaformer train` flags (everything else at its default)
TINY_ARGV = ["--task", "swap", "--d-model", "4", "--num-heads", "2", "--num-layers", "1",
             "--length", "4", "--steps", "2", "--batch-size", "2", "--eval-sequences", "2"]


def main() -> None:
    tiny = DATA / "tiny.pt"
    train(TrainConfig(**TINY, checkpoint=tiny), overwrite=True)
    data = tiny.read_bytes()
    (DATA / "truncated.pt").write_bytes(data[: len(data) // 2])
    (DATA / "garbage.pt").write_bytes(b"this is not a checkpoint\n")
    torch.save({"model": {"weight": torch.zeros(2)}, "step": 1}, DATA / "foreign.pt")
    torch.save({"format": CHECKPOINT_FORMAT, "version": 999}, DATA / "future_version.pt")


if __name__ == "__main__":
    main()
