"""`furnace reproduce deltaformer`: DeltaFormer (Xu et al., NeurIPS 2025) against a Transformer
of the same width, with the recipes of design note `deltaformer.md` §7 (b) and (c).

- ``swap``: the swap task of paper §4.1 at T=16; a 1-layer DeltaFormer (linear kappa1)
  tracks the state, a same-width Transformer stays near chance on the last position. The
  full set adds 2- and 4-layer Transformers, T=32, and every kappa1 variant, failures too.
- ``kernels``: naive vs chunk vs SDPA speed and peak memory (paper §3.4).
- ``parity_modarith`` (full set): parity and modular arithmetic (paper App. D).
- ``lm`` (full set): byte-level LM on the stdlib's sources (the paper's LM experiments),
  softmax-kappa1 DeltaFormer vs Transformer over 2 seeds.

Training runs single-threaded: on the shared 2-core box two threads were 4x slower per step.
"""

from __future__ import annotations

import contextlib
from statistics import mean

import torch

from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table

from .bench import bench_kernels
from .train import TrainConfig, TrainResult, train

PAPER = "Xu et al., DeltaFormer, NeurIPS 2025"
MIX = ("softmax", "softmax", "linear", "linear")


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _name(r: TrainResult) -> str:
    c = r.config
    if c.mixer == "attention":
        return f"Transformer {c.num_layers}L"
    kappa = c.kappa1 if isinstance(c.kappa1, str) else "mix " + ",".join(c.kappa1)
    return f"DeltaFormer {c.num_layers}L, kappa1 {kappa}"


def _run(ctx: RunContext, **kw) -> TrainResult:
    config = TrainConfig(**kw)
    ctx.progress(f"{config.mixer} {config.num_layers}L {config.task} T={config.length} "
                 f"({config.steps} steps)")
    with _one_thread():
        return train(config)


def _task_table(title: str, runs: list[TrainResult], chance: float) -> Table:
    rows = [[_name(r), r.config.task, r.config.length, r.params, r.config.steps, r.token_acc,
             r.last_acc, r.seconds] for r in runs]
    return Table(title=title, columns=["model", "task", "T", "params", "steps", "token acc",
                                       "last-position acc", "seconds"], rows=rows,
                 note=f"d=64, 4 heads, AdamW + OneCycle, batch 128, clip 1.0; accuracies on "
                 f"2000 fresh sequences; chance {chance:.2f}. Last-position accuracy is the "
                 "honest metric (early positions are lookups).")


def swap(ctx: RunContext) -> Result:
    df = _run(ctx, task="swap", mixer="deltaformer", kappa1="linear", steps=1500)
    # the note's 1-layer Transformer recipe: 600 steps at lr 1e-3
    tf = _run(ctx, task="swap", mixer="attention", steps=600, lr=1e-3)
    runs = [df, tf]
    result = Result()
    if not ctx.quick:
        runs += [_run(ctx, task="swap", mixer="attention", num_layers=n, steps=1500)
                 for n in (2, 4)]
    result.tables.append(_task_table("Swap task, T=16: DeltaFormer 1L vs Transformers", runs,
                                     0.2))
    result.claims += [
        Claim(what="1-layer DeltaFormer (kappa1 linear) solves swap, T=16, last position",
              paper=">= 0.99 (issue target; paper §4.1: solved)", ours=f"{df.last_acc:.3f}",
              kind="measured", source=PAPER, holds=df.last_acc >= 0.99),
        Claim(what="same-width 1-layer Transformer, swap T=16, last position",
              paper="near chance 0.2 (<= 0.3)", ours=f"{tf.last_acc:.3f}", kind="measured",
              source=PAPER, holds=tf.last_acc <= 0.3),
    ]
    if not ctx.quick:
        long_runs = [_run(ctx, task="swap", length=32, mixer="deltaformer", kappa1="linear",
                          steps=2000),
                     _run(ctx, task="swap", length=32, mixer="attention", num_layers=2,
                          steps=2000)]
        result.tables.append(_task_table("Swap task, T=32", long_runs, 0.2))
        result.claims.append(Claim(
            what="T=32: DeltaFormer 1L vs Transformer 2L, last position", paper="solved vs "
            "chance", ours=f"{long_runs[0].last_acc:.3f} vs {long_runs[1].last_acc:.3f}",
            kind="measured", source=PAPER,
            holds=long_runs[0].last_acc >= 0.99 and long_runs[1].last_acc <= 0.3))
        variants = [df] + [_run(ctx, task="swap", mixer="deltaformer", kappa1=k, steps=1500)
                           for k in ("softmax", "relu", "round", MIX)]
        result.tables.append(_task_table("Swap task, T=16: kappa1 variants of a 1-layer "
                                         "DeltaFormer (failures included)", variants, 0.2))
        runs += long_runs + variants[1:]
    result.data = {"runs": [r.to_dict() for r in runs]}
    return result


