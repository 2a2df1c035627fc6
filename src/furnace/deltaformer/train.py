"""Training loop for DeltaFormer (Xu et al., NeurIPS 2025) and its same-size Transformer.

Implements the two training recipes of design note `deltaformer.md` Sec. 7:

- (b) state tracking, paper Sec. 4.1 (swap task) and App. D (parity, modular arithmetic), plus
  the S5 word problem: fresh sequences every step from `furnace.deltaformer.tasks`,
  per-position cross-entropy on the task labels, evaluated on fresh sequences by token
  accuracy and last-position accuracy (the honest metric: early positions are lookups).
- (c) the byte-level LM of the paper's LM experiments, on the Python stdlib's sources
  (`furnace.runtime.corpus`), evaluated by mean validation cross-entropy in nats/byte.

Both use AdamW with a OneCycle learning rate and gradient clipping. Checkpoints hold the
run's config, the model, optimizer, scheduler, step, loss and learning-rate curves and every
RNG state the loop reads, so a run resumed from one ends with exactly the losses of an
uninterrupted run (same machine, same thread count). The rules (README "Checkpoints"):

- a run without ``resume`` refuses to replace an existing checkpoint unless ``overwrite``;
- ``resume`` needs the file, and a file that is not a readable checkpoint of this format and
  version raises `CorruptCheckpointError` naming it;
- a resumed run must have the checkpoint's config except where it goes and what is
  evaluated (`RESUME_FREE_FIELDS`); otherwise `CheckpointMismatchError` names each field
  with both values;
- ``steps`` may grow on resume: a OneCycle schedule is defined by its total steps, so the
  learning rate of steps already taken cannot be made that of a longer schedule. Extending
  a run of N steps to M appends a second OneCycle cycle over steps N+1..M (a warm restart,
  optimizer moments kept). The result is deterministic and does not depend on where the
  run was interrupted, but it is not the run a fresh ``steps=M`` would give;
- every check runs before any training, and checkpoints are written with
  `furnace.runtime.atomic.atomic_save` (temporary file, fsync, rename, folder fsync).
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

from furnace.runtime.atomic import OutputError, atomic_save, check_writable_dir
from furnace.runtime.launch import torch_threads

from .model import LMConfig, SequenceModel
from .tasks import TASKS, get_task

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "RESUME_FREE_FIELDS",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "TrainConfig",
    "TrainDataError",
    "TrainResult",
    "build_model",
    "check_resumable",
    "load_checkpoint",
    "prepare_checkpoint",
    "train",
    "train_many",
]

LM_TASK = "lm"
CHECKPOINT_FORMAT = "furnace.deltaformer.train"
# 1: the first tagged format (config, OneCycle cycle ends and learning rates stored)
CHECKPOINT_VERSION = 1
# Fields a resumed run may change: where checkpoints go and what is evaluated after the
# last step (max_len, which eval_lengths raises, holds no parameters). Every other field
# shapes the model or the trajectory, so changing it would make the resumed run another run.
RESUME_FREE_FIELDS = ("checkpoint", "checkpoint_every", "eval_sequences", "eval_lengths")
_REQUIRED_KEYS = ("config", "cycles", "model", "optimizer", "scheduler", "generator",
                  "torch_rng", "losses", "lrs", "step", "seconds")


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
            protocol of the Chomsky-hierarchy suite (Deletang et al., ICLR 2023) that
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
    step whose loss was not finite; training stops there). ``lrs`` is the learning rate of
    each step taken and ``lr_cycles`` the last step of each OneCycle cycle: ``[steps]``
    unless a resume extended the run."""

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
    lrs: list[float] = field(default_factory=list)
    lr_cycles: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["config"]["checkpoint"] = (None if self.config.checkpoint is None
                                       else str(self.config.checkpoint))
        return out


class TrainDataError(ValueError):
    """The training data cannot serve the config (an LM context longer than a split)."""


