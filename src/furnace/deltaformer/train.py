"""Training recipes for DeltaFormer (Xu et al., NeurIPS 2025) and its same-size Transformer.

Implements the two training recipes of design note `deltaformer.md` Sec. 7 on the shared
loop `furnace.runtime.training.train_loop`:

- (b) state tracking, paper Sec. 4.1 (swap task) and App. D (parity, modular arithmetic), plus
  the S5 word problem: fresh sequences every step from `furnace.deltaformer.tasks`,
  per-position cross-entropy on the task labels, evaluated on fresh sequences by token
  accuracy and last-position accuracy (the honest metric: early positions are lookups).
- (c) the byte-level LM of the paper's LM experiments, on the Python stdlib's sources
  (`furnace.runtime.corpus`), evaluated by mean validation cross-entropy in nats/byte.

Both use AdamW with a OneCycle learning rate and gradient clipping. The checkpoint rules are
the loop's (README "Checkpoints"): no silent overwrite, a missing file on resume is an error,
the config is stored and checked on resume except where checkpoints go and what is evaluated
(`RESUME_FREE_FIELDS`), a corrupt file raises `CorruptCheckpointError` naming it, and a
larger ``steps`` on resume appends a second OneCycle cycle over the added steps (a warm
restart; deterministic, but not the run a fresh ``steps=M`` would give).
"""

from __future__ import annotations

import dataclasses
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

from furnace.runtime import training
from furnace.runtime.launch import torch_threads
from furnace.runtime.training import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointFormat,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Progress,
    TrainLoopConfig,
    TrainResult,
    config_record,
    train_loop,
)

from .config import LM_TASK, TrainConfig
from .model import SequenceModel
from .tasks import get_task

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "RESUME_FREE_FIELDS",
    "STEPS_RULE",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "DeltaFormerTrainResult",
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

CHECKPOINT_FORMAT = "furnace.deltaformer.train"
# 1: the first tagged format (config, OneCycle cycle ends and learning rates stored)
CHECKPOINT_VERSION = 1
# Fields a resumed run may change: where checkpoints go and what is evaluated after the
# last step (max_len, which eval_lengths raises, holds no parameters). Every other field
# shapes the model or the trajectory, so changing it would make the resumed run another run.
RESUME_FREE_FIELDS = ("checkpoint", "checkpoint_every", "eval_sequences", "eval_lengths")
STEPS_RULE = ("steps may grow on resume (a second OneCycle cycle over the added steps) but "
              "not shrink: a OneCycle schedule's learning rate at every step depends on its "
              "total steps")
FORMAT = CheckpointFormat(tag=CHECKPOINT_FORMAT, version=CHECKPOINT_VERSION,
                          description="a furnace deltaformer training checkpoint",
                          resume_free_fields=RESUME_FREE_FIELDS, steps_rule=STEPS_RULE)


