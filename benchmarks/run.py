"""Run every benchmark (`make bench`), then the full `furnace reproduce` set.

    python benchmarks/run.py [--skip-reproduce]

Benchmarks are timing only; they import furnace and are never imported by it.
"""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-reproduce", action="store_true")
    args = parser.parse_args()
    for script in sorted(HERE.glob("*/bench_*.py")):
        print(f"== {script.relative_to(HERE)}", flush=True)
        sys.argv = [str(script)]
        runpy.run_path(str(script), run_name="__main__")
    if not args.skip_reproduce:
        return subprocess.call([sys.executable, "-m", "furnace.cli", "reproduce", "--out",
                                "results/full"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
