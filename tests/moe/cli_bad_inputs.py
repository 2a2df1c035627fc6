"""Bad inputs of `furnace moe bench` and `furnace moe simulate` (FasterMoE, He et al.,
PPoPP'22; the CLI contract of `furnace.runtime.cliargs`): each case must exit 2 with one
line on stderr naming its flag, before any rank is spawned or any step simulated.

`BAD_INPUTS` holds ``(case_id, argv)`` with argv as it follows ``furnace``. The output
cases point at a folder that does not exist or at an existing folder; none of them gets
far enough to write anything.
"""

from __future__ import annotations

from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
MISSING = str(Path(__file__).resolve().parent / "no-such-folder" / "out.json")

BENCH = ["moe", "bench"]
SIMULATE = ["moe", "simulate"]

_BENCH_CASES: list[tuple[str, list[str]]] = [
    ("mode-unknown", ["--mode", "real"]),
    ("world-size-0", ["--world-size", "0"]),
    ("world-size-too-many", ["--world-size", "100"]),
    ("world-size-text", ["--world-size", "four"]),
    ("experts-per-rank-0", ["--experts-per-rank", "0"]),
    ("routing-unknown", ["--routing", "trace"]),
    ("hot-share-2", ["--hot-share", "2"]),
    ("hot-share-negative", ["--hot-share", "-0.1"]),
    ("hot-share-nan", ["--hot-share", "nan"]),
    ("zipf-exponent-negative", ["--zipf-exponent", "-1"]),
    ("zipf-exponent-inf", ["--zipf-exponent", "inf"]),
    ("zipf-exponent-too-large", ["--zipf-exponent", "11"]),
    ("tokens-per-rank-0", ["--tokens-per-rank", "0"]),
    ("tokens-per-rank-text", ["--tokens-per-rank", "many"]),
    # --tokens: the short spelling of --tokens-per-rank
    ("tokens-0", ["--tokens", "0"]),
    ("d-model-0", ["--d-model", "0"]),
    ("d-hidden-0", ["--d-hidden", "0"]),
    ("d-hidden-negative", ["--d-hidden", "-8"]),
    ("top-k-0", ["--top-k", "0"]),
    # 4 ranks x 1 expert by default
    ("top-k-above-experts", ["--top-k", "5"]),
    ("top-k-above-experts-2x2", ["--world-size", "2", "--experts-per-rank", "2",
                                 "--top-k", "5"]),
    ("steps-0", ["--steps", "0"]),
    ("group-size-0", ["--group-size", "0"]),
    ("group-size-not-a-divisor", ["--group-size", "3"]),
    ("group-size-above-ranks", ["--world-size", "2", "--group-size", "4"]),
    ("policies-unknown", ["--policies", "baseline", "magic"]),
    ("policies-empty", ["--policies"]),
    ("json-folder-missing", ["--json", MISSING]),
    ("json-is-a-folder", ["--json", HERE]),
]

_SIMULATE_CASES: list[tuple[str, list[str]]] = [
    ("gpus-0", ["--gpus", "0"]),
    ("gpus-negative", ["--gpus", "16", "-4"]),
    ("gpus-too-many", ["--gpus", "4096"]),
    ("gpus-text", ["--gpus", "lots"]),
    ("preset-unknown", ["--preset", "tpu-v9"]),
    # a preset without a node size cannot take --gpus-per-node
    ("preset-without-nodes", ["--preset", "this-cpu"]),
    ("gpus-per-node-0", ["--gpus-per-node", "0"]),
    ("routing-unknown", ["--routing", "trace"]),
    ("hot-share-2", ["--hot-share", "2"]),
    ("hot-share-negative", ["--hot-share", "-1"]),
    ("zipf-exponent-negative", ["--zipf-exponent", "-0.5"]),
    ("zipf-exponent-nan", ["--zipf-exponent", "nan"]),
    ("tokens-0", ["--tokens", "0"]),
    ("d-model-0", ["--d-model", "0"]),
    ("d-hidden-0", ["--d-hidden", "0"]),
    ("capacity-factor-0", ["--capacity-factor", "0"]),
    ("capacity-factor-negative", ["--capacity-factor", "-1.2"]),
    ("capacity-factor-inf", ["--capacity-factor", "inf"]),
    ("max-steps-0", ["--max-steps", "0"]),
    ("trace-folder-missing", ["--trace", MISSING]),
    ("trace-is-a-folder", ["--trace", HERE]),
]

BAD_INPUTS: list[tuple[str, list[str]]] = (
    [(f"moe-bench-{case}", BENCH + argv) for case, argv in _BENCH_CASES]
    + [(f"moe-simulate-{case}", SIMULATE + argv) for case, argv in _SIMULATE_CASES]
)