@dataclass(kw_only=True)
class DeltaFormerTrainResult(TrainResult):
    """What a run measured. Accuracies are for tasks (``last_acc_at``: the last-position
    accuracy at each of ``config.eval_lengths``), ``val_loss`` for the LM; metrics are None
    when the run stopped before its last step (``stop_at``) or diverged (``diverged_at``: the
    step whose loss was not finite; training stops there). ``lrs`` is the learning rate of
    each step taken and ``lr_cycles`` the last step of each OneCycle cycle: ``[steps]``
    unless a resume extended the run."""

    config: TrainConfig
    token_acc: float | None = None
    last_acc: float | None = None
    last_acc_at: dict[int, float] = field(default_factory=dict)
    val_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data (the model and the loop's evaluation fields left out)."""
        config = dataclasses.asdict(self.config)
        config["checkpoint"] = (None if self.config.checkpoint is None
                                else str(self.config.checkpoint))
        return {"config": config, "params": self.params, "losses": list(self.losses),
                "steps_done": self.steps_done, "token_acc": self.token_acc,
                "last_acc": self.last_acc, "last_acc_at": dict(self.last_acc_at),
                "val_loss": self.val_loss, "diverged_at": self.diverged_at,
                "seconds": self.seconds, "lrs": list(self.lrs),
                "lr_cycles": list(self.lr_cycles)}


class TrainDataError(ValueError):
    """The training data cannot serve the config (an LM context longer than a split)."""


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

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
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
    return config_record(config)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint written by `train`; return its state.

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: unreadable, truncated, not this trainer's, or another version.
    """
    return training.load_checkpoint(path, FORMAT)


def check_resumable(config: TrainConfig, state: dict[str, Any], path: str | Path) -> None:
    """Raise `CheckpointMismatchError` unless ``config`` may continue the run of ``state``.

    Every field but `RESUME_FREE_FIELDS` must equal the checkpoint's; ``steps`` may be
    larger than the checkpoint's run (the run is then extended), never smaller.
    """
    training.check_resumable(config, state, path, FORMAT)


def prepare_checkpoint(config: TrainConfig, *, resume: bool = False,
                       overwrite: bool = False) -> dict[str, Any] | None:
    """Every check `train` makes on its checkpoint, before any training; the state to resume.

    Returns the loaded state when resuming, else None (see
    `furnace.runtime.training.prepare_checkpoint`).
    """
    return training.prepare_checkpoint(config.checkpoint, config, FORMAT, resume=resume,
                                       overwrite=overwrite)


def loop_config(config: TrainConfig) -> TrainLoopConfig:
    """The shared loop's part of a run: AdamW, OneCycle, clipping, seed, checkpoints."""
    return TrainLoopConfig(steps=config.steps, lr=config.lr, weight_decay=config.weight_decay,
                           betas=config.betas, clip=config.clip, schedule="one_cycle",
                           seed=config.seed, checkpoint=config.checkpoint,
                           checkpoint_every=config.checkpoint_every)


def train(config: TrainConfig, progress: Progress | None = None, *, resume: bool = False,
          overwrite: bool = False, stop_at: int | None = None) -> DeltaFormerTrainResult:
    """Train one model; return its loss curve and final metrics.

    The global torch RNG is forked and seeded with ``config.seed`` for the run (model
    initialisation draws from it), so the caller's RNG state is untouched. Every checkpoint
    check (`prepare_checkpoint`) runs before any training.

    Args:
        progress: ``progress(step, metrics)`` after every step, or None
            (`furnace.runtime.training.progress_bar` makes one that drives a rich bar).
        resume: continue from ``config.checkpoint``, which must exist and hold a run with
            the same config (`check_resumable`); a larger ``config.steps`` extends it.
        overwrite: without ``resume``, replace an existing ``config.checkpoint``.
        stop_at: stop after this step without evaluating (an interruption, for tests and
            for splitting a run); the OneCycle horizon stays ``config.steps``.

    Raises:
        CheckpointError (and its subclasses), OutputError, ValueError: see
        `prepare_checkpoint`; ValueError for a bad ``stop_at``; TrainDataError when the
        corpus cannot serve the config.
    """
    made: list[_Batches] = []

    def batches(generator: torch.Generator) -> _Batches:
        # first, in the loop: it refuses data that cannot serve the config before a model
        made.append(_Batches(config, generator))
        return made[-1]

    def loss(model: SequenceModel, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return _loss(model, *batch)[0]

    result = train_loop(loop_config(config), build_model=lambda: build_model(config),
                        batches=batches, loss=loss, result=DeltaFormerTrainResult(config=config),
                        progress=progress, run_config=config,
                        checkpoint_format=FORMAT, resume=resume, overwrite=overwrite,
                        stop_at=stop_at)
    if result.finished:
        evaluation_started = time.perf_counter()
        model = result.model
        assert isinstance(model, SequenceModel)
        if config.task == LM_TASK:
            result.val_loss = _evaluate_lm(model, made[-1])
        else:
            accuracy = {n: _evaluate_task(model, config, n)
                        for n in dict.fromkeys((config.length, *config.eval_lengths))}
            result.token_acc, result.last_acc = accuracy[config.length]
            result.last_acc_at = {n: accuracy[n][1] for n in config.eval_lengths}
        result.seconds += time.perf_counter() - evaluation_started
    return result


def _train_one_thread(config: TrainConfig) -> DeltaFormerTrainResult:
    with torch_threads(1):
        result = train(config)
    # the model stays behind: results cross processes and fill reproduce's cache
    result.model = None
    return result


def train_many(configs: Iterable[TrainConfig], workers: int | None = None,
               on_done: Callable[[DeltaFormerTrainResult], None] | None = None
               ) -> list[DeltaFormerTrainResult]:
    """Train each config single-threaded, ``workers`` at a time in spawned processes.

    One thread per run because these models are small: on the shared 2-core box two torch
    threads made a step 4x slower, while two single-threaded runs side by side each keep
    most of a core. Runs are seeded, so the results equal those of `train` one by one
    (without their ``model``); their ``seconds`` include the contention of running side by
    side.

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
    results: list[DeltaFormerTrainResult | None] = [None] * len(configs)
    if workers == 1 or len(configs) <= 1:
        for i, config in enumerate(configs):
            results[i] = result = _train_one_thread(config)
            if on_done is not None:
                on_done(result)
        return results  # type: ignore[return-value]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_train_one_thread, c): i for i, c in enumerate(configs)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = result = future.result()
                if on_done is not None:
                    on_done(result)
        except BaseException:
            # one failed run, Ctrl-C or SIGTERM (SystemExit from the CLI) must not wait for
            # the running and queued runs to train: cancel the queue, end the workers
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
            raise
    return results  # type: ignore[return-value]
