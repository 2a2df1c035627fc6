"""TorchRec's table-wise sharded DLRM as an external baseline for pattern-aware sparse
communication (He, Chen, Zhai, PPoPP '24 poster; design note `recsys.md` Sec. 4 "TorchRec
specifics" and Sec. 7 "Baselines").

What TorchRec 1.8.0 (+ fbgemm-gpu-cpu 1.8.0) can do on CPU with gloo decides the shape of
this baseline (Sec. 4): only data-parallel, table-wise (TW) and column-wise sharding have a
CPU kernel (row-wise needs a reduce-scatter gloo lacks), so the tables are sharded TW by a
constraint planner; the embeddings use fbgemm's fused optimizer (the update runs inside the
backward, EXACT_SGD or EXACT_ROWWISE_ADAGRAD); the sparse input is a ``KeyedJaggedTensor``
built from our `Batch` (key-major lengths, as `Batch` already lays out its bags).

The dense part is NOT TorchRec's: it is our `model.DLRM` with `init_parameters`, its
gradients all-reduced by hand (one flat buffer, like our engine's "dense_allreduce") and
stepped by `optim.dense_step`, and the tables start from `init_embeddings` with the same
seed, so a run starts where `naive.ReferenceTrainer` starts and its losses can be compared.

TorchRec calls ``torch.distributed`` itself, so its bytes cannot go through our
`Communicator`'s log: `intercept_collectives` patches the ``torch.distributed`` collectives
TorchRec's TW path reaches for and counts the bytes each rank sends. Those counts are
labelled "intercepted" wherever they are shown.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .batch import Batch
from .config import DataConfig, ModelConfig, OptimizerConfig, PlanError
from .model import DLRM, bce_loss, init_embeddings, init_parameters
from .optim import dense_step

__all__ = ["CollectiveCounts", "TorchRecTrainer", "available", "intercept_collectives"]

INSTALL_HINT = ('pip install -e ".[recsys-baselines]" then '
                "pip install --no-deps -r requirements/recsys-baselines.txt "
                "(make install-recsys-baselines)")


def available() -> tuple[bool, str]:
    """Whether TorchRec and fbgemm_gpu import here, and a message saying why not / which."""
    try:
        import fbgemm_gpu  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
        import torchrec  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except Exception as exc:  # an ImportError, or fbgemm's library failing to load
        return False, f"TorchRec unavailable ({type(exc).__name__}: {exc}); install: {INSTALL_HINT}"
    return True, f"torchrec {getattr(torchrec, '__version__', '?')}"


@dataclass
class CollectiveCounts:
    """Bytes this rank sent per intercepted ``torch.distributed`` op, and how many calls."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, op: str, num_bytes: int) -> None:
        self.bytes_sent[op] += int(num_bytes)
        self.calls[op] += 1

    @property
    def total(self) -> int:
        return sum(self.bytes_sent.values())

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_sent": dict(self.bytes_sent), "calls": dict(self.calls),
                "total": self.total}


