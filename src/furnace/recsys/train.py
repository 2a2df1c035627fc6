"""Training DLRM with pattern-aware sparse communication (He, Chen, Zhai, PPoPP '24 poster;
design note `recsys.md` Sec. 2.3-2.6), on local gloo ranks or as the ranks torchrun launched.

One run: profile the access counts of the first batches, let the performance model choose the
hot set within the memory budget (`plan.choose_hot_set`, for the hybrid scheme), train the
sharded model (`engine.ShardedTrainer`) with a progress bar on rank 0, then gather the trained
parameters and score a held-out split with the single-process reference model: log loss and
AUC. The held-out batches are never trained on: synthetic data draws them from their own
stream of batch indices, and a Criteo TSV file gives its lines after the training lines.

The engine keeps its own sparse optimizers (lazy row updates, owner-side state), so this loop
is not `furnace.runtime.training.train_loop` (an AdamW loop over dense parameters); it shares
that module's progress bar.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .batch import Batch
from .config import (
    SCHEMES,
    DataConfig,
    DataError,
    EngineConfig,
    ModelConfig,
    OptimizerConfig,
    PlanError,
    scaled_table_rows,
)

__all__ = ["RecsysTrainConfig", "RecsysTrainResult", "train_recsys"]

# synthetic held-out batches come from this far along the batch-index stream, past any run
HELD_OUT_FIRST_INDEX = 1 << 40


@dataclass(frozen=True)
class RecsysTrainConfig:
    """One training run.

    Attributes:
        world_size: ranks (local gloo processes; torchrun's world replaces it).
        scheme: one of `SCHEMES`; only "hybrid" replicates the planner's hot set.
        schedule: prefetch, overlap, pairwise rounds and the fused all-reduce (all on/off).
        steps: training steps.
        batch_size: global batch (a multiple of ``world_size``).
        eval_batches: held-out batches scored after training.
        profile_batches: training batches whose access counts the planner reads.
        row_scale: Criteo Kaggle's cardinalities times this (synthetic data).
        zipf_exponent: skew of the synthetic IDs.
        bag_size: mean IDs per bag (1: one-hot).
        embedding_dim: D.
        interaction: "dot" or "dcn".
        optimizer: sparse optimizer of the embedding rows.
        lr, dense_lr: learning rates of the rows and of the MLPs.
        hot_budget_mib: memory per rank the hot replicas (weights and optimizer state) may use.
        preset: the cluster the performance model plans for (`furnace.runtime.presets`).
        ranks_per_node: that cluster's ranks per node; on more ranks than one node holds, the
            engine's all-reduces are hierarchical (node, across nodes, node).
        data: a Criteo TSV file instead of synthetic data (None: synthetic).
        data_format: "hashed" (Criteo's hex categories, hashed into ``rows_per_table``) or
            "indexed" (categories already row indices below ``rows_per_table``).
        rows_per_table: rows of each of the 26 tables when reading ``data``.
        seed: data, initialisation.
    """

    world_size: int = 2
    scheme: str = "hybrid"
    schedule: bool = True
    steps: int = 100
    batch_size: int = 512
    eval_batches: int = 8
    profile_batches: int = 4
    row_scale: float = 1e-3
    zipf_exponent: float = 1.05
    bag_size: int = 1
    embedding_dim: int = 16
    interaction: str = "dot"
    optimizer: str = "rowwise_adagrad"
    lr: float = 0.05
    dense_lr: float = 0.05
    hot_budget_mib: float = 8.0
    preset: str = "h100-ib"
    ranks_per_node: int = 8
    data: str | None = None
    data_format: str = "hashed"
    rows_per_table: int = 10000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("world_size", "steps", "batch_size", "eval_batches", "profile_batches",
                     "ranks_per_node", "rows_per_table"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(name, f"must be an integer >= 1, got {value!r}")
        if self.scheme not in SCHEMES:
            raise PlanError("scheme", f"must be one of {', '.join(SCHEMES)}, "
                            f"got {self.scheme!r}")
        if self.batch_size % self.world_size:
            raise PlanError("batch_size", f"must be a multiple of the {self.world_size} ranks, "
                            f"got {self.batch_size}")
        if self.world_size % min(self.ranks_per_node, self.world_size):
            # nodes must split the ranks evenly, for the plan and the hierarchical all-reduce
            raise PlanError("ranks_per_node", f"must divide the {self.world_size} ranks (or "
                            f"be at least them), got {self.ranks_per_node}")
        if not (math.isfinite(self.hot_budget_mib) and self.hot_budget_mib >= 0):
            raise PlanError("hot_budget_mib", f"must be >= 0 MiB, got {self.hot_budget_mib!r}")
        if self.data_format not in ("hashed", "indexed"):
            raise DataError("data_format", f"must be 'hashed' or 'indexed', got "
                            f"{self.data_format!r}")
        if self.profile_batches > self.steps:
            raise PlanError("profile_batches", f"must be at most the {self.steps} steps "
                            f"(the planner profiles training batches), got "
                            f"{self.profile_batches}")
        # the dataclasses below check their own fields
        self.model_config()
        self.optimizer_config()
        if self.data is None:
            self.data_config()

    def data_config(self, table_rows: tuple[int, ...] | None = None) -> DataConfig:
        if table_rows is None:
            table_rows = scaled_table_rows(self.row_scale)
        return DataConfig(table_rows=table_rows, zipf_exponent=self.zipf_exponent,
                          bag_size=self.bag_size, seed=self.seed)

    def model_config(self) -> ModelConfig:
        d = self.embedding_dim
        return ModelConfig(embedding_dim=d, bottom_mlp=(64, d), top_mlp=(64, 1),
                           interaction=self.interaction)

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(sparse=self.optimizer, lr=self.lr, dense_lr=self.dense_lr)

    def engine_config(self) -> EngineConfig:
        if self.schedule:
            return EngineConfig.scheduled(self.scheme)
        return EngineConfig(scheme=self.scheme)

    def for_world(self, world_size: int) -> RecsysTrainConfig:
        return RecsysTrainConfig(**{**asdict(self), "world_size": world_size})


@dataclass
class RecsysTrainResult:
    """What a run measured (rank 0's view).

    Attributes:
        losses: global mean training loss of every step.
        eval_logloss, eval_auc: on the held-out split, after training.
        hot_rows: rows the hybrid scheme replicated (0 for the other schemes).
        hot_reason: the planner's reason for its choice.
        bytes_per_step: bytes sent per step by each phase, summed over ranks (CommLog).
        busiest_rank_bytes_per_step: the most any one rank sent per step.
        seconds: wall time of the training steps.
    """

    losses: list[float] = field(default_factory=list)
    eval_logloss: float = math.nan
    eval_auc: float = math.nan
    hot_rows: int = 0
    hot_reason: str = ""
    bytes_per_step: dict[str, float] = field(default_factory=dict)
    busiest_rank_bytes_per_step: float = 0.0
    seconds: float = 0.0
    world_size: int = 1
    rank: int = 0


def load_batches(config: RecsysTrainConfig) -> tuple[DataConfig, list[Batch], list[Batch]]:
    """The data config, the training batches and the held-out batches.

    Everything is read or generated here, before any rank starts, so a malformed line or a
    file too short for the run is refused first (`DataError`, naming the line).
    """
    from .data import CriteoTSVReader, SyntheticClickLog

    if config.data is None:
        data = config.data_config()
        log = SyntheticClickLog(data)
        train = list(log.batches(config.batch_size, config.steps))
        held_out = list(log.batches(config.batch_size, config.eval_batches,
                                    start=HELD_OUT_FIRST_INDEX))
        return data, train, held_out
    rows = tuple([config.rows_per_table] * 26)
    data = DataConfig(table_rows=rows, seed=config.seed)
    reader = CriteoTSVReader(config.data, table_rows=rows, batch_size=config.batch_size,
                             hashed=config.data_format == "hashed")
    wanted = config.steps + config.eval_batches
    batches: list[Batch] = []
    for batch in reader:
        if batch.batch_size < config.batch_size:
            break  # the last partial batch: the run uses whole batches only
        batches.append(batch)
        if len(batches) == wanted:
            break
    if len(batches) < wanted:
        raise DataError("data", f"{config.data} holds {len(batches)} whole batches of "
                        f"{config.batch_size} lines; the run needs {wanted} "
                        f"({config.steps} steps + {config.eval_batches} held out)")
    return data, batches[:config.steps], batches[config.steps:]


def _plan(config: RecsysTrainConfig, data: DataConfig, train: list[Batch]) -> tuple[Any, str]:
    from furnace.runtime.presets import get_preset

    from .data import access_counts
    from .perfmodel import ClusterModel
    from .plan import choose_hot_set, make_plan, profile_probabilities

    base = make_plan(config.scheme, table_rows=data.table_rows, world_size=config.world_size)
    if config.scheme != "hybrid":
        return base, "baseline scheme: no replication"
    from .engine import needs_touched_counts
    from .model import dense_parameter_count

    counts = access_counts(train[:config.profile_batches], data.table_rows)
    topology = get_preset(config.preset, gpus_per_node=config.ranks_per_node)
    model = config.model_config()
    choice = choose_hot_set(
        profile_probabilities(counts, data.table_rows), plan_base=base,
        batch_size_per_rank=config.batch_size // config.world_size,
        embedding_dim=config.embedding_dim,
        cluster=ClusterModel.from_topology(topology, config.world_size),
        memory_budget_bytes=config.hot_budget_mib * 2**20, optimizer=config.optimizer,
        bag_size=config.bag_size, fuse_allreduce=config.schedule,
        touched_counts=needs_touched_counts(config.optimizer_config()),
        dense_param_count=dense_parameter_count(model, data.num_dense, data.num_tables))
    plan = make_plan(config.scheme, table_rows=data.table_rows, world_size=config.world_size,
                     hot_rows=choice.hot_rows)
    return plan, choice.reason


def train_rank(config: RecsysTrainConfig, *, progress: Any = None) -> RecsysTrainResult:
    """This rank's part of the run (inside a process group of ``config.world_size``)."""
    import torch.distributed as dist

    from .engine import ShardedTrainer
    from .naive import ReferenceTrainer, roc_auc

    data, train, held_out = load_batches(config)
    plan, reason = _plan(config, data, train)
    trainer = ShardedTrainer(data, config.model_config(), config.optimizer_config(), plan,
                             config.engine_config(), seed=config.seed,
                             ranks_per_node=min(config.ranks_per_node, config.world_size))
    result = RecsysTrainResult(hot_rows=len(plan.hot_rows), hot_reason=reason,
                               world_size=config.world_size, rank=dist.get_rank())
    start = time.perf_counter()
    for step, batch in enumerate(train):
        upcoming = train[step + 1] if step + 1 < len(train) else None
        loss = trainer.step(batch, upcoming)
        result.losses.append(float(loss))
        if progress is not None:
            progress(step + 1, {"loss": float(loss)})
    result.seconds = time.perf_counter() - start
    # a record's rank is its group's (a node or cross-node group on two levels): sum this
    # rank's own records, then gather the sums
    mine = torch.tensor([float(sum(r.bytes_sent for r in trainer.comm_log.records))],
                        dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(config.world_size)]
    dist.all_gather(gathered, mine)
    per_rank = [float(g) for g in gathered]
    log = trainer.comm_log.gather()
    per_phase: dict[str, float] = {}
    for record in log.records:
        per_phase[record.group] = per_phase.get(record.group, 0.0) + record.bytes_sent
    result.bytes_per_step = {k: v / config.steps for k, v in per_phase.items()}
    result.busiest_rank_bytes_per_step = max(per_rank) / config.steps
    params = trainer.full_parameters()
    if result.rank == 0:
        reference = ReferenceTrainer(data, config.model_config(), config.optimizer_config(),
                                     seed=config.seed, dtype=torch.float32)
        reference.load_parameters(params)
        losses, labels, scores = [], [], []
        for batch in held_out:
            loss, logits = reference.evaluate(batch)
            losses.append(float(loss))
            labels.append(batch.labels.numpy())
            scores.append(logits.detach().numpy())
        result.eval_logloss = float(np.mean(losses))
        result.eval_auc = roc_auc(np.concatenate(labels), np.concatenate(scores))
    return result


def _rank_main(rank: int, world_size: int, config: RecsysTrainConfig,
               show_progress: bool) -> RecsysTrainResult:
    if not (show_progress and rank == 0):
        return train_rank(config)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from furnace.runtime.training import progress_bar

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()) as bar:
        label = f"DLRM {config.scheme} W={world_size}"
        return train_rank(config, progress=progress_bar(bar, total=config.steps, label=label))


def train_recsys(config: RecsysTrainConfig, *, progress: bool = True,
                 timeout_s: float = 1800.0) -> RecsysTrainResult:
    """Train on ``config.world_size`` spawned local gloo ranks, or, under torchrun, as this
    rank of the launched world (whose size replaces ``config.world_size``). The data is
    checked before any rank starts or any group is joined. Returns rank 0's result (under
    torchrun: this rank's; only rank 0 holds the held-out metrics)."""
    from furnace.runtime.launch import init_from_env, is_torchrun, run_distributed

    if is_torchrun():
        config = config.for_world(int(os.environ["WORLD_SIZE"]))
        load_batches(config)
        with init_from_env(backend="gloo", timeout_s=timeout_s) as ctx:
            return _rank_main(ctx.rank, ctx.world_size, config, progress)
    load_batches(config)
    results = run_distributed(_rank_main, config.world_size, config, progress,
                              timeout_s=timeout_s)
    first: RecsysTrainResult = results[0]
    return first