class CheckpointError(ValueError):
    """A checkpoint cannot be used as asked. ``path`` is the file; the message names it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"checkpoint {path}: {reason}")


class CheckpointExistsError(CheckpointError):
    """A fresh run would replace an existing checkpoint (pass ``overwrite=True``)."""


class CheckpointNotFoundError(CheckpointError):
    """``resume`` was asked for but the checkpoint file does not exist."""


class CorruptCheckpointError(CheckpointError):
    """The file is truncated, garbage, not a checkpoint of this trainer, or another version."""


class CheckpointMismatchError(CheckpointError):
    """The resumed run's config differs from the checkpoint's.

    ``differences`` holds ``(field, checkpoint value, requested value)`` for each field.
    """

    def __init__(self, path: str | Path, differences: list[tuple[str, Any, Any]]) -> None:
        self.differences = differences
        listed = ", ".join(f"{name} {old!r} (checkpoint) vs {new!r} (now)"
                           for name, old, new in differences)
        reason = f"written by a run with other settings: {listed}"
        if any(name == "steps" for name, _, _ in differences):
            reason += f"; {STEPS_RULE}"
        super().__init__(path, reason + "; resume with the checkpoint's settings or start "
                         "over with overwrite")


STEPS_RULE = ("steps may grow on resume (a second OneCycle cycle over the added steps) but "
              "not shrink: a OneCycle schedule's learning rate at every step depends on its "
              "total steps")


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
            # found here, before training, not when the first batch or the evaluation needs it
            for name, split in (("training", self.corpus.train), ("validation", self.corpus.val)):
                if split.numel() < config.length + 1:
                    raise TrainDataError(f"the {name} split ({split.numel()} bytes) is "
                                         f"shorter than one window of {config.length + 1} "
                                         "bytes; raise corpus_bytes or lower length")
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


def _config_record(config: TrainConfig) -> dict[str, Any]:
    """The config as plain data (what a weights-only load can read back)."""
    record = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    record["checkpoint"] = None if config.checkpoint is None else str(config.checkpoint)
    return record


def _same(old: Any, new: Any) -> bool:
    # a tuple and a list are the same sequence (a config may be built from either); a bool
    # is not the int 1
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    return old == new


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint written by `train`; return its state.

    Only tensors and plain data are unpickled (``weights_only``), so a foreign pickle cannot
    run code here.

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: unreadable, truncated, not this trainer's, or another version.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(path, "does not exist (nothing to resume)")
    if not path.is_file():
        raise CorruptCheckpointError(path, "is not a regular file")
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise CorruptCheckpointError(path, f"cannot be read: {exc.strerror or exc}") from exc
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # RuntimeError, UnpicklingError, OSError, IndexError, ...
        raise CorruptCheckpointError(
            path, f"is not a readable torch checkpoint (truncated, corrupt or holding more "
            f"than tensors and plain data: {type(exc).__name__})") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CorruptCheckpointError(path, f"is not a furnace deltaformer training checkpoint "
                                     f"(no format tag {CHECKPOINT_FORMAT!r})")
    if state.get("version") != CHECKPOINT_VERSION:
        raise CorruptCheckpointError(path, f"has checkpoint version {state.get('version')!r}; "
                                     f"this furnace reads version {CHECKPOINT_VERSION}")
    missing = [key for key in _REQUIRED_KEYS if key not in state]
    if missing:
        raise CorruptCheckpointError(path, f"lacks {', '.join(missing)}")
    step, cycles = state["step"], state["cycles"]
    valid = (isinstance(state["config"], dict) and isinstance(step, int) and step >= 0
             and isinstance(cycles, list) and cycles
             and all(isinstance(c, int) for c in cycles)
             and all(a < b for a, b in zip([0, *cycles], cycles, strict=False))
             and step <= cycles[-1] and state["config"].get("steps") == cycles[-1]
             and len(state["losses"]) == step
             and len(state["lrs"]) == step)
    if not valid:
        raise CorruptCheckpointError(path, "has an inconsistent step, cycle or loss record")
    return state


def check_resumable(config: TrainConfig, state: dict[str, Any], path: str | Path) -> None:
    """Raise `CheckpointMismatchError` unless ``config`` may continue the run of ``state``.

    Every field but `RESUME_FREE_FIELDS` must equal the checkpoint's; ``steps`` may be
    larger than the checkpoint's run (the run is then extended), never smaller.
    """
    stored = state["config"]
    differences = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in RESUME_FREE_FIELDS:
            continue
        # a field newer than the checkpoint had its default in the run that wrote it
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        old, new = stored.get(f.name, default), getattr(config, f.name)
        if f.name == "steps":
            if isinstance(old, int) and new < old:
                differences.append((f.name, old, new))
        elif not _same(old, new):
            differences.append((f.name, old, new))
    if differences:
        raise CheckpointMismatchError(path, differences)


def prepare_checkpoint(config: TrainConfig, *, resume: bool = False,
                       overwrite: bool = False) -> dict[str, Any] | None:
    """Every check `train` makes on its checkpoint, before any training; the state to resume.

    Returns the loaded state when resuming, else None. Creates the checkpoint's folder if
    needed and checks that it is writable.

    Raises:
        ValueError: ``resume`` without ``config.checkpoint``, or ``resume`` with ``overwrite``.
        CheckpointExistsError: not resuming, the file exists and ``overwrite`` is False.
        CheckpointNotFoundError, CorruptCheckpointError, CheckpointMismatchError: on resume.
        OutputError: the checkpoint's folder cannot be created or written.
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: resume continues the "
                         "checkpoint's run, overwrite replaces it with a new one")
    if config.checkpoint is None:
        if resume:
            raise ValueError("resume needs config.checkpoint")
        return None
    path = Path(config.checkpoint)
    if path.is_dir():
        raise OutputError(f"checkpoint {path} is a folder, not a file")
    state = None
    if resume:
        state = load_checkpoint(path)
        check_resumable(config, state, path)
    elif path.exists() and not overwrite:
        raise CheckpointExistsError(path, "exists; resume it or pass overwrite=True to "
                                    "replace it with a new run")
    check_writable_dir(path.parent if str(path.parent) else Path("."))
    return state


