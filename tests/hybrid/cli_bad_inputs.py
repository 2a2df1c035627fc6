"""Bad inputs for `furnace hybrid` (plan, train); `tests/test_cli_contract.py` runs them all.

Each case is (id, argv after `furnace`).
"""

from __future__ import annotations

from pathlib import Path

_FILE = str(Path(__file__))  # a path that exists and is a file, not a folder

BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("plan-unknown-machine", ["hybrid", "plan", "--machine", "frontier"]),
    ("plan-params-garbage", ["hybrid", "plan", "--params", "lots"]),
    ("plan-params-unknown-suffix", ["hybrid", "plan", "--params", "14.5X"]),
    ("plan-params-zero", ["hybrid", "plan", "--params", "0"]),
    ("plan-nodes-zero", ["hybrid", "plan", "--nodes", "0"]),
    ("plan-nodes-huge", ["hybrid", "plan", "--nodes", "100000000"]),
    ("plan-nodes-not-a-number", ["hybrid", "plan", "--nodes", "many"]),
    ("plan-tokens-zero", ["hybrid", "plan", "--tokens-per-rank", "0"]),
    ("plan-injection-zero", ["hybrid", "plan", "--injection-gbps", "0"]),
    ("plan-injection-nan", ["hybrid", "plan", "--injection-gbps", "nan"]),
    ("plan-top-zero", ["hybrid", "plan", "--top", "0"]),
    ("plan-json-is-a-folder", ["hybrid", "plan", "--json", str(Path(_FILE).parent)]),
    ("plan-json-under-a-file", ["hybrid", "plan", "--json", _FILE + "/plan.json"]),
    ("plan-unknown-flag", ["hybrid", "plan", "--param", "14.5T"]),
    ("train-world-size-zero", ["hybrid", "train", "--world-size", "0"]),
    ("train-ep-not-dividing-world", ["hybrid", "train", "--world-size", "4",
                                     "--expert-parallel-size", "3"]),
    ("train-ep-not-dividing-experts", ["hybrid", "train", "--world-size", "4",
                                       "--expert-parallel-size", "4", "--num-experts", "6"]),
    ("train-ep-straddles-node", ["hybrid", "train", "--world-size", "4",
                                 "--expert-parallel-size", "4", "--ranks-per-node", "3"]),
    ("train-batch-not-divisible", ["hybrid", "train", "--world-size", "4", "--batch-size", "6"]),
    ("train-heads-not-dividing", ["hybrid", "train", "--d-model", "16", "--num-heads", "3"]),
    ("train-unknown-precision", ["hybrid", "train", "--precision", "fp8"]),
    ("train-lr-zero", ["hybrid", "train", "--lr", "0"]),
    ("train-resume-without-checkpoint", ["hybrid", "train", "--resume"]),
    ("train-every-without-checkpoint", ["hybrid", "train", "--checkpoint-every", "2"]),
    ("train-resume-missing-checkpoint", ["hybrid", "train", "--resume", "--checkpoint",
                                         str(Path(_FILE).parent / "no-such-checkpoint")]),
    ("train-checkpoint-is-a-file", ["hybrid", "train", "--checkpoint", _FILE]),
    ("train-switch-top-2", ["hybrid", "train", "--gate", "switch", "--top-k", "2"]),
    ("validate-unknown-flag", ["hybrid", "validate", "--ranks", "8"]),
]
