"""The training loop of Furnace's language models, with atomic checkpoints and exact resume.

One loop serves the MoE LM whose routing traces drive the FasterMoE benchmarks
(`furnace.moe.lm`) and DeltaFormer's state-tracking and byte-level LM runs
(`furnace.deltaformer.train`, design note `deltaformer.md` Sec. 7): AdamW, gradient-norm
clipping, a learning-rate schedule (`SCHEDULES`: constant, or OneCycle, i.e. linear warm-up
then cosine annealing, as `torch.optim.lr_scheduler.OneCycleLR` defines it), batches drawn
from one generator, periodic evaluation and checkpoints.

Determinism: the loop forks the global torch RNG (`torch.random.fork_rng`) and seeds the
fork with the config's seed before building the model, so initialisation and dropout are a
function of the seed and the caller's RNG state (torch, and the python and numpy RNGs, which
the loop never reads) is the same after training as before. Batches come from a
``torch.Generator`` of their own, seeded with the same seed.

Checkpoints hold the run's config, the model, optimizer, scheduler, step, loss and learning
rate curves and both RNG states, so a run resumed from one ends with exactly the losses of an
uninterrupted run (same machine, same thread count). The rules:

- a run without ``resume`` refuses to replace an existing checkpoint unless ``overwrite``;
- ``resume`` needs the file, and a file that is not a readable checkpoint of the expected
  format and version raises `CorruptCheckpointError`, one line naming it; files are read
  with ``weights_only=True``, so a foreign pickle cannot run code;
- a resumed run must have the checkpoint's config except for the format's free fields
  (where checkpoints go, what is evaluated); otherwise `CheckpointMismatchError` names each
  field with both values;
- ``steps`` may grow on resume: a schedule such as OneCycle is defined by its total steps,
  so extending a run of N steps to M appends a second cycle over steps N+1..M (a warm
  restart, optimizer moments kept). The result does not depend on where the run was
  interrupted, but it is not the run a fresh ``steps=M`` would give;
- every check runs before any training, and checkpoints are written with
  `furnace.runtime.atomic.atomic_save` (temporary file, fsync, rename, folder fsync).

A parallel trainer extends the loop through `TrainHooks` (the optimizer's parameter groups,
gradient reduction after backward, gradient clipping); the loop holds no parallelism code.
Where checkpoints live is a `CheckpointStore`: the default, `FileCheckpointStore`, is the
single ``torch.save`` file above; a sharded trainer passes one that writes a distributed
checkpoint (each rank its own shards) under the same rules.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from .atomic import OutputError, atomic_save, check_writable_dir

__all__ = [
    "Progress",
    "progress_bar",
    "SCHEDULES",
    "STEPS_RULE",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointFormat",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "CorruptCheckpointError",
    "FileCheckpointStore",
    "TrainHooks",
    "TrainLoopConfig",
    "TrainResult",
    "RECORD_KEYS",
    "check_checkpoint_state",
    "check_resumable",
    "config_record",
    "load_checkpoint",
    "prepare_checkpoint",
    "train_loop",
]

Batch = TypeVar("Batch")
Model = TypeVar("Model", bound=nn.Module)
Result = TypeVar("Result", bound="TrainResult")
ScheduleFactory = Callable[[torch.optim.Optimizer, float, int],
                           torch.optim.lr_scheduler.LRScheduler]


def _one_cycle(optimizer: torch.optim.Optimizer, lr: float,
               total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    # torch's defaults: 30% linear warm-up from lr/25, cosine down to lr/25e4, and beta1
    # cycled between 0.95 and 0.85 against the learning rate
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps)


# the learning rate of every step, per cycle; None keeps the optimizer's lr at every step
SCHEDULES: dict[str, ScheduleFactory | None] = {"constant": None, "one_cycle": _one_cycle}

STEPS_RULE = ("steps may grow on resume (a second schedule cycle over the added steps) but "
              "not shrink: the learning rate at every step depends on the schedule's total "
              "steps")

_REQUIRED_KEYS = ("config", "cycles", "model", "optimizer", "scheduler", "generator",
                  "torch_rng", "losses", "lrs", "step", "seconds")
# what a store keeps beside the model and optimizer tensors (`CheckpointStore.read`)
RECORD_KEYS = tuple(key for key in _REQUIRED_KEYS if key not in ("model", "optimizer"))


@dataclass(kw_only=True)
class TrainLoopConfig:
    """What the loop needs of a run.

    Attributes:
        steps: optimizer steps (also the horizon of the schedule's first cycle).
        lr: the learning rate (a schedule's peak).
        weight_decay: AdamW weight decay.
        betas: AdamW betas (OneCycle cycles beta1 itself).
        clip: gradient-norm clip.
        schedule: a `SCHEDULES` name.
        seed: model initialisation, dropout and the batch generator.
        eval_every: evaluate every this many steps (0: only after the last step).
        checkpoint: where to write checkpoints (None: no checkpoints).
        checkpoint_every: steps between checkpoints (0: only at the end).
    """

    steps: int
    lr: float
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    clip: float = 1.0
    schedule: str = "constant"
    seed: int = 0
    eval_every: int = 0
    checkpoint: str | Path | None = None
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {sorted(SCHEDULES)}")
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(kw_only=True)
class TrainHooks:
    """Where a parallel trainer changes the loop; the defaults train in one process.

    Attributes:
        param_groups: the optimizer's parameter groups for a model (default: one group of
            ``model.parameters()``), e.g. to keep replicated and sharded parameters apart.
        after_backward: called after each backward, before clipping (gradient reduction).
        clip_gradients: clips the gradients to a norm (default
            ``torch.nn.utils.clip_grad_norm_`` over ``model.parameters()``); a sharded
            model needs the norm reduced over its ranks.
        skip_step: called after clipping; True skips this step's optimizer update (an
            overflow under loss scaling). The loss and learning rate are still recorded and
            the schedule still advances, so the learning rate stays a function of the step.
    """

    param_groups: Callable[[nn.Module], list[dict[str, Any]]] | None = None
    after_backward: Callable[[nn.Module], None] | None = None
    clip_gradients: Callable[[nn.Module, float], None] | None = None
    skip_step: Callable[[nn.Module], bool] | None = None


@dataclass(kw_only=True)
class TrainResult:
    """What a run measured; systems subclass it to add their own final metrics.

    Attributes:
        params: parameters of the model.
        losses: training loss of every step taken.
        lrs: learning rate of every step taken.
        lr_cycles: the last step of each schedule cycle: ``[steps]`` unless a resume
            extended the run.
        steps_done: steps taken (those of a resumed checkpoint included).
        diverged_at: the step whose loss was not finite (training stopped there), or None.
        seconds: wall-clock time of the whole run (a resumed run's earlier time included).
        eval_history: ``(step, metrics)`` every ``eval_every`` steps.
        final_metrics: the evaluation after the last step; None when the run stopped early
            or there was no evaluation.
        model: the trained model, in eval mode (None once dropped, e.g. to ship a result
            between processes).
    """

    params: int = 0
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    lr_cycles: list[int] = field(default_factory=list)
    steps_done: int = 0
    diverged_at: int | None = None
    seconds: float = 0.0
    eval_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    final_metrics: dict[str, float] | None = None
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """Whether every planned step ran (no divergence, no early stop)."""
        return (self.diverged_at is None and bool(self.lr_cycles)
                and self.steps_done == self.lr_cycles[-1])


@dataclass(frozen=True, kw_only=True)
class CheckpointFormat:
    """The tag, version and resume rules of one trainer's checkpoints.

    Attributes:
        tag: stored under ``"format"``; a file with another tag is refused.
        version: stored under ``"version"``; a file of another version is refused.
        description: what such a file is, for messages ("a furnace ... checkpoint").
        resume_free_fields: config fields a resumed run may change (where checkpoints go,
            what is evaluated); every other field shapes the model or the trajectory.
        steps_rule: why ``steps`` may grow but not shrink, for the mismatch message.
    """

    tag: str
    version: int
    description: str
    resume_free_fields: tuple[str, ...] = ("checkpoint", "checkpoint_every")
    steps_rule: str = STEPS_RULE


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

    def __init__(self, path: str | Path, differences: list[tuple[str, Any, Any]],
                 steps_rule: str = STEPS_RULE) -> None:
        self.differences = differences
        listed = ", ".join(f"{name} {old!r} (checkpoint) vs {new!r} (now)"
                           for name, old, new in differences)
        reason = f"written by a run with other settings: {listed}"
        if any(name == "steps" for name, _, _ in differences):
            reason += f"; {steps_rule}"
        super().__init__(path, reason + "; resume with the checkpoint's settings or start "
                         "over with overwrite")


def config_record(config: Any) -> dict[str, Any]:
    """A config dataclass as plain data (what a weights-only load can read back)."""
    record = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for name, value in record.items():
        if isinstance(value, Path):
            record[name] = str(value)
    return record


def _same(old: Any, new: Any) -> bool:
    # a tuple and a list are the same sequence (a config may be built from either); a bool
    # is not the int 1
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    return bool(old == new)


def load_checkpoint(path: str | Path, fmt: CheckpointFormat) -> dict[str, Any]:
    """Read and check a checkpoint of format ``fmt``; return its state.

    Only tensors and plain data are unpickled (``weights_only``), so a foreign pickle cannot
    run code here.

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: unreadable, truncated, of another format or version, or
            with an inconsistent record.
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
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # RuntimeError, UnpicklingError, OSError, IndexError, ...
        raise CorruptCheckpointError(
            path, f"is not a readable torch checkpoint (truncated, corrupt or holding more "
            f"than tensors and plain data: {type(exc).__name__})") from exc
    check_checkpoint_state(state, path, fmt)
    return state


def check_checkpoint_state(state: Any, path: str | Path, fmt: CheckpointFormat, *,
                           required: tuple[str, ...] = _REQUIRED_KEYS) -> None:
    """Raise `CorruptCheckpointError` unless ``state`` is a record of format ``fmt`` with the
    ``required`` keys and a consistent step, cycle and loss record (what `load_checkpoint`
    checks after reading; a store that keeps the tensors elsewhere passes
    ``required=RECORD_KEYS``)."""
    path = Path(path)
    if not isinstance(state, dict) or state.get("format") != fmt.tag:
        raise CorruptCheckpointError(path, f"is not {fmt.description} "
                                     f"(no format tag {fmt.tag!r})")
    if state.get("version") != fmt.version:
        raise CorruptCheckpointError(path, f"has checkpoint version {state.get('version')!r}; "
                                     f"this furnace reads version {fmt.version}")
    missing = [key for key in required if key not in state]
    if missing:
        raise CorruptCheckpointError(path, f"lacks {', '.join(missing)}")
    step, cycles = state["step"], state["cycles"]
    valid = (isinstance(state["config"], dict) and isinstance(step, int) and step >= 0
             and isinstance(cycles, list) and bool(cycles)
             and all(isinstance(c, int) for c in cycles)
             and all(a < b for a, b in zip([0, *cycles], cycles, strict=False))
             and step <= cycles[-1] and state["config"].get("steps") == cycles[-1]
             and len(state["losses"]) == step
             and len(state["lrs"]) == step)
    if not valid:
        raise CorruptCheckpointError(path, "has an inconsistent step, cycle or loss record")


def check_resumable(config: Any, state: dict[str, Any], path: str | Path,
                    fmt: CheckpointFormat) -> None:
    """Raise `CheckpointMismatchError` unless ``config`` may continue the run of ``state``.

    Every field of the config dataclass but ``fmt.resume_free_fields`` must equal the
    checkpoint's; ``steps`` may be larger than the checkpoint's run (the run is then
    extended), never smaller.
    """
    stored = state["config"]
    differences = []
    for f in dataclasses.fields(config):
        if f.name in fmt.resume_free_fields:
            continue
        # a field newer than the checkpoint had its default in the run that wrote it
        if f.name in stored:
            old = stored[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            old = f.default_factory()
        else:
            old = f.default
        new = getattr(config, f.name)
        if f.name == "steps":
            if isinstance(old, int) and new < old:
                differences.append((f.name, old, new))
        elif not _same(old, new):
            differences.append((f.name, old, new))
    if differences:
        raise CheckpointMismatchError(path, differences, fmt.steps_rule)


class CheckpointStore(Protocol):
    """Where the loop's checkpoints live (default `FileCheckpointStore`).

    A checkpoint is the loop's *record* (format, version, config, cycles, scheduler, both
    RNG states, curves, step, seconds: ``RECORD_KEYS``, plain data and small tensors) plus
    the model's and optimizer's tensors. The loop reads the record before any model exists
    (so every resume rule is checked first), writes both at each checkpoint step, and
    restores the tensors once the model and optimizer are built.
    """

    def check_target(self, path: Path) -> None:
        """Raise `OutputError` if ``path`` is of the wrong kind (a folder for a file)."""

    def read(self, path: Path, fmt: CheckpointFormat) -> dict[str, Any]:
        """The checked record at ``path`` (`CheckpointNotFoundError`,
        `CorruptCheckpointError`)."""

    def write(self, path: Path, record: dict[str, Any], model: nn.Module,
              optimizer: torch.optim.Optimizer) -> None:
        """Replace the checkpoint at ``path`` by ``record`` and the tensors, atomically."""

    def restore(self, path: Path, record: dict[str, Any], model: nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
        """Load the model's and optimizer's tensors of the checkpoint ``record`` came from."""


class FileCheckpointStore:
    """One ``torch.save`` file holding the record and the tensors (the loop's default)."""

    def check_target(self, path: Path) -> None:
        if path.is_dir():
            raise OutputError(f"checkpoint {path} is a folder, not a file")

    def read(self, path: Path, fmt: CheckpointFormat) -> dict[str, Any]:
        return load_checkpoint(path, fmt)

    def write(self, path: Path, record: dict[str, Any], model: nn.Module,
              optimizer: torch.optim.Optimizer) -> None:
        checkpoint = {**record, "model": model.state_dict(),
                      "optimizer": optimizer.state_dict()}
        atomic_save(path, lambda f: torch.save(checkpoint, f))

    def restore(self, path: Path, record: dict[str, Any], model: nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
        model.load_state_dict(record["model"])
        optimizer.load_state_dict(record["optimizer"])


def prepare_checkpoint(checkpoint: str | Path | None, run_config: Any, fmt: CheckpointFormat,
                       *, resume: bool = False, overwrite: bool = False,
                       store: CheckpointStore | None = None) -> dict[str, Any] | None:
    """Every check the loop makes on its checkpoint, before any training; the state to resume.

    Returns the loaded state when resuming, else None. Creates the checkpoint's folder if
    needed and checks that it is writable. ``store`` says where checkpoints live (default
    `FileCheckpointStore`).

    Raises:
        ValueError: ``resume`` without a checkpoint, or ``resume`` with ``overwrite``.
        CheckpointExistsError: not resuming, the file exists and ``overwrite`` is False.
        CheckpointNotFoundError, CorruptCheckpointError, CheckpointMismatchError: on resume.
        OutputError: the checkpoint's folder cannot be created or written.
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: resume continues the "
                         "checkpoint's run, overwrite replaces it with a new one")
    if checkpoint is None:
        if resume:
            raise ValueError("resume needs config.checkpoint")
        return None
    path = Path(checkpoint)
    store = store if store is not None else FileCheckpointStore()
    store.check_target(path)
    state = None
    if resume:
        state = store.read(path, fmt)
        check_resumable(run_config, state, path, fmt)
    elif path.exists() and not overwrite:
        raise CheckpointExistsError(path, "exists; resume it or pass overwrite=True to "
                                    "replace it with a new run")
    check_writable_dir(path.parent if str(path.parent) else Path("."))
    return state


def _cycle_containing(cycles: list[int], step: int) -> tuple[int, int]:
    """(first step - 1, last step) of the schedule cycle that drives ``step``."""
    start = 0
    for end in cycles:
        if step <= end:
            return start, end
        start = end
    return start, cycles[-1]


class _Schedule:
    """The scheduler of the current cycle, rebuilt at each cycle end (a warm restart)."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: TrainLoopConfig) -> None:
        self.optimizer = optimizer
        self.config = config
        self.factory = SCHEDULES[config.schedule]
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    def start_cycle(self, length: int) -> None:
        if self.factory is not None:
            self.scheduler = self.factory(self.optimizer, self.config.lr, length)

    def step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scheduler is None else self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state)


def _evaluate(evaluate: Callable[[Model], dict[str, float]], model: Model) -> dict[str, float]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return dict(evaluate(model))
    finally:
        model.train(was_training)


Progress = Callable[[int, dict[str, float]], None]


def progress_bar(progress: Any, *, total: int, label: str) -> Progress:
    """A loop callback that drives a bar of a ``rich.progress.Progress`` (or anything with
    its ``add_task``/``update``): the bar is made at the first step run, so a resumed run's
    bar starts where the run was, and shows the latest loss. The loop itself only ever
    sees the callback."""
    bar: Any = None

    def update(step: int, metrics: dict[str, float]) -> None:
        nonlocal bar
        if bar is None:
            bar = progress.add_task(label, total=total, completed=step - 1)
        progress.update(bar, advance=1, description=f"{label} loss {metrics['loss']:.3f}")

    return update


def train_loop(config: TrainLoopConfig, *, build_model: Callable[[], Model],
               batches: Callable[[torch.Generator], Iterator[Batch]],
               loss: Callable[[Model, Batch], torch.Tensor],
               result: Result,
               evaluate: Callable[[Model], dict[str, float]] | None = None,
               hooks: TrainHooks | None = None,
               progress: Callable[[int, dict[str, float]], None] | None = None,
               run_config: Any = None, checkpoint_format: CheckpointFormat | None = None,
               resume: bool = False, overwrite: bool = False,
               stop_at: int | None = None,
               checkpoint_store: CheckpointStore | None = None) -> Result:
    """Train the model ``build_model`` returns; fill and return ``result``.

    Order: the stop and checkpoint checks (`prepare_checkpoint`), then ``batches(generator)``
    (so it can refuse data that cannot serve the run before any model exists), then the
    model, built in the forked, seeded RNG. Each step: ``loss(model, batch)``; a loss that is
    not finite stops the run (``diverged_at``) before any update; backward, the
    ``after_backward`` hook, clipping, the optimizer and schedule steps; evaluation every
    ``eval_every`` steps; a checkpoint every ``checkpoint_every`` steps and at the last
    step; then ``progress(step, metrics)`` with ``metrics["loss"]``, ``metrics["lr"]`` and
    that step's evaluation. After the last step the model is evaluated once more (reusing a
    periodic evaluation of that step) into ``final_metrics``.

    Args:
        build_model: a fresh model; called with the global RNG forked and seeded.
        batches: endless batches drawn from the generator it is given, and from nothing
            else, so that generator's state is all a checkpoint needs of the data.
        loss: the scalar training loss of a batch (may record side information).
        result: a `TrainResult` (or a subclass instance) to fill.
        evaluate: metrics of the model, called in eval mode under ``torch.no_grad``; it must
            not draw from the global RNG.
        hooks: see `TrainHooks`.
        progress: called after each step with the step (from 1) and its metrics.
        run_config: the dataclass stored in checkpoints and checked on resume (default
            ``config``); it must have a ``steps`` field equal to ``config.steps``.
        checkpoint_format: required when ``config.checkpoint`` is set.
        resume: continue from ``config.checkpoint`` (a larger ``steps`` extends the run).
        overwrite: without ``resume``, replace an existing checkpoint.
        stop_at: stop after this step without the final evaluation (an interruption, for
            tests and for splitting a run); the schedule's horizon stays ``config.steps``.
        checkpoint_store: where checkpoints live (default `FileCheckpointStore`, one file).

    Raises:
        ValueError: a bad ``stop_at`` or missing ``checkpoint_format``; CheckpointError (and
        subclasses) and OutputError: see `prepare_checkpoint`.
    """
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int)
                                or stop_at < 1):
        raise ValueError(f"stop_at must be None or a positive int, got {stop_at!r}")
    run_config = config if run_config is None else run_config
    assert run_config.steps == config.steps, "run_config.steps must equal config.steps"
    if config.checkpoint is not None and checkpoint_format is None:
        raise ValueError("a checkpoint needs a checkpoint_format")
    hooks = hooks or TrainHooks()
    store = checkpoint_store if checkpoint_store is not None else FileCheckpointStore()
    state = None
    if checkpoint_format is not None:
        state = prepare_checkpoint(config.checkpoint, run_config, checkpoint_format,
                                   resume=resume, overwrite=overwrite, store=store)
    elif resume:
        raise ValueError("resume needs config.checkpoint and a checkpoint_format")
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    data = batches(generator)
    path = None if config.checkpoint is None else Path(config.checkpoint)
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only: torch.manual_seed would also queue a seed for CUDA, which
        # fork_rng(devices=[]) does not restore
        torch.default_generator.manual_seed(config.seed)
        model = build_model()
        groups = (hooks.param_groups(model) if hooks.param_groups is not None
                  else [{"params": list(model.parameters())}])
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas,
                                      weight_decay=config.weight_decay)
        result.params = sum(p.numel() for p in model.parameters())
        schedule = _Schedule(optimizer, config)
        if state is None:
            cycles = [config.steps]
            schedule.start_cycle(config.steps)
        else:
            old_cycles = list(state["cycles"])
            cycles = old_cycles + ([config.steps] if config.steps > old_cycles[-1] else [])
            try:
                done = state["step"]
                spent = done == old_cycles[-1] and config.steps > done
                if not spent:
                    # built before the optimizer's state is loaded, so that state's learning
                    # rate and betas, not the new scheduler's first ones, drive the next step
                    start, end = _cycle_containing(cycles, min(done + 1, cycles[-1]))
                    schedule.start_cycle(end - start)
                assert path is not None
                store.restore(path, state, model, optimizer)
                if spent:
                    # the checkpoint's schedule is spent: a new cycle starts from its
                    # optimizer, exactly as the loop starts one at a cycle end
                    schedule.start_cycle(config.steps - done)
                else:
                    schedule.load_state_dict(state["scheduler"])
                generator.set_state(state["generator"])
                torch.set_rng_state(state["torch_rng"])
            except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                raise CorruptCheckpointError(
                    path or "", f"does not fit this config's model or optimizer "
                    f"({type(exc).__name__})") from exc
            result.losses = list(state["losses"])
            result.lrs = list(state["lrs"])
            result.eval_history = [(int(s), dict(m)) for s, m in state.get("eval_history", [])]
            result.steps_done = done
            # time already spent counts, so a resumed run reports the whole run's seconds
            started -= state["seconds"]
        result.lr_cycles = list(cycles)
        cycle_ends = set(cycles[:-1])
        end = config.steps if stop_at is None else min(stop_at, config.steps)
        model.train()
        for step in range(result.steps_done + 1, end + 1):
            loss_value_t = loss(model, next(data))
            loss_value = loss_value_t.item()
            if not math.isfinite(loss_value):
                # the weights are past saving: stop, not train on
                result.diverged_at = step
                break
            optimizer.zero_grad(set_to_none=True)
            loss_value_t.backward()  # type: ignore[no-untyped-call]
            if hooks.after_backward is not None:
                hooks.after_backward(model)
            if hooks.clip_gradients is not None:
                hooks.clip_gradients(model, config.clip)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            lr = float(optimizer.param_groups[0]["lr"])
            result.lrs.append(lr)
            if hooks.skip_step is None or not hooks.skip_step(model):
                optimizer.step()
            schedule.step()
            if step in cycle_ends:
                # a resume extended the run: the next steps follow a fresh cycle
                schedule.start_cycle(cycles[cycles.index(step) + 1] - step)
            result.losses.append(loss_value)
            result.steps_done = step
            metrics = {"loss": loss_value, "lr": lr}
            if evaluate is not None and config.eval_every and step % config.eval_every == 0:
                measured = _evaluate(evaluate, model)
                result.eval_history.append((step, measured))
                metrics.update(measured)
            if path is not None and (step == end or (config.checkpoint_every
                                                     and step % config.checkpoint_every == 0)):
                _save(store, path, checkpoint_format, run_config, cycles, model, optimizer,
                      schedule, generator, result, time.perf_counter() - started)
            if progress is not None:
                progress(step, metrics)
        if evaluate is not None and result.finished:
            last = result.eval_history[-1] if result.eval_history else None
            result.final_metrics = (dict(last[1]) if last is not None
                                    and last[0] == result.steps_done
                                    else _evaluate(evaluate, model))
    model.eval()
    result.model = model
    result.seconds = time.perf_counter() - started
    return result


def _save(store: CheckpointStore, path: Path, fmt: CheckpointFormat | None, run_config: Any,
          cycles: list[int], model: nn.Module, optimizer: torch.optim.Optimizer,
          schedule: _Schedule, generator: torch.Generator, result: TrainResult,
          seconds: float) -> None:
    assert fmt is not None
    checkpoint = {"format": fmt.tag, "version": fmt.version,
                  "config": config_record(run_config), "cycles": list(cycles),
                  "scheduler": schedule.state_dict(), "generator": generator.get_state(),
                  "torch_rng": torch.get_rng_state(), "losses": list(result.losses),
                  "lrs": list(result.lrs), "step": result.steps_done, "seconds": seconds}
    if result.eval_history:
        checkpoint["eval_history"] = [(s, dict(m)) for s, m in result.eval_history]
    store.write(path, checkpoint, model, optimizer)
