"""Bad inputs for `furnace decentralized train | simulate`; `tests/test_cli_contract.py`
runs them.

Each case is (id, argv after `furnace`): a value argparse refuses, a config field that
`RunConfig` / `PolicyConfig` / `HeteroConfig` / `SimConfig` / `CommCosts` refuses (the CLI
names the flag that set it), or an output path that cannot be written. Every one must be
refused before a rank (or the simulator) starts.
"""

from __future__ import annotations

from pathlib import Path

_TRAIN = ["decentralized", "train"]
_SIM = ["decentralized", "simulate"]
# a folder where a file should go: no file can be written at this path
_FOLDER = str(Path(__file__).parent)

BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("train-slow-factor-zero", [*_TRAIN, "--slow", "0:0"]),
    ("train-label-alpha-zero", [*_TRAIN, "--label-alpha", "0"]),
    ("train-label-alpha-negative", [*_TRAIN, "--label-alpha", "-1"]),
    ("train-max-staleness-zero", [*_TRAIN, "--max-staleness", "0"]),
    ("train-slow-factor-below-one", [*_TRAIN, "--slow", "1:0.5"]),
    ("train-slow-rank-outside-world", [*_TRAIN, "--ranks", "4", "--slow", "4:2"]),
    ("train-slow-malformed", [*_TRAIN, "--slow", "1"]),
    ("train-slow-rank-twice", [*_TRAIN, "--slow", "1:2", "--slow", "1:3"]),
    ("train-group-larger-than-world", [*_TRAIN, "--group-size", "5", "--ranks", "4"]),
    ("train-one-rank", [*_TRAIN, "--ranks", "1"]),
    ("train-ranks-beyond-local", [*_TRAIN, "--ranks", "9"]),
    ("train-unknown-policy", [*_TRAIN, "--policy", "bogus"]),
    ("train-unknown-mode", [*_TRAIN, "--mode", "bogus"]),
    ("train-unknown-backend", [*_TRAIN, "--backend", "nccl"]),
    ("train-precreated-needs-static", [*_TRAIN, "--backend", "precreated",
                                       "--policy", "random"]),
    ("train-too-many-divisions", [*_TRAIN, "--divisions", "3", "--ranks", "4",
                                  "--policy", "division"]),
    ("train-grid-rows-not-dividing", [*_TRAIN, "--grid-rows", "3", "--ranks", "4",
                                      "--policy", "static"]),
    ("train-transient-probability-above-one", [*_TRAIN, "--transient", "2:3"]),
    ("train-transient-factor-below-one", [*_TRAIN, "--transient", "0.1:0.5"]),
    ("train-transient-malformed", [*_TRAIN, "--transient", "0.1"]),
    ("train-slow-link-rate-zero", [*_TRAIN, "--slow-link", "0:0"]),
    ("train-slow-link-rank-outside-world", [*_TRAIN, "--ranks", "4", "--slow-link", "4:50"]),
    ("train-duration-zero", [*_TRAIN, "--duration", "0"]),
    ("train-lr-zero", [*_TRAIN, "--lr", "0"]),
    ("train-momentum-one", [*_TRAIN, "--momentum", "1"]),
    ("train-compute-negative", [*_TRAIN, "--compute-ms", "-1"]),
    ("train-group-size-one", [*_TRAIN, "--group-size", "1"]),
    ("train-max-steps-zero", [*_TRAIN, "--max-steps", "0"]),
    ("train-timeout-zero", [*_TRAIN, "--timeout", "0"]),
    ("train-trace-in-missing-folder", [*_TRAIN, "--trace", "/nonexistent_dir/x.json"]),
    ("train-json-is-a-folder", [*_TRAIN, "--json", _FOLDER]),
    ("simulate-one-worker", [*_SIM, "--workers", "1"]),
    ("simulate-too-many-workers", [*_SIM, "--workers", "2000"]),
    ("simulate-unknown-mode", [*_SIM, "--mode", "bogus"]),
    ("simulate-unknown-policy", [*_SIM, "--policy", "bogus"]),
    ("simulate-group-larger-than-world", [*_SIM, "--workers", "16", "--group-size", "20"]),
    ("simulate-too-many-divisions", [*_SIM, "--workers", "16", "--policy", "division",
                                     "--divisions", "9"]),
    ("simulate-grid-rows-not-dividing", [*_SIM, "--workers", "16", "--policy", "static",
                                         "--grid-rows", "3"]),
    ("simulate-compute-zero", [*_SIM, "--compute-ms", "0"]),
    ("simulate-jitter-negative", [*_SIM, "--jitter", "-1"]),
    ("simulate-slow-rank-outside-world", [*_SIM, "--workers", "16", "--slow", "16:2"]),
    ("simulate-slow-factor-zero", [*_SIM, "--slow", "0:0"]),
    ("simulate-slow-malformed", [*_SIM, "--slow", "x"]),
    ("simulate-slow-rank-twice", [*_SIM, "--slow", "1:2", "--slow", "1:3"]),
    ("simulate-model-negative", [*_SIM, "--model-mb", "-1"]),
    ("simulate-bandwidth-zero", [*_SIM, "--bandwidth-gbps", "0"]),
    ("simulate-latency-negative", [*_SIM, "--latency-us", "-1"]),
    ("simulate-ranks-per-node-not-dividing", [*_SIM, "--workers", "16",
                                              "--ranks-per-node", "3"]),
    ("simulate-intra-bandwidth-zero", [*_SIM, "--intra-gbps", "0"]),
    ("simulate-pair-overhead-negative", [*_SIM, "--pair-overhead-ms", "-1"]),
    ("simulate-duration-zero", [*_SIM, "--duration", "0"]),
    ("simulate-trace-in-missing-folder", [*_SIM, "--trace", "/nonexistent_dir/x.json"]),
    ("simulate-json-is-a-folder", [*_SIM, "--json", _FOLDER]),
]
