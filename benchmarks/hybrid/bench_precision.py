"""Benchmark: bf16 against fp32 training of a tiny MoE LM, and the bf16 / fp32 step time on
this CPU, side by side (BaGuaLu's mixed precision, issue 13 items 2 and 7).

    python benchmarks/hybrid/bench_precision.py [--quick] [--steps N] [--rounds R] [--check]

Both runs have the same seed, initial weights and batches
(`furnace.hybrid.experiments.precision_curves`); the comparison is the mean of the last
``tail`` losses, |bf16 - fp32| / fp32, against the stated tolerance of
`PrecisionCurvesConfig` (3%; its docstring says why). The speed is
`furnace.hybrid.precision.measure_precision_speed`: both precisions in the same rounds in
rotating order, the median of the per-round ratios, reported as measured with the CPU's
bf16 features; it is never checked (it depends on the CPU and on its load).

``--check`` exits 1 if the loss curves disagree beyond the tolerance after the same steps.
"""

from __future__ import annotations

import argparse
import sys

from furnace.hybrid.experiments import PrecisionCurvesConfig, loss_gap, precision_curves
from furnace.hybrid.precision import PrecisionSpeedConfig, measure_precision_speed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 steps, 7 rounds")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: "
                        "150, or 30 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: 21, "
                        "or 7 with --quick)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if bf16 and fp32 disagree beyond the tolerance")
    args = parser.parse_args(argv)
    steps = args.steps or (30 if args.quick else 150)
    rounds = args.rounds or (7 if args.quick else 21)
    config = PrecisionCurvesConfig(steps=steps)
    curves = precision_curves(config)
    gap = loss_gap(curves["fp32"], curves["bf16"], config.tail)
    print(f"tiny MoE LM, {steps} steps, same seed and data (measured)")
    for name in ("fp32", "bf16"):
        losses = curves[name]
        tail = sum(losses[-config.tail:]) / config.tail
        print(f"  {name}: first loss {losses[0]:.4f}, final loss {losses[-1]:.4f}, "
              f"mean of the last {config.tail} {tail:.4f}")
    within = gap <= config.tolerance
    print(f"  |bf16 - fp32| / fp32 of the last-{config.tail} means: {100 * gap:.2f}% "
          f"(tolerance {100 * config.tolerance:g}%: {'within' if within else 'BEYOND'})")
    speed = measure_precision_speed(PrecisionSpeedConfig(rounds=rounds))
    features = ", ".join(speed.cpu_features) or "none (bf16 GEMMs emulated)"
    print(f"bf16 step time / fp32 step time = {speed.ratio:.3f}, measured side by side, "
          f"median of {rounds} paired rounds (fp32 {speed.fp32.median * 1e3:.1f} ms, bf16 "
          f"{speed.half.median * 1e3:.1f} ms per step; CPU features: {features})")
    return 1 if args.check and not within else 0


if __name__ == "__main__":
    # benchmarks/run.py runs every bench_* in one process: only a failure may exit
    status = main()
    if status:
        sys.exit(status)
