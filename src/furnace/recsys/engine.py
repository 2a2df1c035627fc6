"""The distributed DLRM engine: row-granular hybrid parallelism with deduplicated, scheduled
exchanges (He, Chen, Zhai, PPoPP '24 poster, as reconstructed in design note `recsys.md`
Sec. 2.3, 2.5, 2.6), and the baselines it replaces, on one code path.

One step of the row-sharded schemes (row, row_dedup, hybrid), on every rank:
  1. the local batch's IDs that are not hot are grouped by owner (deduplicated per owner for
     row_dedup and hybrid); the counts go out first ("splits"), then the IDs ("ids");
  2. owners gather the requested rows and send them back ("vectors"); hot rows are read from
     the local replica meanwhile, and, with ``overlap``, the bottom MLP runs while the vectors
     are in flight;
  3. pooling, interaction, top MLP, loss (each rank's share of the global-batch mean);
  4. backward; the cold rows' gradients go back to their owners ("grads"), summed per row
     when deduplicated; owners apply the sparse optimizer to every row any rank touched;
  5. the hot rows' gradients (and, when weight decay needs them, touched counts) and the
     dense gradients are all-reduced ("hot_allreduce", "dense_allreduce", or one "allreduce"
     when fused), and every replica applies the same update. With ``ranks_per_node``
     making two levels of the world, each all-reduce is hierarchical (reduce-scatter in the
     node, all-reduce across nodes, all-gather in the node; `runtime.twolevel`).
table_pooled is the DLRM reference's baseline: whole tables per rank, every rank reads the
global batch's IDs of its own tables (no ID exchange) and sends each sample's owner one
pooled vector per table ("vectors"); the pooled gradients come back ("grads").

Each phase is a `Communicator` of its own name over one shared `CommLog`, so the log's bytes
per (phase, rank) can be checked against `accounting.exact_bytes`. Bookkeeping traffic (the
global loss, gathering the parameters) goes through "metrics" and "gather", outside the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from furnace.runtime.comm import CommHandle, CommLog, Communicator
from furnace.runtime.twolevel import HierarchicalAllReduce, is_two_level, two_level_groups

from .batch import Batch
from .config import DataConfig, EngineConfig, ModelConfig, OptimizerConfig, PlanError, ShardingPlan
from .model import DLRM, bce_loss, init_embeddings, init_parameters, pool
from .optim import dense_step, new_state, sparse_step

__all__ = ["PHASES", "ShardedTrainer", "needs_touched_counts"]

PHASES = ("splits", "ids", "vectors", "grads", "dense_allreduce", "hot_allreduce", "allreduce")
ALL_REDUCE_PHASES = ("dense_allreduce", "hot_allreduce", "allreduce")


def _two_level(ranks_per_node: int, world_size: int) -> bool:
    """Whether ``ranks_per_node`` makes a two-level machine of the world (else one ring)."""
    if not (isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool)
            and ranks_per_node >= 1 and world_size % min(ranks_per_node, world_size) == 0):
        raise PlanError("ranks_per_node", f"must be an integer >= 1 that divides the "
                        f"{world_size} ranks, got {ranks_per_node!r}")
    return is_two_level(ranks_per_node, world_size)


def needs_touched_counts(optim: OptimizerConfig) -> bool:
    """Whether the hot all-reduce must carry touched-row counts.

    Only weight decay tells a touched row with a zero gradient from an untouched row: without
    it, SGD and row-wise Adagrad leave a row with a zero gradient exactly as it was (``w - lr
    * 0``, ``state + 0``), so every replica may update all hot rows from the summed gradient
    and the counts would be bytes for nothing.
    """
    return optim.weight_decay > 0


@dataclass
class _Requests:
    """This rank's cold lookups of one batch, grouped by owner."""

    send_counts: list[int]
    recv_counts: list[int]
    ids: torch.Tensor          # requested global IDs, owner-major
    inverse: torch.Tensor      # cold occurrence -> index into ids
    cold_positions: torch.Tensor
    recv_ids: CommHandle[torch.Tensor] | torch.Tensor


