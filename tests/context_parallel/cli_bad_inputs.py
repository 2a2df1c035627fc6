"""Bad inputs for `furnace cp` (plan, bench, simulate); `tests/test_cli_contract.py` runs them.

Each case is (id, argv after `furnace`).
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent
_MASKS = str(_HERE / "bad_masks.py")

BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("plan-unknown-mask", ["cp", "plan", "--mask", "diagonal"]),
    ("plan-mask-of-two-indices", ["cp", "plan", "--mask", _MASKS + ":two_indices"]),
    ("plan-mask-not-boolean", ["cp", "plan", "--mask", _MASKS + ":not_boolean"]),
    ("plan-mask-raises", ["cp", "plan", "--mask", _MASKS + ":raises"]),
    ("plan-mask-missing-function", ["cp", "plan", "--mask", _MASKS + ":nothing"]),
    ("plan-mask-missing-file", ["cp", "plan", "--mask", str(_HERE / "nowhere.py") + ":f"]),
    ("plan-mask-missing-module", ["cp", "plan", "--mask", "no_such_module_xyz:f"]),
    ("plan-seq-shorter-than-ranks", ["cp", "plan", "--seq-len", "3", "--ranks", "4",
                                     "--num-blocks", "4"]),
    ("plan-blocks-not-multiple-of-ranks", ["cp", "plan", "--num-blocks", "6", "--ranks", "4"]),
    ("plan-blocks-more-than-tokens", ["cp", "plan", "--seq-len", "8", "--num-blocks", "16"]),
    ("plan-blocks-leave-empty-block", ["cp", "plan", "--seq-len", "9", "--num-blocks", "4",
                                       "--ranks", "2"]),
    ("plan-kv-heads-not-dividing", ["cp", "plan", "--heads", "4", "--kv-heads", "3"]),
    ("plan-mask-param-zero-window", ["cp", "plan", "--mask", "sliding_window",
                                     "--mask-param", "window=0"]),
    ("plan-mask-param-unknown", ["cp", "plan", "--mask", "causal", "--mask-param", "window=3"]),
    ("plan-mask-param-malformed", ["cp", "plan", "--mask", "streaming", "--mask-param", "sink"]),
    ("plan-mask-param-on-custom-mask", ["cp", "plan", "--mask", _MASKS + ":good_causal",
                                        "--mask-param", "window=3"]),
    ("plan-ranks-zero", ["cp", "plan", "--ranks", "0"]),
    ("plan-ranks-huge", ["cp", "plan", "--ranks", "100000"]),
    ("plan-time-limit-zero", ["cp", "plan", "--time-limit", "0"]),
    ("plan-unknown-dtype", ["cp", "plan", "--dtype", "float8"]),
    ("plan-unknown-granularity", ["cp", "plan", "--granularity", "tile"]),
    ("plan-json-is-a-folder", ["cp", "plan", "--json", str(_HERE)]),
    ("bench-ranks-beyond-local", ["cp", "bench", "--ranks", "16"]),
    ("bench-unknown-scheme", ["cp", "bench", "--schemes", "ring,magic"]),
    ("bench-empty-schemes", ["cp", "bench", "--schemes", ","]),
    ("bench-repeats-too-few", ["cp", "bench", "--repeats", "1"]),
    ("bench-bandwidth-zero", ["cp", "bench", "--bandwidth-mbps", "0"]),
    ("bench-latency-negative", ["cp", "bench", "--latency-ms", "-1"]),
    ("bench-ulysses-heads-not-divisible", ["cp", "bench", "--schemes", "ring,ulysses",
                                           "--heads", "2", "--kv-heads", "2", "--ranks", "4"]),
    ("bench-seq-shorter-than-ranks", ["cp", "bench", "--seq-len", "2", "--ranks", "4"]),
    ("simulate-unknown-preset", ["cp", "simulate", "--preset", "tpu-v5"]),
    ("simulate-ranks-per-node-not-dividing", ["cp", "simulate", "--ranks", "12",
                                              "--ranks-per-node", "8", "--num-blocks", "24"]),
    ("simulate-trace-is-a-folder", ["cp", "simulate", "--trace", str(_HERE)]),
    ("simulate-unknown-mask", ["cp", "simulate", "--mask", "diagonal"]),
]
