"""Bad inputs for `furnace recsys` (train, plan, bench); `tests/test_cli_contract.py` runs them.

Each case is (id, argv after `furnace`). The data files are fixtures: `malformed.tsv` has a
line of 3 columns at line 3; `id_outside_table.tsv` is an indexed file whose line 3 names row
12 of a table of 10 rows.
"""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).parent / "data"
_MALFORMED = str(_DATA / "malformed.tsv")
_OUTSIDE = str(_DATA / "id_outside_table.tsv")
_FOLDER = str(_DATA)

BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("train-ranks-zero", ["recsys", "train", "--ranks", "0"]),
    ("train-ranks-beyond-local", ["recsys", "train", "--ranks", "9"]),
    ("train-unknown-scheme", ["recsys", "train", "--scheme", "column"]),
    ("train-batch-not-multiple-of-ranks", ["recsys", "train", "--ranks", "4",
                                           "--batch-size", "30"]),
    ("train-steps-zero", ["recsys", "train", "--steps", "0"]),
    ("train-row-scale-zero", ["recsys", "train", "--row-scale", "0"]),
    ("train-row-scale-above-one", ["recsys", "train", "--row-scale", "2"]),
    ("train-zipf-negative", ["recsys", "train", "--zipf", "-0.5"]),
    ("train-hot-budget-negative", ["recsys", "train", "--hot-budget-mib", "-1"]),
    ("train-profile-more-than-steps", ["recsys", "train", "--steps", "3",
                                       "--profile-batches", "5"]),
    ("train-embedding-dim-zero", ["recsys", "train", "--embedding-dim", "0"]),
    ("train-unknown-optimizer", ["recsys", "train", "--optimizer", "adam"]),
    ("train-lr-zero", ["recsys", "train", "--lr", "0"]),
    ("train-data-missing", ["recsys", "train", "--data", str(_DATA / "nowhere.tsv")]),
    ("train-data-malformed-line", ["recsys", "train", "--data", _MALFORMED,
                                   "--batch-size", "2", "--steps", "1", "--eval-batches", "1",
                                   "--profile-batches", "1"]),
    ("train-data-id-outside-table", ["recsys", "train", "--data", _OUTSIDE,
                                     "--data-format", "indexed", "--rows-per-table", "10",
                                     "--batch-size", "2", "--steps", "1",
                                     "--eval-batches", "1", "--profile-batches", "1"]),
    ("train-data-too-short", ["recsys", "train", "--data", _OUTSIDE, "--data-format",
                              "indexed", "--rows-per-table", "20", "--batch-size", "2",
                              "--steps", "4", "--profile-batches", "1"]),
    ("train-json-is-a-folder", ["recsys", "train", "--json", _FOLDER]),
    ("plan-ranks-zero", ["recsys", "plan", "--ranks", "0"]),
    ("plan-ranks-per-node-not-dividing", ["recsys", "plan", "--ranks", "12",
                                          "--ranks-per-node", "8"]),
    ("plan-hot-budget-negative", ["recsys", "plan", "--hot-budget-mib", "-0.5"]),
    ("plan-unknown-preset", ["recsys", "plan", "--preset", "tpu-v5"]),
    ("plan-zipf-too-large", ["recsys", "plan", "--zipf", "9"]),
    ("plan-profile-batches-negative", ["recsys", "plan", "--profile-batches", "-1"]),
    ("plan-bag-size-zero", ["recsys", "plan", "--bag-size", "0"]),
    ("plan-json-is-a-folder", ["recsys", "plan", "--json", _FOLDER]),
    ("bench-one-rank", ["recsys", "bench", "--ranks", "1"]),
    ("bench-ranks-beyond-local", ["recsys", "bench", "--ranks", "16"]),
    ("bench-unknown-scheme", ["recsys", "bench", "--schemes", "row,magic"]),
    ("bench-empty-schemes", ["recsys", "bench", "--schemes", ","]),
    ("bench-steps-too-few", ["recsys", "bench", "--steps", "2"]),
    ("bench-bandwidth-zero", ["recsys", "bench", "--bandwidth-mbps", "0"]),
    ("bench-latency-negative", ["recsys", "bench", "--latency-ms", "-1"]),
    ("bench-batch-not-multiple-of-ranks", ["recsys", "bench", "--ranks", "4",
                                           "--batch-size", "1022"]),
    ("bench-hot-budget-negative", ["recsys", "bench", "--hot-budget-mib", "-3"]),
    ("train-ranks-per-node-not-dividing", ["recsys", "train", "--ranks", "3",
                                           "--ranks-per-node", "2", "--batch-size", "96"]),
    ("bench-ranks-per-node-not-dividing", ["recsys", "bench", "--ranks", "4",
                                           "--ranks-per-node", "3"]),
    ("bench-intra-bandwidth-zero", ["recsys", "bench", "--intra-bandwidth-mbps", "0"]),
]