class ShardedTrainer:
    """DLRM over ``plan.world_size`` ranks of the default process group; ``step`` takes the
    GLOBAL batch (every rank the same) and trains on its share."""

    def __init__(self, data: DataConfig, model: ModelConfig, optim: OptimizerConfig,
                 plan: ShardingPlan, engine: EngineConfig, *, seed: int = 0,
                 dtype: torch.dtype = torch.float64, network: Any = None,
                 log: CommLog | None = None, ranks_per_node: int = 1,
                 on_traffic: Any = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedTrainer needs an initialized process group")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        if plan.world_size != self.world_size:
            raise PlanError("world_size", f"the plan is for {plan.world_size} ranks, the group "
                            f"has {self.world_size}")
        if plan.table_rows != data.table_rows:
            raise PlanError("table_rows", "the plan's tables differ from the data's")
        wants = "table" if engine.scheme == "table_pooled" else "row"
        if plan.sharding != wants:
            raise PlanError("sharding", f"scheme {engine.scheme} needs {wants} sharding, the "
                            f"plan has {plan.sharding}")
        if plan.hot_rows and engine.scheme != "hybrid":
            raise PlanError("hot_rows", f"only the hybrid scheme replicates rows, not "
                            f"{engine.scheme}")
        self.data, self.optim, self.plan, self.engine = data, optim, plan, engine
        self.dtype = dtype
        self.batch_size: int | None = None
        self.model = DLRM(model, data.num_dense, data.num_tables).to(dtype)
        init_parameters(self.model, seed=seed)
        full = init_embeddings(data.table_rows, model.embedding_dim, seed=seed, dtype=dtype)
        self.shard_ids = plan.shard_rows(self.rank)
        self.shard = full[self.shard_ids].clone()
        self.shard_state = new_state(self.shard.shape[0], optim, dtype)
        self.hot_ids = torch.tensor(plan.hot_rows, dtype=torch.int64)
        self.hot = full[self.hot_ids].clone()
        self.hot_state = new_state(self.hot.shape[0], optim, dtype)
        self.hot_slot = plan.hot_slot()
        self.all_hot = len(plan.hot_rows) == plan.total_rows
        self.counts = needs_touched_counts(optim)
        self.comm_log = log if log is not None else CommLog()
        self._comm: dict[str, Any] = {
            name: Communicator(log=self.comm_log, network=network, name=name,
                               on_traffic=on_traffic) for name in PHASES}
        self.hierarchical = _two_level(ranks_per_node, self.world_size)
        if self.hierarchical:
            # on a two-level machine the all-reduces go node, then across nodes, then node:
            # what makes a replicated row cheaper than a sharded one (design note Sec. 2.4)
            node, cross = two_level_groups(ranks_per_node)
            for name in ALL_REDUCE_PHASES:
                self._comm[name] = HierarchicalAllReduce(
                    node, cross, log=self.comm_log, network=network, name=name,
                    on_traffic=on_traffic)
        self._metrics = Communicator(name="metrics")
        self._gather = Communicator(name="gather")
        self._prefetched: tuple[Batch, _Requests] | None = None

    # --- the ID exchange (forward-independent of the weights, so it may be prefetched) ---

    def _requests(self, local: Batch) -> _Requests:
        w = self.world_size
        flat = torch.cat(local.global_ids(self.plan.table_offsets))
        cold_positions = torch.nonzero(self.hot_slot[flat] < 0).flatten()
        cold = flat[cold_positions]
        owners = self.plan.owner_of(cold)
        if self.engine.dedup:
            # one request per (owner, row): sort by (owner, id) and keep the first of each
            key = owners * self.plan.total_rows + cold
            unique_keys, inverse = torch.unique(key, return_inverse=True)
            ids = unique_keys % self.plan.total_rows
            id_owners = unique_keys // self.plan.total_rows
        else:
            order = torch.argsort(owners, stable=True)
            ids = cold[order]
            id_owners = owners[order]
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel())
        send_counts = torch.bincount(id_owners, minlength=w)
        recv = self._comm["splits"].all_to_all_single(send_counts)
        recv_counts = [int(c) for c in recv]
        handle = self._comm["ids"].all_to_all_single(
            ids, recv_counts, [int(c) for c in send_counts], async_op=True)
        return _Requests([int(c) for c in send_counts], recv_counts, ids, inverse,
                         cold_positions, handle)

    def _exchange(self, name: str, tensor: torch.Tensor, out_counts: list[int],
                  in_counts: list[int], *, async_op: bool) -> Any:
        """All-to-all of rows, or with ``pairwise`` W-1 rounds of sends to rank r+s and
        receives from r-s (the same bytes, one peer at a time)."""
        comm = self._comm[name]
        if not self.engine.pairwise:
            return comm.all_to_all_single(tensor, out_counts, in_counts, async_op=async_op)
        w, r = self.world_size, self.rank
        send_at = [0]
        for c in in_counts:
            send_at.append(send_at[-1] + c)
        recv_at = [0]
        for c in out_counts:
            recv_at.append(recv_at[-1] + c)
        out = tensor.new_empty((recv_at[-1], *tensor.shape[1:]))
        out[recv_at[r]:recv_at[r + 1]] = tensor[send_at[r]:send_at[r + 1]]
        for s in range(1, w):
            dst, src = (r + s) % w, (r - s) % w
            pending: list[CommHandle[Any]] = []
            if in_counts[dst]:
                pending.append(comm.isend(tensor[send_at[dst]:send_at[dst + 1]], dst))
            if out_counts[src]:
                pending.append(comm.irecv(out[recv_at[src]:recv_at[src + 1]], src))
            for h in pending:
                h.wait()
        return out

    @staticmethod
    def _wait(value: Any) -> torch.Tensor:
        out: torch.Tensor = value.wait() if isinstance(value, CommHandle) else value
        return out

    # --- one step ---

    def step(self, batch: Batch, upcoming: Batch | None = None) -> float:
        """One step on the global ``batch``; returns its mean loss before the update. With
        ``prefetch``, ``upcoming``'s ID exchange is posted before this step's backward."""
        if self.batch_size is None:
            self.batch_size = batch.batch_size
        local = batch.local(self.rank, self.world_size).to(self.dtype)
        if self.engine.scheme == "table_pooled":
            loss, hot_grad, touched = self._table_pooled_step(batch, local)
        else:
            loss, hot_grad, touched = self._row_step(batch, local, upcoming)
        self._all_reduce_and_update(hot_grad, touched)
        total = loss.detach().clone()
        self._metrics.all_reduce(total)
        return float(total)

    def _dense_loss(self, local: Batch, pooled_of: Any, batch_size: int) -> torch.Tensor:
        bottom = self.model.bottom(local.dense)  # runs while the vectors are in flight
        pooled = pooled_of()
        logits = self.model.top(self.model.interact(bottom, pooled)).squeeze(1)
        return bce_loss(logits, local.labels, total=batch_size)

    def _row_step(self, batch: Batch, local: Batch, upcoming: Batch | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        d = self.shard.shape[1]
        gids = local.global_ids(self.plan.table_offsets)
        flat = torch.cat(gids)
        req: _Requests | None = None
        vectors: Any = self.shard.new_zeros((0, d))
        if not self.all_hot:
            if self._prefetched is not None and self._prefetched[0] is batch:
                req = self._prefetched[1]
            else:
                req = self._requests(local)
            self._prefetched = None
            recv_ids = self._wait(req.recv_ids)
            req.recv_ids = recv_ids
            rows = self.shard[self.plan.slot_of(recv_ids)]
            vectors = self._exchange("vectors", rows, req.send_counts, req.recv_counts,
                                     async_op=self.engine.overlap)
        # hot lookups from the local replica (overlapped with the vector exchange)
        hot_positions = torch.nonzero(self.hot_slot[flat] >= 0).flatten()
        hot_touched, hot_inverse = torch.unique(self.hot_slot[flat[hot_positions]],
                                                return_inverse=True)
        hot_leaf = self.hot[hot_touched].detach().clone().requires_grad_(True)
        cold_leaf: torch.Tensor | None = None

        def pooled_of() -> torch.Tensor:
            nonlocal cold_leaf
            cold_leaf = self._wait(vectors).detach().clone().requires_grad_(True)
            # every occurrence's row: cold ones from the exchange, hot ones from the replica
            source = torch.cat([cold_leaf, hot_leaf])
            index = torch.empty(flat.numel(), dtype=torch.int64)
            if req is not None:
                index[req.cold_positions] = req.inverse
            index[hot_positions] = hot_inverse + cold_leaf.shape[0]
            parts = torch.split(index, [g.numel() for g in gids])
            return torch.stack([pool(source, p, off) for p, off in zip(parts, local.offsets)],
                               dim=1)

        loss = self._dense_loss(local, pooled_of, batch.batch_size)
        if self.engine.prefetch and upcoming is not None and not self.all_hot:
            # the next batch's IDs do not depend on the weights: exchange them while this
            # step's backward runs
            self._prefetched = (upcoming, self._requests(
                upcoming.local(self.rank, self.world_size)))
        loss.backward()  # type: ignore[no-untyped-call]
        assert cold_leaf is not None
        grad_handle = None
        if req is not None:
            assert cold_leaf.grad is not None
            grad_handle = self._exchange("grads", cold_leaf.grad, req.recv_counts,
                                         req.send_counts, async_op=self.engine.overlap)
            if not self.engine.overlap:
                self._apply_cold(req, self._wait(grad_handle))
                grad_handle = None
        hot_grad = None
        touched = None
        if self.hot.shape[0]:
            hot_grad = self.hot.new_zeros(self.hot.shape)
            assert hot_leaf.grad is not None
            hot_grad[hot_touched] = hot_leaf.grad
            touched = self.hot.new_zeros(self.hot.shape[0])
            touched[hot_touched] = 1.0
        self._pending_cold = (req, grad_handle)
        return loss, hot_grad, touched

    def _apply_cold(self, req: _Requests, grads: torch.Tensor) -> None:
        slots = self.plan.slot_of(req.recv_ids)  # type: ignore[arg-type]
        unique, inverse = torch.unique(slots, return_inverse=True)
        summed = grads.new_zeros(unique.numel(), grads.shape[1]).index_add(0, inverse, grads)
        sparse_step(self.shard, self.shard_state, unique, summed, self.optim)

    def _table_pooled_step(self, batch: Batch, local: Batch
                           ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        w, d = self.world_size, self.shard.shape[1]
        per = batch.batch_size // w
        owned = [t for t, o in enumerate(self.plan.table_owner) if o == self.rank]
        owners = self.plan.table_owner
        gids = batch.global_ids(self.plan.table_offsets)
        mine = [gids[t] for t in owned]
        touched_ids = torch.unique(torch.cat(mine)) if mine else torch.zeros(0, dtype=torch.int64)
        slots = self.plan.slot_of(touched_ids)
        leaf = self.shard[slots].detach().clone().requires_grad_(True)
        pooled_mine = [pool(leaf, torch.searchsorted(touched_ids, gids[t]), batch.offsets[t])
                       for t in owned]  # each [B_g, D]
        # to each sample owner q: its samples' pooled vector of each of my tables, table-major
        if pooled_mine:
            stacked = torch.stack(pooled_mine)  # [T_mine, B_g, D]
            send = stacked.view(len(owned), w, per, d).transpose(0, 1).reshape(-1, d)
        else:
            send = self.shard.new_zeros((0, d))
        counts_out = [len(owned) * per] * w
        counts_in = [sum(1 for o in owners if o == s) * per for s in range(w)]
        vectors = self._exchange("vectors", send.detach(), counts_in, counts_out,
                                 async_op=self.engine.overlap)
        received: torch.Tensor | None = None

        def pooled_of() -> torch.Tensor:
            nonlocal received
            received = self._wait(vectors).detach().clone().requires_grad_(True)
            out = []
            start = [0]
            for c in counts_in:
                start.append(start[-1] + c)
            seen = [0] * w
            for o in owners:
                lo = start[o] + seen[o] * per
                out.append(received[lo:lo + per])
                seen[o] += 1
            return torch.stack(out, dim=1)

        loss = self._dense_loss(local, pooled_of, batch.batch_size)
        loss.backward()  # type: ignore[no-untyped-call]
        assert received is not None and received.grad is not None
        grads = self._wait(self._exchange("grads", received.grad, counts_out, counts_in,
                                          async_op=False))
        if owned:
            back = grads.view(w, len(owned), per, d).transpose(0, 1).reshape(
                len(owned), w * per, d)
            torch.stack(pooled_mine).backward(back)  # type: ignore[no-untyped-call]
            assert leaf.grad is not None
            sparse_step(self.shard, self.shard_state, slots, leaf.grad, self.optim)
        self._pending_cold = (None, None)
        return loss, None, None

    def _all_reduce_and_update(self, hot_grad: torch.Tensor | None,
                               touched: torch.Tensor | None) -> None:
        params = [p for p in self.model.parameters()]
        dense = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(
            p).flatten() for p in params])
        hot_parts: list[torch.Tensor] = []
        if hot_grad is not None:
            hot_parts.append(hot_grad.flatten())
            if self.counts:
                assert touched is not None
                hot_parts.append(touched)
        if self.engine.fuse_allreduce:
            buffer = torch.cat([dense, *hot_parts])
            handles = [self._comm["allreduce"].all_reduce(buffer, async_op=True)]
        else:
            hot_buffer = torch.cat(hot_parts) if hot_parts else None
            handles = [self._comm["dense_allreduce"].all_reduce(dense, async_op=True)]
            if hot_buffer is not None:
                handles.append(self._comm["hot_allreduce"].all_reduce(hot_buffer,
                                                                       async_op=True))
        # the cold gradients' exchange was posted before the all-reduce: wait on both
        req, grad_handle = self._pending_cold
        if grad_handle is not None:
            assert req is not None
            self._apply_cold(req, self._wait(grad_handle))
        results = [h.wait() for h in handles]
        hot_sum: torch.Tensor | None
        if self.engine.fuse_allreduce:
            dense_sum = results[0][:dense.numel()]
            hot_sum = results[0][dense.numel():]
        else:
            dense_sum = results[0]
            hot_sum = results[1] if len(results) > 1 else None
        at = 0
        for p in params:
            n = p.numel()
            p.grad = dense_sum[at:at + n].view_as(p).clone()
            at += n
        dense_step(params, self.optim)
        if hot_grad is not None:
            assert hot_sum is not None
            k, d = self.hot.shape
            grads = hot_sum[:k * d].view(k, d)
            if self.counts:
                rows = torch.nonzero(hot_sum[k * d:] > 0).flatten()
            else:
                rows = torch.arange(k)
            sparse_step(self.hot, self.hot_state, rows, grads[rows], self.optim)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, gathered on every rank: the keys of
        `ReferenceTrainer.full_parameters` ("weights", "state" if any, the model's)."""
        total, d = self.plan.total_rows, self.shard.shape[1]
        weights = self.shard.new_zeros(total, d)
        weights[self.shard_ids] = self.shard
        state = None
        if self.shard_state is not None:
            state = self.shard_state.new_zeros(total)
            state[self.shard_ids] = self.shard_state
        # each row lives on exactly one owner, so a sum gathers the shards
        self._gather.all_reduce(weights)
        if state is not None:
            self._gather.all_reduce(state)
        if self.hot.shape[0]:
            weights[self.hot_ids] = self.hot
            if state is not None and self.hot_state is not None:
                state[self.hot_ids] = self.hot_state
        out = {"weights": weights}
        if state is not None:
            out["state"] = state
        out.update({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return out
