"""`furnace hybrid train`: the MoE language model trained under MoDa (BaGuaLu, Ma et al.,
PPoPP'22; issue 13, item 7) on local gloo ranks or under torchrun, with a progress bar,
sharded checkpoints that resume under another layout, and bf16 or fp16 mixed precision.

One run is `furnace.hybrid.moda.train_moda` (the runtime's `train_loop` under MoDa) on
every rank, with the same config, so the same seed builds the same global model and draws the
same global batches of the byte corpus (`furnace.runtime.corpus`); `moda_parallel` shards
its experts and rank r trains on rows ``[r*b, (r+1)*b)`` of every global batch of
``B = W*b`` sequences. The recorded loss of a step is the **global-batch** mean (one scalar
all-reduce; the gradient is still that of the rank's own shard, which `MoDa.reduce_gradients`
turns into the global one), so every rank records the same curve and a loss that is not
finite stops every rank at the same step.

Checkpoints are DCP folders (`furnace.hybrid.checkpoint`) written through the loop's
`CheckpointStore` protocol: the loop's record (config, cycles, RNG states, curves, and the
fp16 loss scaler's state) is the checkpoint's metadata, the model and optimizer tensors are
its shards. A resumed run may change the layout (``world_size``, ``expert_parallel_size``
and the topology shape: DCP reshards the experts) but nothing that shapes the model or the
trajectory; every rule is checked in the launching process before a rank is spawned.

Precision (`furnace.hybrid.precision`): ``bf16`` is autocast with fp32 gate, norms and
loss; ``fp16`` adds `DynamicLossScaler`. The hook order of a step under MoDa is
``backward -> reduce_gradients -> unscale (world-wide overflow flag) -> global clip ->
optimizer step or skip``. Reduce before unscale: unscaling is linear, so the order does not
change a finite gradient, but checking the *reduced* gradients also catches an overflow
made by the reduction's sum, and the clip must see unscaled gradients. Reduction alone does
not spread an overflow to every rank: a replicated gradient's inf reaches the world through
the world all-reduce, but an expert shard's inf reaches only its expert-data-parallel group
(with P = W, no other rank). So the overflow flag is all-reduced with MAX over the world
(``sync_found_inf``), and every rank skips the same steps; otherwise the ranks that saw no
inf would step, and the replicated parameters would drift apart.

What follows the paper: MoDa training with bf16/fp16 matrix work and fp32 master weights.
What is reconstruction: this trainer, the checkpoint record and the resume rules (the
paper's code is not public).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from furnace.moe import GATES, MoELMConfig, MoETransformerLM
from furnace.runtime.atomic import OutputError
from furnace.runtime.topology import Topology
from furnace.runtime.training import (
    RECORD_KEYS,
    CheckpointFormat,
    TrainLoopConfig,
    TrainResult,
    check_checkpoint_state,
    prepare_checkpoint,
)

from .config import ConfigFieldError, require_positive_ints
from .layout import MoDaGroups, MoDaLayout
from .moda import GradientHook, MoDa, train_moda
from .naive import lm_loss
from .precision import LossScaleConfig, MixedPrecision, MixedPrecisionConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "HybridTrainConfig",
    "HybridTrainConfigError",
    "HybridTrainResult",
    "MAX_LOCAL_RANKS",
    "ModaCheckpointStore",
    "prepare_hybrid_checkpoint",
    "train_hybrid",
    "train_rank",
]

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
HALF_DTYPES: dict[str, Literal["bfloat16", "float16"]] = {"bf16": "bfloat16",
                                                          "fp16": "float16"}
# spawning more local gloo ranks than this is a typo, not a run
MAX_LOCAL_RANKS = 64
Batch = tuple[torch.Tensor, torch.Tensor]

# the layout may change on resume (DCP reshards); where checkpoints go and the resume
# switches are not part of the run either
RESUME_FREE_FIELDS = ("world_size", "expert_parallel_size", "ranks_per_node",
                      "nodes_per_supernode", "checkpoint", "checkpoint_every", "resume",
                      "overwrite")
CHECKPOINT_FORMAT = CheckpointFormat(
    tag="furnace.hybrid.train", version=1,
    description="a furnace hybrid train checkpoint (a DCP folder)",
    resume_free_fields=RESUME_FREE_FIELDS,
    steps_rule="steps may grow on resume but not shrink")


class HybridTrainConfigError(ConfigFieldError):
    """A `HybridTrainConfig` field has a value the run cannot use."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(kw_only=True)