def _world(group: Any) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _a2a_bytes(a: dict[str, Any]) -> int:
    # bytes leaving this rank: the input minus the block it keeps (split along dim 0)
    world, rank = _world(a.get("group"))
    inp: torch.Tensor = a["input"]
    if inp.numel() == 0:
        return 0
    row_bytes = inp.element_size() * (inp.numel() // max(inp.shape[0], 1))
    splits = a.get("input_split_sizes")
    own = inp.shape[0] // world if not splits else int(splits[rank])
    return int(row_bytes * (inp.shape[0] - own))


def _all_reduce_bytes(a: dict[str, Any]) -> int:
    # a ring all-reduce sends 2 (p - 1) / p of the buffer per rank (runtime.comm.traffic)
    world, _rank = _world(a.get("group"))
    tensor: torch.Tensor = a["tensor"]
    return int(2 * (world - 1) * tensor.numel() * tensor.element_size() // world)


def _gather_bytes(a: dict[str, Any]) -> int:
    # all-gather: this rank's block goes to the p - 1 others
    world, _rank = _world(a.get("group"))
    inp = a.get("input_tensor", a.get("tensor"))
    if isinstance(inp, torch.Tensor):
        return int((world - 1) * inp.numel() * inp.element_size())
    return 0


def _reduce_scatter_bytes(a: dict[str, Any]) -> int:
    # reduce-scatter: every block but this rank's own leaves it
    world, _rank = _world(a.get("group"))
    inp = a.get("input", a.get("input_list"))
    if isinstance(inp, torch.Tensor):
        return int((world - 1) * inp.numel() * inp.element_size() // world)
    if inp is None:
        return 0
    return int(sum(t.numel() * t.element_size() for t in inp) * (world - 1) // world)


_COUNTERS = {
    "all_to_all_single": _a2a_bytes,
    "all_reduce": _all_reduce_bytes,
    "all_gather_into_tensor": _gather_bytes,
    "reduce_scatter_tensor": _reduce_scatter_bytes,
    "reduce_scatter": _reduce_scatter_bytes,
}


@contextlib.contextmanager
def intercept_collectives(counts: CollectiveCounts | None = None
                          ) -> Iterator[CollectiveCounts]:
    """Count the bytes this rank sends through ``torch.distributed``'s collectives while the
    block runs, by wrapping the module's functions (TorchRec calls them as ``dist.<op>``).

    Counted with the same conventions as `furnace.runtime.comm.traffic`: self-blocks of an
    all-to-all are free, all-reduce is a ring. Ops that TorchRec's TW path does not use
    (``all_to_all`` on lists, ``broadcast``) are not wrapped.
    """
    counts = counts if counts is not None else CollectiveCounts()
    originals = {name: getattr(dist, name) for name in _COUNTERS}

    def wrap(name: str) -> Any:
        original, measure = originals[name], _COUNTERS[name]

        signature = inspect.signature(original)

        def counted(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            counts.add(name, measure(bound.arguments))
            return original(*args, **kwargs)
        return counted

    for name in _COUNTERS:
        setattr(dist, name, wrap(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _table_name(t: int) -> str:
    return f"t{t}"


class TorchRecTrainer:
    """DLRM with TorchRec's table-wise sharded ``EmbeddingBagCollection`` (fp32).

    Construct inside an initialised gloo process group of ``world_size`` ranks. ``step``
    takes the GLOBAL batch (every rank trains on ``batch.local(rank, W)``) and returns the
    global mean loss before the update, as `naive.ReferenceTrainer.step`.
    """

    def __init__(self, data: DataConfig, model: ModelConfig, optim: OptimizerConfig, *,
                 seed: int = 0, world_size: int) -> None:
        ok, message = available()
        if not ok:
            raise RuntimeError(message)
        if optim.weight_decay:
            # fbgemm's EXACT_SGD has no weight decay; keep the comparison exact instead
            raise PlanError("weight_decay", "must be 0 for the TorchRec baseline "
                            f"(fbgemm's fused EXACT_SGD has none), got {optim.weight_decay!r}")
        if optim.sparse == "rowwise_adagrad" and optim.initial_accumulator:
            raise PlanError("initial_accumulator", "must be 0 for the TorchRec baseline "
                            "(fbgemm starts its row-wise accumulators at 0)")
        if not dist.is_initialized() or dist.get_world_size() != world_size:
            raise PlanError("world_size", f"needs an initialised process group of {world_size} "
                            "ranks")
        from fbgemm_gpu.split_embedding_configs import EmbOptimType  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchrec.distributed.comm_ops import set_gradient_division  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchrec.distributed.model_parallel import DistributedModelParallel  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchrec.distributed.planner import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
            EmbeddingShardingPlanner,
            ParameterConstraints,
            Topology,
        )
        from torchrec.distributed.types import ShardingType  # type: ignore[import-untyped, import-not-found, unused-ignore]

        # `step` relies on the division by W (the default, set here in case it was changed)
        set_gradient_division(True)
        self.data = data
        self.model_config = model
        self.optim = optim
        self.world_size = world_size
        self.rank = dist.get_rank()
        self.counts = CollectiveCounts()
        d = model.embedding_dim
        names = [_table_name(t) for t in range(data.num_tables)]
        tables = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=rows,
                                     feature_names=[n], pooling=PoolingType.SUM)
                  for n, rows in zip(names, data.table_rows)]
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        optimizer = (EmbOptimType.EXACT_SGD if optim.sparse == "sgd"
                     else EmbOptimType.EXACT_ROWWISE_ADAGRAD)
        fused: dict[str, Any] = {"optimizer": optimizer, "learning_rate": optim.lr}
        if optim.sparse == "rowwise_adagrad":
            fused["eps"] = optim.eps
        sharder = EmbeddingBagCollectionSharder(fused_params=fused)
        # TW only: the CPU kernels of the other model-parallel types need CUDA (Sec. 4)
        constraints = {n: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                       for n in names}
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world_size, compute_device="cpu"),
            constraints=constraints)
        group = dist.group.WORLD
        self.sharding_plan = planner.collective_plan(ebc, [sharder], group)
        with intercept_collectives(self.counts):
            self.ebc = DistributedModelParallel(ebc, device=torch.device("cpu"),
                                                plan=self.sharding_plan, sharders=[sharder])
        self.counts = CollectiveCounts()  # set-up traffic is not a step's
        self._load_embeddings(init_embeddings(data.table_rows, d, seed=seed,
                                              dtype=torch.float32))
        self.model = DLRM(model, data.num_dense, data.num_tables)
        init_parameters(self.model, seed=seed)
        self.table_owner = self._owners()

    def _owners(self) -> tuple[int, ...]:
        plan = self.sharding_plan.plan
        module_plan = next(iter(plan.values()))
        owners = []
        for t in range(self.data.num_tables):
            spec = module_plan[_table_name(t)]
            owners.append(int(spec.ranks[0]))
        return tuple(owners)

    def _sharded_weights(self) -> dict[int, torch.Tensor]:
        """This rank's full tables (TW: a table is one shard on one rank), by table."""
        out = {}
        for key, value in self.ebc.state_dict().items():
            if not key.endswith(".weight"):
                continue
            t = int(key.split(".")[-2][1:])
            for shard in value.local_shards():
                out[t] = shard.tensor
        return out

    def _load_embeddings(self, weights: torch.Tensor) -> None:
        offsets = [0]
        for rows in self.data.table_rows:
            offsets.append(offsets[-1] + rows)
        with torch.no_grad():
            for t, local in self._sharded_weights().items():
                local.copy_(weights[offsets[t]:offsets[t + 1]])

    def table_weights(self) -> dict[int, torch.Tensor]:
        """Copies of the tables this rank holds, by table index."""
        return {t: w.detach().clone() for t, w in self._sharded_weights().items()}

    def _kjt(self, batch: Batch) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]
        names = [_table_name(t) for t in range(batch.num_tables)]
        return KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=torch.cat(batch.ids).to(torch.int64),
            lengths=torch.cat([batch.lengths(t) for t in range(batch.num_tables)]).to(
                torch.int32))

    def step(self, batch: Batch) -> float:
        """One step on the global ``batch``; returns its mean loss before the update."""
        w = self.world_size
        local = batch.local(self.rank, w).to(torch.float32)
        with intercept_collectives(self.counts):
            by_name = self.ebc(self._kjt(local)).to_dict()
            # by name: the sharded output's key order follows the sharding, not the tables
            pooled = torch.stack([by_name[_table_name(t)] for t in range(local.num_tables)],
                                 dim=1)
            loss = bce_loss(self.model(local.dense, pooled), local.labels)
            # TorchRec's pooled all-to-all divides the returning gradients by W
            # (comm_ops "gradient division", on by default), so the fused update already
            # sees the global batch mean of the local-mean losses' gradients
            loss.backward()  # type: ignore[no-untyped-call]
            params = [p for p in self.model.parameters() if p.grad is not None]
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
            dist.all_reduce(flat)
            flat /= w  # the dense part gets the same global mean by hand
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p))  # type: ignore[union-attr]
                offset += n
            dense_step(self.model.parameters(), self.optim)
        # loss averaging is bookkeeping, not training traffic: outside the interception
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total)
        return float(total) / w
