"""Training loop for DeltaFormer (Xu et al., NeurIPS 2025) and its same-size Transformer.

Implements the two training recipes of design note `deltaformer.md` §7:

- (b) state tracking, paper §4.1 (swap task) and App. D (parity, modular arithmetic), plus
  the S5 word problem: fresh sequences every step from `furnace.deltaformer.tasks`,
  per-position cross-entropy on the task labels, evaluated on fresh sequences by token
  accuracy and last-position accuracy (the honest metric: early positions are lookups).
- (c) the byte-level LM of the paper's LM experiments, on the Python stdlib's sources
  (`furnace.runtime.corpus`), evaluated by mean validation cross-entropy in nats/byte.

Both use AdamW with a OneCycle learning rate and gradient clipping. Checkpoints hold the
model, optimizer, scheduler, step, loss curve and every RNG state the loop reads, so a run
resumed from one ends with exactly the losses of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from furnace.runtime.launch import torch_threads

from .model import LMConfig, SequenceModel
from .tasks import TASKS, get_task

__all__ = ["TrainConfig", "TrainResult", "build_model", "train", "train_many"]

LM_TASK = "lm"


@dataclass(kw_only=True)
class TrainConfig:
    """One training run.

    Attributes:
        task: a `tasks.TASKS` name ("swap", "parity", "modarith", "s5") or "lm".
        length: sequence length T (the LM's context).
        mixer, d_model, num_layers, num_heads, kappa1, w_source, beta_activation, rotary,
            chunk_size: the `LMConfig` fields of the model (the rest keep their defaults).
        steps: optimizer steps (also the OneCycle horizon).
        batch_size: sequences per step.
        lr: OneCycle peak learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        clip: gradient-norm clip.
        seed: model initialisation and data.
        eval_sequences: fresh evaluation sequences (tasks) or validation windows (LM).
        eval_lengths: tasks only: further lengths to evaluate the last-position accuracy
            at, after training at ``length``. Longer ones test length generalisation, the
            protocol of the Chomsky-hierarchy suite (Delétang et al., ICLR 2023) that
            DeltaFormer App. D uses.
        corpus_bytes: LM only: bytes of stdlib source, both splits together.
        val_fraction: LM only: share of files held out for validation.
        checkpoint: where to write checkpoints (None: no checkpoints).
        checkpoint_every: steps between checkpoints (0: only at the end).
    """

    task: str = "swap"
    length: int = 16
    mixer: str = "deltaformer"
    d_model: int = 64
    num_layers: int = 1
    num_heads: int = 4
    kappa1: str | tuple[str, ...] = "linear"
    w_source: str = "k"
    beta_activation: str = "sigmoid"
    rotary: bool = True
    chunk_size: int = 64
    steps: int = 1500
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    clip: float = 1.0
    seed: int = 0
    eval_sequences: int = 2000
    eval_lengths: tuple[int, ...] = ()
    # the note's 6.0 MB train + 0.5 MB validation; corpus.py splits by whole files (every
    # 13th file is validation) rather than by a byte offset, so the split is ~1/13 of it
    corpus_bytes: int = 6_500_000
    val_fraction: float = 1 / 13
    checkpoint: str | Path | None = None
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        if self.task != LM_TASK and self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of "
                             f"{sorted(TASKS) + [LM_TASK]}")
        for name in ("length", "steps", "batch_size", "eval_sequences", "corpus_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.eval_lengths = tuple(self.eval_lengths)
        for value in self.eval_lengths:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"eval_lengths must hold positive ints, got {value!r}")
        if self.eval_lengths and self.task == LM_TASK:
            raise ValueError("eval_lengths applies to tasks, not to the LM")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")
        # building the model config here reports bad model fields at construction time
        self.model_config()

    def model_config(self) -> LMConfig:
        if self.task == LM_TASK:
            vocab, classes = 256, None
        else:
            task = get_task(self.task)
            vocab, classes = task.vocab_size, task.num_classes
        return LMConfig(vocab_size=vocab, num_classes=classes, d_model=self.d_model,
                        num_layers=self.num_layers, num_heads=self.num_heads, mixer=self.mixer,
                        kappa1=self.kappa1, w_source=self.w_source,
                        beta_activation=self.beta_activation, rotary=self.rotary,
                        max_len=max((self.length, *self.eval_lengths)),
                        chunk_size=self.chunk_size)


@dataclass
class TrainResult:
    """What a run measured. Accuracies are for tasks (``last_acc_at``: the last-position
    accuracy at each of ``config.eval_lengths``), ``val_loss`` for the LM; metrics are None
    when the run stopped before its last step (``stop_at``) or diverged (``diverged_at``: the
    step whose loss was not finite; training stops there)."""

    config: TrainConfig
    params: int
    losses: list[float] = field(default_factory=list)
    steps_done: int = 0
    token_acc: float | None = None
    last_acc: float | None = None
    last_acc_at: dict[int, float] = field(default_factory=dict)
    val_loss: float | None = None
    diverged_at: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["config"]["checkpoint"] = (None if self.config.checkpoint is None
                                       else str(self.config.checkpoint))
        return out


def build_model(config: TrainConfig) -> SequenceModel:
    return SequenceModel(config.model_config())


class _Batches:
    """Training batches drawn from one generator, so its state is all a checkpoint needs."""

    def __init__(self, config: TrainConfig, generator: torch.Generator) -> None:
        self.config = config
        self.generator = generator
        if config.task == LM_TASK:
            from furnace.runtime.corpus import CorpusConfig, load_corpus

            self.corpus = load_corpus(CorpusConfig(num_bytes=config.corpus_bytes,
                                                   val_fraction=config.val_fraction))
        else:
            self.task = get_task(config.task)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        if c.task == LM_TASK:
            # one draw per step (not corpus.batches' iterator) so the generator's state is
            # the whole data position a checkpoint must keep
            data = self.corpus.train
            start_B = torch.randint(0, data.numel() - c.length, (c.batch_size,),
                                    generator=self.generator)
            window_BT = data[start_B[:, None] + torch.arange(c.length + 1)].long()
            return window_BT[:, :-1], window_BT[:, 1:]
        return self.task.sample(c.batch_size, c.length, self.generator)


def _loss(model: SequenceModel, inputs_BT: torch.Tensor, targets_BT: torch.Tensor):
    logits_BTV = model(inputs_BT)
    return F.cross_entropy(logits_BTV.flatten(0, 1), targets_BT.flatten()), logits_BTV


@torch.no_grad()
def _evaluate_task(model: SequenceModel, config: TrainConfig, length: int) -> tuple[float, float]:
    task = get_task(config.task)
    # a generator apart from training's: these sequences are fresh, not replays of batches
    generator = torch.Generator().manual_seed(1_000_003 + config.seed)
    correct = last = total = 0
    remaining = config.eval_sequences
    while remaining:
        n = min(500, remaining)
        tokens, labels = task.sample(n, length, generator)
        hits = model(tokens).argmax(-1) == labels
        correct += int(hits.sum())
        last += int(hits[:, -1].sum())
        total += n
        remaining -= n
    return correct / (total * length), last / total


@torch.no_grad()
def _evaluate_lm(model: SequenceModel, batches: _Batches) -> float:
    c = batches.config
    data = batches.corpus.val
    num_windows = (data.numel() - 1) // c.length
    if num_windows < 1:
        raise ValueError(f"the validation split ({data.numel()} bytes) is shorter than one "
                         f"window of {c.length + 1} bytes; raise corpus_bytes")
    # windows spread evenly over the whole split, not its first file: the held-out files
    # range from prose-heavy docs to generated tables, so one file is a biased sample
    index = torch.linspace(0, num_windows - 1, min(c.eval_sequences, num_windows))
    starts = index.round().long().unique() * c.length
    total, count = 0.0, 0
    for batch in starts.split(16):
        window_BT = data[batch[:, None] + torch.arange(c.length + 1)].long()
        logits = model(window_BT[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), window_BT[:, 1:].flatten(),
                                       reduction="sum"))
        count += window_BT[:, 1:].numel()
    return total / count


def _save(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    # rename is atomic: an interrupted save never leaves a truncated checkpoint behind
    tmp.replace(path)


def train(config: TrainConfig, progress: Any = None, *, resume: bool = False,
          stop_at: int | None = None) -> TrainResult:
    """Train one model; return its loss curve and final metrics.

    Seeds the global torch RNG with ``config.seed`` (model initialisation draws from it).

    Args:
        progress: a ``rich.progress.Progress`` to add a bar to, or None.
        resume: continue from ``config.checkpoint`` when that file exists.
        stop_at: stop after this step without evaluating (an interruption, for tests and
            for splitting a run); the OneCycle horizon stays ``config.steps``.
    """
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    model = build_model(config)
    generator = torch.Generator().manual_seed(config.seed)
    batches = _Batches(config, generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                  weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr,
                                                    total_steps=config.steps)
    result = TrainResult(config=config, params=sum(p.numel() for p in model.parameters()))
    path = Path(config.checkpoint) if config.checkpoint is not None else None
    if resume and path is not None and path.exists():
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        result.losses = list(state["losses"])
        result.steps_done = state["step"]
        # time already spent counts, so a resumed run reports the whole run's seconds
        started -= state["seconds"]
    end = config.steps if stop_at is None else min(stop_at, config.steps)
    bar = None
    if progress is not None:
        bar = progress.add_task(f"{config.mixer} {config.task}", total=config.steps,
                                completed=result.steps_done)
    model.train()
    for step in range(result.steps_done + 1, end + 1):
        inputs_BT, targets_BT = batches.next()
        loss, _ = _loss(model, inputs_BT, targets_BT)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            # the weights are past saving (u overflowed; design note §3.5): stop, not train on
            result.diverged_at = step
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        scheduler.step()
        result.losses.append(loss_value)
        result.steps_done = step
        if bar is not None:
            progress.update(bar, advance=1, description=f"{config.mixer} {config.task} "
                            f"loss {result.losses[-1]:.3f}")
        if path is not None and (step == end or (config.checkpoint_every
                                                 and step % config.checkpoint_every == 0)):
            _save(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
                         "torch_rng": torch.get_rng_state(), "losses": result.losses,
                         "step": step, "seconds": time.perf_counter() - started})
    if result.steps_done == config.steps:
        model.eval()
        if config.task == LM_TASK:
            result.val_loss = _evaluate_lm(model, batches)
        else:
            accuracy = {n: _evaluate_task(model, config, n)
                        for n in dict.fromkeys((config.length, *config.eval_lengths))}
            result.token_acc, result.last_acc = accuracy[config.length]
            result.last_acc_at = {n: accuracy[n][1] for n in config.eval_lengths}
    result.seconds = time.perf_counter() - started
    return result


def _train_one_thread(config: TrainConfig) -> TrainResult:
    with torch_threads(1):
        return train(config)


def train_many(configs: Iterable[TrainConfig], workers: int | None = None,
               on_done: Callable[[TrainResult], None] | None = None) -> list[TrainResult]:
    """Train each config single-threaded, ``workers`` at a time in spawned processes.

    One thread per run because these models are small: on the shared 2-core box two torch
    threads made a step 4x slower, while two single-threaded runs side by side each keep
    most of a core. Runs are seeded, so the results equal those of `train` one by one;
    their ``seconds`` include the contention of running side by side.

    Args:
        workers: processes at once (default: the CPU count, at most the number of runs);
            1 trains in this process.
        on_done: called with each result as it finishes (in finishing order).

    Returns:
        The results in the order of ``configs``.
    """
    configs = list(configs)
    if workers is None:
        workers = min(len(configs), os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: list[TrainResult | None] = [None] * len(configs)
    if workers == 1 or len(configs) <= 1:
        for i, config in enumerate(configs):
            results[i] = _train_one_thread(config)
            if on_done is not None:
                on_done(results[i])
        return results  # type: ignore[return-value]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_train_one_thread, c): i for i, c in enumerate(configs)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(results[futures[future]])
        except BaseException:
            # one failed run (or Ctrl-C) should not wait for the queued ones to train
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return results  # type: ignore[return-value]