class HybridTrainConfig:
    """One MoDa training run of the byte-level MoE LM (`furnace.moe.MoETransformerLM`)."""

    d_model: int = field(default=16, metadata=_help("residual width of the MoE LM"))
    num_layers: int = field(default=2, metadata=_help("transformer blocks, each with an MoE "
                                                      "layer"))
    num_heads: int = field(default=2, metadata=_help("attention heads (must divide "
                                                     "--d-model)"))
    num_experts: int = field(default=4, metadata=_help("experts per MoE layer (a multiple of "
                                                       "--expert-parallel-size)"))
    top_k: int = field(default=2, metadata=_help("experts per token"))
    d_hidden: int = field(default=32, metadata=_help("hidden width of each expert"))
    gate: str = field(default="naive", metadata={"help": "the MoE gate",
                                                 "choices": tuple(GATES)})
    seq_len: int = field(default=32, metadata=_help("bytes per training sequence"))
    world_size: int = field(default=2, metadata=_help(
        "local gloo ranks to spawn; ignored under torchrun, where its WORLD_SIZE rules"))
    expert_parallel_size: int | None = field(default=None, metadata=_help(
        "ranks that share one copy of every expert (P; default: the world size)"))
    ranks_per_node: int | None = field(default=None, metadata=_help(
        "ranks per node of the topology P must fit (default: no node constraint)"))
    nodes_per_supernode: int | None = field(default=None, metadata=_help(
        "nodes per supernode of the topology (default: no supernode level; needs "
        "--ranks-per-node)"))
    batch_size: int = field(default=8, metadata=_help(
        "global sequences per step, split into equal shards over the ranks"))
    steps: int = field(default=20, metadata=_help("optimizer steps"))
    lr: float = field(default=3e-3, metadata=_help("AdamW learning rate"))
    seed: int = field(default=0, metadata=_help("model initialisation and the batches"))
    precision: str = field(default="fp32", metadata={
        "help": "matrix-work precision: fp32, bf16 (autocast) or fp16 (autocast and dynamic "
        "loss scaling)", "choices": PRECISIONS})
    corpus_bytes: int = field(default=200_000, metadata=_help(
        "bytes of the stdlib corpus to train on"))
    checkpoint: str | None = field(default=None, metadata=_help(
        "a DCP checkpoint folder, written at --checkpoint-every and at the end"))
    checkpoint_every: int = field(default=0, metadata=_help(
        "steps between checkpoints (0: only at the end)"))
    resume: bool = field(default=False, metadata=_help(
        "continue the run in --checkpoint (any world and expert-parallel size)"))
    overwrite: bool = field(default=False, metadata=_help(
        "replace an existing --checkpoint with a new run"))

    def __post_init__(self) -> None:
        require_positive_ints(self, ("d_model", "num_layers", "num_heads", "num_experts",
                                     "top_k", "d_hidden", "seq_len", "batch_size", "steps",
                                     "corpus_bytes", "world_size"), HybridTrainConfigError)
        if self.world_size > MAX_LOCAL_RANKS:
            raise HybridTrainConfigError("world_size", f"must be at most {MAX_LOCAL_RANKS}, "
                                         f"got {self.world_size}")
        require_positive_ints(self, tuple(name for name in (
            "expert_parallel_size", "ranks_per_node", "nodes_per_supernode")
            if getattr(self, name) is not None), HybridTrainConfigError)
        if self.d_model % self.num_heads:
            raise HybridTrainConfigError("num_heads", f"must divide d_model={self.d_model}, "
                                         f"got {self.num_heads}")
        if self.top_k > self.num_experts:
            raise HybridTrainConfigError("top_k", f"must be at most num_experts="
                                         f"{self.num_experts}, got {self.top_k}")
        if self.gate not in GATES:
            raise HybridTrainConfigError("gate", f"must be one of {', '.join(GATES)}, got "
                                         f"{self.gate!r}")
        fixed = GATES[self.gate].fixed_top_k
        if fixed is not None and self.top_k != fixed:
            raise HybridTrainConfigError("top_k", f"must be {fixed} with gate {self.gate!r} "
                                         f"(a top-{fixed} gate), got {self.top_k}")
        if self.precision not in PRECISIONS:
            raise HybridTrainConfigError("precision", f"must be one of "
                                         f"{', '.join(PRECISIONS)}, got {self.precision!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise HybridTrainConfigError("lr", f"must be positive and finite, got {self.lr}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise HybridTrainConfigError("seed", f"must be an int >= 0, got {self.seed!r}")
        if self.nodes_per_supernode is not None and self.ranks_per_node is None:
            raise HybridTrainConfigError("nodes_per_supernode", "needs ranks_per_node")
        W, P = self.world_size, self.parallel_size
        if self.batch_size % W:
            raise HybridTrainConfigError("batch_size", f"must split into world_size={W} equal "
                                         f"shards, got {self.batch_size}")
        if self.num_experts % P:
            raise HybridTrainConfigError("expert_parallel_size", f"must divide num_experts="
                                         f"{self.num_experts}, got {P}")
        try:
            self.layout()
        except ValueError as exc:
            raise HybridTrainConfigError("expert_parallel_size", str(exc)) from None
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise HybridTrainConfigError("checkpoint_every", f"must be an int >= 0, got "
                                         f"{self.checkpoint_every!r}")
        if self.checkpoint is None:
            for name in ("resume", "overwrite"):
                if getattr(self, name):
                    raise HybridTrainConfigError(name, "needs checkpoint (a folder)")
            if self.checkpoint_every:
                raise HybridTrainConfigError("checkpoint_every", "needs checkpoint (a folder)")
        if self.resume and self.overwrite:
            raise HybridTrainConfigError("overwrite", "cannot be combined with resume (resume "
                                         "continues the checkpoint's run, overwrite replaces "
                                         "it)")

    @property
    def parallel_size(self) -> int:
        """P: the expert-parallel size (the world size when not given)."""
        return self.world_size if self.expert_parallel_size is None \
            else self.expert_parallel_size

    def for_world(self, world_size: int) -> HybridTrainConfig:
        """This config on ``world_size`` ranks (torchrun's), validated again; an explicit
        expert-parallel size equal to the old world follows the world."""
        if world_size == self.world_size:
            return self
        return dataclasses.replace(self, world_size=world_size)

    def topology(self) -> Topology | None:
        """The machine shape P must fit: the Sunway preset's device and links with this
        node and supernode size (only the shape matters to the layout)."""
        if self.ranks_per_node is None:
            return None
        from furnace.runtime.presets import sunway_oceanlight

        return dataclasses.replace(sunway_oceanlight(), ranks_per_node=self.ranks_per_node,
                                   nodes_per_group=self.nodes_per_supernode)

    def layout(self) -> MoDaLayout:
        return MoDaLayout(world_size=self.world_size,
                          expert_parallel_size=self.parallel_size, topology=self.topology())

    def model_config(self) -> MoELMConfig:
        return MoELMConfig(vocab_size=256, d_model=self.d_model, num_layers=self.num_layers,
                           num_heads=self.num_heads, seq_len=self.seq_len,
                           num_experts=self.num_experts, top_k=self.top_k,
                           d_hidden=self.d_hidden, gate=self.gate)

    def loop_config(self) -> TrainLoopConfig:
        return TrainLoopConfig(steps=self.steps, lr=self.lr, seed=self.seed,
                               checkpoint=self.checkpoint,
                               checkpoint_every=self.checkpoint_every)

    def precision_policy(self, groups: MoDaGroups | None = None) -> MixedPrecision | None:
        """The precision policy (None for fp32); under fp16 the overflow flag is made
        world-wide over ``groups.world`` (see the module docstring)."""
        if self.precision == "fp32":
            return None
        sync = None
        if groups is not None and groups.world.world_size > 1:
            world = groups.world

            def sync(found_inf: torch.Tensor) -> None:
                world.all_reduce(found_inf, "max")

        loss_scale = LossScaleConfig() if self.precision == "fp16" else None
        return MixedPrecision(MixedPrecisionConfig(dtype=HALF_DTYPES[self.precision],
                                                   loss_scale=loss_scale),
                              sync_found_inf=sync)


@dataclass(kw_only=True)
class HybridTrainResult(TrainResult):
    """A MoDa run, as rank 0 saw it (under torchrun: as this rank saw it).

    Attributes:
        rank: the rank whose result this is (0 for local ranks; torchrun's RANK under
            torchrun, where every rank returns its own and only rank 0 should report).
        world_size, expert_parallel_size: the layout of this (possibly resumed) run.
        precision: "fp32", "bf16" or "fp16".
        skipped_steps: the steps whose update an fp16 overflow skipped (every rank the
            same); empty otherwise.
        loss_scale: the fp16 loss scale after the last step (None otherwise).
        checkpoint: the checkpoint folder (None without one).
    """

    rank: int = 0
    world_size: int = 1
    expert_parallel_size: int = 1
    precision: str = "fp32"
    skipped_steps: list[int] = field(default_factory=list)
    loss_scale: float | None = None
    checkpoint: str | None = None


class ModaCheckpointStore:
    """`furnace.runtime.training.CheckpointStore` over `furnace.hybrid.checkpoint`: a DCP
    folder whose metadata is the loop's record (plus the fp16 scaler's state) and whose
    shards are the MoDa model's and optimizer's tensors.

    ``moda`` is a one-element list the trainer fills once the model exists (the loop
    builds it after reading the record); ``scaler`` is the fp16 loss scaler, if any.
    """

    def __init__(self, moda: list[MoDa] | None = None, scaler: Any = None) -> None:
        self.moda = moda if moda is not None else []
        self.scaler = scaler

    def check_target(self, path: Path) -> None:
        if path.exists() and not path.is_dir():
            raise OutputError(f"checkpoint {path} is a file, not a folder (a DCP checkpoint "
                              "is a folder)")

    def read(self, path: Path, fmt: CheckpointFormat) -> dict[str, Any]:
        from .checkpoint import read_moda_metadata

        metadata = read_moda_metadata(path)
        record = metadata.get("loop")
        check_checkpoint_state(record, path, fmt, required=RECORD_KEYS)
        assert isinstance(record, dict)
        return {**record, "layout": metadata.get("layout"),
                "loss_scaler": metadata.get("loss_scaler")}

    def write(self, path: Path, record: dict[str, Any], model: nn.Module,
              optimizer: torch.optim.Optimizer) -> None:
        from .checkpoint import save_moda_checkpoint

        metadata: dict[str, Any] = {"loop": record}
        if self.scaler is not None:
            metadata["loss_scaler"] = self.scaler.state_dict()
        save_moda_checkpoint(path, self._moda(model), optimizer, metadata=metadata)

    def restore(self, path: Path, record: dict[str, Any], model: nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
        from .checkpoint import load_moda_checkpoint

        load_moda_checkpoint(path, self._moda(model), optimizer)
        if self.scaler is not None and record.get("loss_scaler") is not None:
            self.scaler.load_state_dict(record["loss_scaler"])

    def _moda(self, model: nn.Module) -> MoDa:
        if not self.moda or self.moda[-1].model is not model:
            raise RuntimeError("the MoDa checkpoint store has no MoDa handle for this model")
        return self.moda[-1]


def prepare_hybrid_checkpoint(config: HybridTrainConfig) -> dict[str, Any] | None:
    """Every checkpoint rule of ``config`` (exists without resume or overwrite, missing,
    corrupt, another model), with no process group: the record to resume, or None."""
    return prepare_checkpoint(config.checkpoint, config, CHECKPOINT_FORMAT,
                              resume=config.resume, overwrite=config.overwrite,
                              store=ModaCheckpointStore())


def _global_batches(config: HybridTrainConfig
                    ) -> Callable[[torch.Generator], Iterator[Batch]]:
    """The global batches of the run: windows of the training half of the byte corpus
    (only the training split is used; half the files go to it so a small corpus has some).

    Raises:
        HybridTrainConfigError: the corpus cannot serve one window.
    """
    from furnace.runtime.corpus import CorpusConfig, batches, load_corpus

    try:
        corpus = load_corpus(CorpusConfig(num_bytes=config.corpus_bytes, val_fraction=0.5))
    except ValueError as exc:
        raise HybridTrainConfigError("corpus_bytes", str(exc)) from None
    if corpus.train.numel() < config.seq_len + 1:
        raise HybridTrainConfigError("corpus_bytes", f"leaves {corpus.train.numel()} training "
                                     f"bytes, fewer than one window of seq_len + 1 = "
                                     f"{config.seq_len + 1}; raise it")

    def draw(generator: torch.Generator) -> Iterator[Batch]:
        return batches(corpus.train, batch_size=config.batch_size, seq_len=config.seq_len,
                       generator=generator)

    return draw


def train_rank(config: HybridTrainConfig, *,
               progress: Callable[[int, dict[str, float]], None] | None = None,
               gradient_hook: GradientHook | None = None,
               stop_at: int | None = None) -> HybridTrainResult:
    """This rank's part of the run, inside an initialised process group of
    ``config.world_size`` ranks (collective: every rank calls it with the same config).

    Args:
        progress: the loop's per-step callback (rank 0's progress bar).
        gradient_hook: called with the MoDa handle and the step (counted from this call's
            first, 1-based) after each backward, before the gradient reduction (to inspect
            or perturb this rank's gradients).
        stop_at: stop after this step (an interruption; the checkpoint is written there).
    """
    groups = MoDaGroups.create(config.layout())
    policy = config.precision_policy(groups)
    scaler = policy.scaler if policy is not None else None
    model_config = config.model_config()
    result = HybridTrainResult(rank=groups.rank, world_size=groups.world.world_size,
                               expert_parallel_size=groups.layout.expert_parallel_size,
                               precision=config.precision, checkpoint=config.checkpoint)
    # the recorded loss is the global-batch mean, the gradient the shard's own (see the
    # module docstring)
    train_moda(config.loop_config(), groups,
               build_model=lambda: MoETransformerLM(model_config),
               global_batches=_global_batches(config), loss=lm_loss, result=result,
               progress=progress, precision=policy, gradient_hook=gradient_hook,
               report_global_loss=True,
               checkpoint_store=lambda handle: ModaCheckpointStore(handle, scaler),
               run_config=config, checkpoint_format=CHECKPOINT_FORMAT, resume=config.resume,
               overwrite=config.overwrite, stop_at=stop_at)
    if scaler is not None:
        # the scaler counts its own updates from 1; a resumed run's scaler was restored, so
        # its indices are the run's steps
        result.skipped_steps = list(scaler.skipped)
        result.loss_scale = scaler.scale
    return result


def _rank_main(rank: int, world_size: int, config: HybridTrainConfig, progress: bool,
               stop_at: int | None) -> HybridTrainResult:
    if progress and rank == 0:
        result = _with_progress(config, stop_at)
    else:
        result = train_rank(config, stop_at=stop_at)
    result.model = None  # a model with process groups does not travel between processes
    return result


def _with_progress(config: HybridTrainConfig, stop_at: int | None) -> HybridTrainResult:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from furnace.runtime.training import progress_bar

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()) as bar:
        label = f"MoDa W={config.world_size} P={config.parallel_size} {config.precision}"
        return train_rank(config, progress=progress_bar(bar, total=config.steps, label=label),
                          stop_at=stop_at)


def train_hybrid(config: HybridTrainConfig, *, progress: bool = True,
                 stop_at: int | None = None, timeout_s: float = 600.0) -> HybridTrainResult:
    """Train under MoDa: on ``config.world_size`` spawned local gloo ranks, or, under
    torchrun, as this rank of the launched world (whose size replaces
    ``config.world_size``). Every checkpoint rule is checked here, before any rank starts.
    Returns rank 0's result (under torchrun: this rank's, with ``rank`` set; the group is
    destroyed after a barrier before it returns or raises), without the model.

    Raises:
        HybridTrainConfigError: the config does not fit torchrun's world.
        CheckpointError (and subclasses), OutputError: see `prepare_hybrid_checkpoint`.
        furnace.runtime.launch.DistributedError: a rank failed or ran past ``timeout_s``.
    """
    from furnace.runtime.launch import init_from_env, is_torchrun, run_distributed

    if is_torchrun():
        import os

        config = config.for_world(int(os.environ["WORLD_SIZE"]))
        # every rank checks before the rendezvous, so no rank can have written the
        # checkpoint another rank is checking, and a refused run joins no group
        prepare_hybrid_checkpoint(config)
        _global_batches(config)
        with init_from_env(backend="gloo", timeout_s=timeout_s) as ctx:
            return _rank_main(ctx.rank, ctx.world_size, config, progress, stop_at)
    prepare_hybrid_checkpoint(config)
    _global_batches(config)  # a corpus that cannot serve the run is refused here
    results = run_distributed(_rank_main, config.world_size, config, progress, stop_at,
                              timeout_s=timeout_s)
    first: HybridTrainResult = results[0]
    return first