def _one_cycle(optimizer: torch.optim.Optimizer, config: TrainConfig,
               total_steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr,
                                               total_steps=total_steps)


def _cycle_containing(cycles: list[int], step: int) -> tuple[int, int]:
    """(first step - 1, last step) of the OneCycle cycle that drives ``step``."""
    start = 0
    for end in cycles:
        if step <= end:
            return start, end
        start = end
    return start, cycles[-1]


def train(config: TrainConfig, progress: Any = None, *, resume: bool = False,
          overwrite: bool = False, stop_at: int | None = None) -> TrainResult:
    """Train one model; return its loss curve and final metrics.

    Seeds the global torch RNG with ``config.seed`` (model initialisation draws from it).
    Every checkpoint check (`prepare_checkpoint`) runs before any training.

    Args:
        progress: a ``rich.progress.Progress`` to add a bar to, or None.
        resume: continue from ``config.checkpoint``, which must exist and hold a run with
            the same config (`check_resumable`); a larger ``config.steps`` extends it.
        overwrite: without ``resume``, replace an existing ``config.checkpoint``.
        stop_at: stop after this step without evaluating (an interruption, for tests and
            for splitting a run); the OneCycle horizon stays ``config.steps``.

    Raises:
        CheckpointError (and its subclasses), OutputError, ValueError: see
        `prepare_checkpoint`; ValueError for a bad ``stop_at``.
    """
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int)
                                or stop_at < 1):
        raise ValueError(f"stop_at must be None or a positive int, got {stop_at!r}")
    state = prepare_checkpoint(config, resume=resume, overwrite=overwrite)
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    batches = _Batches(config, generator)  # first: it refuses data that cannot serve the config
    torch.manual_seed(config.seed)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                  weight_decay=config.weight_decay)
    result = TrainResult(config=config, params=sum(p.numel() for p in model.parameters()))
    path = Path(config.checkpoint) if config.checkpoint is not None else None
    if state is None:
        cycles = [config.steps]
        scheduler = _one_cycle(optimizer, config, config.steps)
    else:
        old_cycles = list(state["cycles"])
        cycles = old_cycles + ([config.steps] if config.steps > old_cycles[-1] else [])
        try:
            model.load_state_dict(state["model"])
            done = state["step"]
            if done == old_cycles[-1] and config.steps > done:
                # the checkpoint's schedule is spent: a new cycle starts from its optimizer,
                # exactly as the loop starts one at a cycle end
                optimizer.load_state_dict(state["optimizer"])
                scheduler = _one_cycle(optimizer, config, config.steps - done)
            else:
                # built before the optimizer's state is loaded, so that state's learning
                # rate and betas, not the new scheduler's first ones, drive the next step
                start, end = _cycle_containing(cycles, min(done + 1, cycles[-1]))
                scheduler = _one_cycle(optimizer, config, end - start)
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
            generator.set_state(state["generator"])
            torch.set_rng_state(state["torch_rng"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(path, f"does not fit this config's model or optimizer "
                                         f"({type(exc).__name__})") from exc
        result.losses = list(state["losses"])
        result.lrs = list(state["lrs"])
        result.steps_done = done
        # time already spent counts, so a resumed run reports the whole run's seconds
        started -= state["seconds"]
    result.lr_cycles = list(cycles)
    cycle_ends = set(cycles[:-1])
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
            # the weights are past saving (u overflowed; design note Sec. 3.5): stop, not train on
            result.diverged_at = step
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        result.lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
        if step in cycle_ends:
            # a resume extended the run: the next steps follow a fresh OneCycle cycle
            next_end = cycles[cycles.index(step) + 1]
            scheduler = _one_cycle(optimizer, config, next_end - step)
        result.losses.append(loss_value)
        result.steps_done = step
        if bar is not None:
            progress.update(bar, advance=1, description=f"{config.mixer} {config.task} "
                            f"loss {result.losses[-1]:.3f}")
        if path is not None and (step == end or (config.checkpoint_every
                                                 and step % config.checkpoint_every == 0)):
            checkpoint = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                          "config": _config_record(config), "cycles": list(cycles),
                          "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(),
                          "generator": generator.get_state(),
                          "torch_rng": torch.get_rng_state(), "losses": list(result.losses),
                          "lrs": list(result.lrs), "step": step,
                          "seconds": time.perf_counter() - started}
            atomic_save(path, lambda f, checkpoint=checkpoint: torch.save(checkpoint, f))
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
            # one failed run, Ctrl-C or SIGTERM (SystemExit from the CLI) must not wait for
            # the running and queued runs to train: cancel the queue, end the workers
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
            raise
    return results  # type: ignore[return-value]