def kernels(ctx: RunContext) -> Result:
    lengths = (256, 1024) if ctx.quick else (128, 256, 512, 1024)
    ctx.progress(f"T in {lengths}")
    with _one_thread():
        rows = bench_kernels(lengths, include_naive_up_to=1024)
    table = Table(title="DeltaFormer kernels, B=1 H=4 D=64 C=64 kappa1 softmax, 1 thread",
                  columns=["T", "naive f+b ms", "chunk f+b ms", "SDPA f+b ms", "naive/chunk",
                           "chunk/SDPA", "naive peak MiB", "chunk peak MiB", "SDPA peak MiB",
                           "chunk-naive rel err"],
                  rows=[[r["T"], r["fwdbwd_ms_naive"], r["fwdbwd_ms_chunk"], r["fwdbwd_ms_sdpa"],
                         r["naive_over_chunk"], r["chunk_over_sdpa"], r["peak_mib_naive"],
                         r["peak_mib_chunk"], r["peak_mib_sdpa"],
                         f"{r['max_rel_err_chunk_vs_naive']:.1e}"] for r in rows],
                  note="Forward+backward medians of 3 after a warm-up, same inputs, same run. "
                  "Peak memory is the resident high-water mark of a child process, including "
                  "a ~40-47 MiB floor of torch's own code and workspaces.")
    last = rows[-1]
    return Result(tables=[table], data={"rows": rows}, claims=[
        Claim(what=f"chunk vs naive forward+backward at T={last['T']}", paper=">= 10x faster "
              "(issue target)", ours=f"{last['naive_over_chunk']:.1f}x", kind="measured",
              source=PAPER, holds=last["naive_over_chunk"] >= 10),
        Claim(what=f"chunk vs SDPA forward+backward at T={last['T']}", paper="within 4x "
              "(issue target)", ours=f"{last['chunk_over_sdpa']:.2f}x", kind="measured",
              source=PAPER, holds=last["chunk_over_sdpa"] <= 4),
    ])


def parity_modarith(ctx: RunContext) -> Result:
    result = Result()
    for task, chance in (("parity", 0.5), ("modarith", 0.2)):
        runs = [_run(ctx, task=task, mixer="deltaformer", kappa1="linear", steps=1500),
                _run(ctx, task=task, mixer="attention", steps=1500)]
        result.tables.append(_task_table(f"{task}, T=16: DeltaFormer 1L vs Transformer 1L",
                                         runs, chance))
        result.claims.append(Claim(
            what=f"{task}: DeltaFormer 1L vs Transformer 1L, last position",
            paper="DeltaFormer ahead (App. D)",
            ours=f"{runs[0].last_acc:.3f} vs {runs[1].last_acc:.3f}", kind="measured",
            source=PAPER, holds=runs[0].last_acc > runs[1].last_acc))
        result.data[task] = [r.to_dict() for r in runs]
    return result


def lm(ctx: RunContext) -> Result:
    import matplotlib.pyplot as plt

    recipe = dict(task="lm", length=128, d_model=128, num_layers=4, num_heads=4, steps=600,
                  batch_size=16, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95),
                  eval_sequences=100)
    runs = {(mixer, seed): _run(ctx, mixer=mixer, kappa1="softmax", seed=seed, **recipe)
            for mixer in ("attention", "deltaformer") for seed in (0, 1)}
    fig, ax = plt.subplots(figsize=(7, 4))
    for (mixer, seed), r in runs.items():
        ax.plot(r.losses, label=f"{mixer} seed {seed}", lw=0.8)
    ax.set(xlabel="step", ylabel="train loss (nats/byte)", title="Byte-level LM on stdlib")
    ax.legend()
    figure = ctx.save_figure(fig, "deltaformer_lm_loss")
    mean_tf = mean(runs["attention", s].val_loss for s in (0, 1))
    mean_df = mean(runs["deltaformer", s].val_loss for s in (0, 1))
    rel = mean_df / mean_tf - 1
    rows = [[_name(r), seed, r.params, r.val_loss, float(torch.tensor(r.val_loss).exp()),
             r.seconds] for (_, seed), r in runs.items()]
    return Result(
        tables=[Table(title="Byte-level LM, 4 layers, d=128, context 128, 600 steps",
                      columns=["model", "seed", "params", "val loss (nats/byte)",
                               "perplexity/byte", "seconds"], rows=rows,
                      note="Validation: mean cross-entropy over 100 windows of the held-out "
                      "files (every 13th stdlib file).")],
        figures=[figure],
        claims=[Claim(what="DeltaFormer (softmax kappa1) mean val loss vs Transformer, 2 seeds",
                      paper="within 2% (parity)", ours=f"{mean_df:.4f} vs {mean_tf:.4f} "
                      f"({100 * rel:+.1f}%)", kind="measured", source=PAPER,
                      holds=abs(rel) <= 0.02)],
        data={"runs": [r.to_dict() for r in runs.values()]})


EXPERIMENTS = [
    Experiment("deltaformer", "swap", "Swap task: 1-layer DeltaFormer vs same-width "
               "Transformer", swap),
    Experiment("deltaformer", "kernels", "Kernel speed and memory: naive vs chunk vs SDPA",
               kernels),
    Experiment("deltaformer", "parity_modarith", "Parity and modular arithmetic",
               parity_modarith, quick=False),
    Experiment("deltaformer", "lm", "Byte-level LM parity, 2 seeds", lm, quick=False),
]
