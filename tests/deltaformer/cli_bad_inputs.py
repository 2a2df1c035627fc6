"""Bad inputs of `furnace deltaformer train` and `bench` (DeltaFormer, Xu et al., NeurIPS 2025;
the CLI contract of `furnace.runtime.cliargs`): each case must exit 2 with one line on
stderr naming its flag, before any training or timing.

`BAD_INPUTS` holds ``(case_id, argv)`` with argv as it follows ``furnace``. The checkpoint
cases read the fixtures under ``data/`` (written by ``data/make_fixtures.py``); none of
them gets far enough to write there.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TINY = str(DATA / "tiny.pt")
# the flags of the run that wrote data/tiny.pt (data/make_fixtures.py's TINY_ARGV)
TINY_ARGV = ["--task", "swap", "--d-model", "4", "--num-heads", "2", "--num-layers", "1",
             "--length", "4", "--steps", "2", "--batch-size", "2", "--eval-sequences", "2"]

TRAIN = ["deltaformer", "train"]
BENCH = ["deltaformer", "bench"]

_TRAIN_CASES: list[tuple[str, list[str]]] = [
    ("steps-0", ["--steps", "0"]),
    ("steps-negative", ["--steps", "-5"]),
    ("steps-text", ["--steps", "ten"]),
    ("lr-0", ["--lr", "0"]),
    ("lr-negative", ["--lr", "-0.001"]),
    ("lr-nan", ["--lr", "nan"]),
    ("lr-inf", ["--lr", "inf"]),
    ("weight-decay-negative", ["--weight-decay", "-0.1"]),
    ("batch-size-0", ["--batch-size", "0"]),
    ("length-0", ["--length", "0"]),
    ("num-layers-0", ["--num-layers", "0"]),
    ("num-heads-0", ["--num-heads", "0"]),
    ("d-model-0", ["--d-model", "0"]),
    ("chunk-size-0", ["--chunk-size", "0"]),
    ("eval-sequences-0", ["--eval-sequences", "0"]),
    ("seed-negative", ["--seed", "-1"]),
    ("seed-too-large", ["--seed", str(2**64)]),
    ("threads-negative", ["--threads", "-1"]),
    ("threads-huge", ["--threads", "100000"]),
    ("checkpoint-every-negative", ["--checkpoint-every", "-1"]),
    ("eval-lengths-0", ["--eval-lengths", "0"]),
    ("eval-lengths-negative", ["--eval-lengths", "16", "-3"]),
    ("eval-lengths-text", ["--eval-lengths", "long"]),
    ("task-unknown", ["--task", "sorting"]),
    ("mixer-unknown", ["--mixer", "mamba"]),
    ("beta-activation-unknown", ["--beta-activation", "tanh"]),
    ("kappa1-unknown", ["--kappa1", "exp"]),
    ("kappa1-unknown-in-list", ["--kappa1", "softmax,exp,linear,linear"]),
    # impossible combinations
    ("heads-not-dividing-d-model", ["--d-model", "64", "--num-heads", "3"]),
    ("odd-head-width-with-rotary", ["--d-model", "6", "--num-heads", "2"]),
    ("kappa1-count-not-heads", ["--num-heads", "4", "--kappa1", "softmax,linear,linear"]),
    ("eval-lengths-with-lm", ["--task", "lm", "--eval-lengths", "256"]),
    ("resume-without-checkpoint", ["--resume"]),
    ("overwrite-without-checkpoint", ["--overwrite"]),
    ("checkpoint-every-without-checkpoint", ["--checkpoint-every", "10"]),
    ("resume-and-overwrite", ["--checkpoint", TINY, "--resume", "--overwrite"]),
    ("json-same-as-checkpoint", ["--checkpoint", str(DATA / "run.pt"),
                                 "--json", str(DATA / "run.pt")]),
    # unwritable outputs
    ("checkpoint-folder-missing", ["--checkpoint", str(DATA / "no-such-folder" / "run.pt")]),
    ("checkpoint-is-a-folder", ["--checkpoint", str(DATA)]),
    ("checkpoint-under-a-file", ["--checkpoint", str(DATA / "garbage.pt" / "run.pt")]),
    ("json-folder-missing", ["--json", str(DATA / "no-such-folder" / "result.json")]),
    ("json-is-a-folder", ["--json", str(DATA)]),
    # checkpoints: an existing one without --overwrite, and unusable ones on --resume
    ("checkpoint-exists-without-overwrite", [*TINY_ARGV, "--checkpoint", TINY]),
    ("resume-missing-file", ["--checkpoint", str(DATA / "no-such-run.pt"), "--resume"]),
    ("resume-garbage", [*TINY_ARGV, "--checkpoint", str(DATA / "garbage.pt"), "--resume"]),
    ("resume-truncated", [*TINY_ARGV, "--checkpoint", str(DATA / "truncated.pt"), "--resume"]),
    ("resume-not-furnace", [*TINY_ARGV, "--checkpoint", str(DATA / "foreign.pt"), "--resume"]),
    ("resume-future-version", [*TINY_ARGV, "--checkpoint", str(DATA / "future_version.pt"),
                               "--resume"]),
    # a resumed run with settings other than the checkpoint's
    ("resume-other-lr", [*TINY_ARGV, "--lr", "0.1", "--checkpoint", TINY, "--resume"]),
    ("resume-other-seed", [*TINY_ARGV, "--seed", "7", "--checkpoint", TINY, "--resume"]),
    ("resume-other-shape", [*TINY_ARGV, "--d-model", "8", "--checkpoint", TINY, "--resume"]),
    ("resume-no-rotary", [*TINY_ARGV, "--no-rotary", "--checkpoint", TINY, "--resume"]),
    ("resume-fewer-steps", [*TINY_ARGV, "--steps", "1", "--checkpoint", TINY, "--resume"]),
    ("resume-with-the-defaults", ["--checkpoint", TINY, "--resume"]),
]

_BENCH_CASES: list[tuple[str, list[str]]] = [
    ("lengths-0", ["--lengths", "0"]),
    ("lengths-negative", ["--lengths", "128", "-1"]),
    ("lengths-text", ["--lengths", "long"]),
    ("batch-0", ["--batch", "0"]),
    ("heads-0", ["--heads", "0"]),
    ("dim-0", ["--dim", "0"]),
    ("chunk-size-0", ["--chunk-size", "0"]),
    ("repeats-0", ["--repeats", "0"]),
    ("include-naive-up-to-negative", ["--include-naive-up-to", "-1"]),
    ("threads-negative", ["--threads", "-1"]),
    ("threads-text", ["--threads", "all"]),
    ("kappa1-unknown", ["--kappa1", "exp"]),
    ("json-folder-missing", ["--json", str(DATA / "no-such-folder" / "bench.json")]),
    ("json-is-a-folder", ["--json", str(DATA)]),
]

BAD_INPUTS: list[tuple[str, list[str]]] = (
    [(f"deltaformer-train-{name}", [*TRAIN, *argv]) for name, argv in _TRAIN_CASES]
    + [(f"deltaformer-bench-{name}", [*BENCH, *argv]) for name, argv in _BENCH_CASES]
)
