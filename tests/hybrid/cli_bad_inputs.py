"""Bad inputs for `furnace hybrid` (plan); `tests/test_cli_contract.py` runs them all.

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
]
