"""Bad inputs for the top-level `furnace` commands (info, reproduce, selfcheck, topology).

Each case is (id, argv after `furnace`); `tests/test_cli_contract.py` runs them all.
"""

from __future__ import annotations

from pathlib import Path

_FILE = str(Path(__file__))  # a path that exists and is a file, not a folder

BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("info-unknown-flag", ["info", "--calibrat"]),
    ("reproduce-unknown-system", ["reproduce", "nosuchsystem"]),
    ("reproduce-out-is-a-file", ["reproduce", "--out", _FILE]),
    ("reproduce-out-under-a-file", ["reproduce", "--out", _FILE + "/sub"]),
    ("reproduce-out-unwritable", ["reproduce", "--out", "/proc/furnace-results"]),
    ("selfcheck-world-size-0", ["selfcheck", "--world-size", "0"]),
    ("selfcheck-world-size-negative", ["selfcheck", "--world-size", "-3"]),
    ("selfcheck-world-size-huge", ["selfcheck", "--world-size", "100000"]),
    ("selfcheck-world-size-not-a-number", ["selfcheck", "--world-size", "two"]),
    ("topology-unknown-preset", ["topology", "abacus"]),
]
