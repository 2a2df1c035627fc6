"""Instrumented collectives: values, the byte model against hand-computed figures, logs and
the gradients of the differentiable collectives against single-process references."""

from __future__ import annotations

import pytest
import torch

from furnace.runtime.comm import (
    CommLog,
    CommRecord,
    Communicator,
    all_reduce_autograd,
    all_to_all_single_autograd,
    traffic,
)
from furnace.runtime.launch import DistributedError, run_distributed
from furnace.runtime.testing import assert_close

# --- the byte model alone, against hand-computed values -------------------------------


@pytest.mark.parametrize(
    ("op", "p", "kw", "expected"),
    [
        # ring all-reduce: 2(p-1)/p * N each way, 2(p-1) messages
        ("all_reduce", 2, {"nbytes": 96}, (96, 96, 2)),
        ("all_reduce", 4, {"nbytes": 96}, (144, 144, 6)),
        ("all_reduce", 8, {"nbytes": 1024}, (1792, 1792, 14)),
        # ring all-gather / reduce-scatter: (p-1) * n each way, p-1 messages
        ("all_gather", 4, {"nbytes": 40}, (120, 120, 3)),
        ("reduce_scatter", 4, {"nbytes": 12}, (36, 36, 3)),
        # pipelined chain: the root only sends, the end of the chain only receives
        ("broadcast", 4, {"nbytes": 80, "root": 0}, (80, 0, 1)),
        ("reduce", 4, {"nbytes": 40, "root": 0}, (0, 40, 0)),
        ("send", 2, {"nbytes": 56, "peer": 1}, (56, 0, 1)),
        ("recv", 2, {"nbytes": 56, "peer": 1}, (0, 56, 0)),
        ("barrier", 4, {}, (0, 0, 3)),
        # one rank moves nothing
        ("all_reduce", 1, {"nbytes": 96}, (0, 0, 0)),
    ],
)
def test_traffic_model_root_rank(op, p, kw, expected):
    tr = traffic(op, rank=0, world_size=p, **kw)
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == expected


def test_traffic_model_non_root_and_all_to_all():
    # broadcast from 0 on 4 ranks: chain 0 -> 1 -> 2 -> 3
    tr = traffic("broadcast", rank=2, world_size=4, nbytes=80, root=0)
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == (80, 80, 1)
    tr = traffic("broadcast", rank=3, world_size=4, nbytes=80, root=0)
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == (0, 80, 0)
    # reduce to 0 on 4 ranks: chain 1 -> 2 -> 3 -> 0
    tr = traffic("reduce", rank=1, world_size=4, nbytes=40, root=0)
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == (40, 0, 1)
    tr = traffic("reduce", rank=3, world_size=4, nbytes=40, root=0)
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == (40, 40, 1)
    # self traffic is free; an empty destination costs no message
    tr = traffic("all_to_all_single", rank=1, world_size=3, send_bytes=[8, 100, 0],
                 recv_bytes=[0, 100, 16])
    assert (tr.bytes_sent, tr.bytes_received, tr.messages) == (8, 16, 1)


def test_traffic_model_errors():
    with pytest.raises(ValueError, match="unknown op"):
        traffic("allreduce", rank=0, world_size=2)
    with pytest.raises(ValueError, match="send_bytes"):
        traffic("all_to_all_single", rank=0, world_size=2)
    with pytest.raises(ValueError, match="needs a peer"):
        traffic("send", rank=0, world_size=2, nbytes=4)


# --- every wrapped op on 2 and 4 ranks --------------------------------------------------


def a2a_send_rows(rank: int, dst: int) -> int:
    return rank + 2 * dst + 1


def _every_op(rank: int, world_size: int) -> tuple[list[dict], dict]:
    comm = Communicator(name="world")
    p = world_size
    values = {}
    values["all_reduce"] = comm.all_reduce(torch.full((24,), float(rank + 1))).tolist()
    values["all_gather"] = comm.all_gather(torch.full((5,), float(rank), dtype=torch.float64))
    values["all_gather"] = values["all_gather"].tolist()
    values["reduce_scatter"] = comm.reduce_scatter(torch.arange(3.0 * p) * (rank + 1)).tolist()
    values["broadcast"] = comm.broadcast(torch.full((10,), rank, dtype=torch.int64), 1).tolist()
    values["reduce"] = comm.reduce(torch.full((10,), 1.0), dst=0).tolist()
    send = [a2a_send_rows(rank, j) for j in range(p)]
    recv = [a2a_send_rows(q, rank) for q in range(p)]
    rows = torch.cat([torch.full((send[j], 2), float(10 * rank + j)) for j in range(p)])
    values["a2a"] = comm.all_to_all_single(rows, recv, send)[:, 0].tolist()
    if rank == 0:
        comm.send(torch.full((7,), 3.0, dtype=torch.float64), 1)
    elif rank == 1:
        values["recv"] = comm.recv(torch.zeros(7, dtype=torch.float64), 0).tolist()
    comm.barrier()
    merged = comm.log.gather()
    return [vars(r) for r in merged.records], values


# (op, rank) -> (bytes sent, bytes received, messages), worked out by hand from the
# sizes in _every_op: all_reduce 96 B, all_gather 40 B in, reduce_scatter 12 B out,
# broadcast 80 B from rank 1 (chain 1 -> 2 -> 3 -> 0), reduce 40 B to rank 0 (chain
# 1 -> 2 -> 3 -> 0), a2a rows of 8 B with
# rank + 2 * dst + 1 rows from rank to dst, send 56 B from 0 to 1.
EXPECTED_BYTES = {
    2: {
        ("all_reduce", 0): (96, 96, 2), ("all_reduce", 1): (96, 96, 2),
        ("all_gather", 0): (40, 40, 1), ("reduce_scatter", 1): (12, 12, 1),
        ("broadcast", 0): (0, 80, 0), ("broadcast", 1): (80, 0, 1),
        ("reduce", 0): (0, 40, 0), ("reduce", 1): (40, 0, 1),
        # rank 0 sends 3 rows to rank 1 and receives 2; rank 1 the reverse
        ("all_to_all_single", 0): (24, 16, 1), ("all_to_all_single", 1): (16, 24, 1),
        ("send", 0): (56, 0, 1), ("recv", 1): (0, 56, 0),
        ("barrier", 0): (0, 0, 1),
    },
    4: {
        ("all_reduce", 0): (144, 144, 6), ("all_reduce", 3): (144, 144, 6),
        ("all_gather", 2): (120, 120, 3), ("reduce_scatter", 3): (36, 36, 3),
        ("broadcast", 1): (80, 0, 1), ("broadcast", 2): (80, 80, 1),
        ("broadcast", 0): (0, 80, 0),
        ("reduce", 0): (0, 40, 0), ("reduce", 3): (40, 40, 1), ("reduce", 1): (40, 0, 1),
        # rank 0: sends 3 + 5 + 7 rows, receives 2 + 3 + 4 rows
        ("all_to_all_single", 0): (120, 72, 3),
        # rank 3: sends 4 + 6 + 8 rows, receives 7 + 8 + 9 rows
        ("all_to_all_single", 3): (144, 192, 3),
        ("send", 0): (56, 0, 1), ("recv", 1): (0, 56, 0),
        ("barrier", 3): (0, 0, 3),
    },
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_op_values_and_bytes(world_size):
    p = world_size
    out = run_distributed(_every_op, p)
    records = [CommRecord(**d) for d in out[0][0]]
    log = CommLog(records)
    # every rank logged every op it took part in
    for rank in range(p):
        ops = [r.op for r in log.select(rank=rank)]
        assert ops[:6] == ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                           "all_to_all_single"]
    for (op, rank), want in EXPECTED_BYTES[p].items():
        (rec,) = log.select(op=op, rank=rank)
        assert (rec.bytes_sent, rec.bytes_received, rec.messages) == want, (op, rank)
        assert rec.wall_s >= 0 and rec.modelled_s is None and rec.clock == "measured"
    # totals: what all ranks send, all ranks receive
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all_single"):
        assert log.bytes_sent(op) == log.bytes_received(op), op

    for rank, (_, values) in enumerate(out):
        assert values["all_reduce"] == [p * (p + 1) / 2] * 24
        assert values["all_gather"] == [float(q) for q in range(p) for _ in range(5)]
        assert values["reduce_scatter"] == [
            (3 * rank + i) * p * (p + 1) / 2 for i in range(3)]
        assert values["broadcast"] == [1] * 10
        if rank == 0:
            assert values["reduce"] == [float(p)] * 10
        assert values["a2a"] == [float(10 * q + rank) for q in range(p)
                                 for _ in range(a2a_send_rows(q, rank))]
        if rank == 1:
            assert values["recv"] == [3.0] * 7


def _a2a_with_empty_rank(rank: int, world_size: int) -> tuple[list[float], int, int]:
    comm = Communicator()
    # rank 1 routes nothing and receives nothing; the others send one row to each other
    send = [0 if rank == 1 or j == 1 else 1 for j in range(world_size)]
    recv = [0 if rank == 1 or q == 1 else 1 for q in range(world_size)]
    x = torch.full((sum(send), 4), float(rank))
    out = comm.all_to_all_single(x, recv, send)
    rec = comm.log.records[-1]
    return out[:, 0].tolist(), rec.bytes_sent, rec.messages


@pytest.mark.timeout(60)
def test_all_to_all_with_empty_rank():
    out = run_distributed(_a2a_with_empty_rank, 3)
    assert out[0] == ([0.0, 2.0], 16, 1)
    assert out[1] == ([], 0, 0)
    assert out[2] == ([0.0, 2.0], 16, 1)


def _bad_splits(rank: int, world_size: int) -> None:
    comm = Communicator()
    comm.all_to_all_single(torch.zeros(3, 2), [1, 1], [2, 2])


@pytest.mark.timeout(60)
def test_bad_splits_raise_clear_error():
    with pytest.raises(DistributedError, match="input splits sum to 4, but the tensor has 3"):
        run_distributed(_bad_splits, 2)


def test_communicator_needs_process_group():
    with pytest.raises(RuntimeError, match="initialized process group"):
        Communicator()


# --- the traffic observer ----------------------------------------------------------------


def _observed(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    seen = []

    def observe(op, tr, comm):
        seen.append((op, comm.name, tr, comm.global_ranks))

    world = Communicator(name="world", on_traffic=observe)
    odd = dist.new_group([1, 3])  # collective: every rank creates it
    world.all_reduce(torch.ones(6))
    send = [a2a_send_rows(rank, j) for j in range(world_size)]
    recv = [a2a_send_rows(q, rank) for q in range(world_size)]
    world.all_to_all_single(torch.zeros(sum(send), 2), recv, send)
    # an async op is observed when it completes, with its record, not when it is issued
    handle = world.all_gather(torch.zeros(3), async_op=True)
    before_wait = len(seen)
    handle.wait()
    if rank in (1, 3):
        Communicator(odd, log=world.log, name="odd", on_traffic=observe).all_reduce(
            torch.ones(4, dtype=torch.float64))
    records = [(r.op, r.group, r.bytes_sent, r.bytes_received, r.messages)
               for r in world.log.records]
    observed = [(op, name, tr.bytes_sent, tr.bytes_received, tr.messages)
                for op, name, tr, _ in seen]
    a2a = next(tr for op, _, tr, _ in seen if op == "all_to_all_single")
    return {"records": records, "observed": observed, "before_wait": before_wait,
            "a2a_peers": list(a2a.peers),
            "group_ranks": {name: ranks for _, name, _, ranks in seen}}


@pytest.mark.timeout(60)
def test_traffic_observer_sees_every_logged_op_with_its_peers():
    p = 4
    out = run_distributed(_observed, p, timeout_s=50)
    for rank, got in enumerate(out):
        # one call per logged op, in log order, with the log's byte and message counts
        assert got["observed"] == got["records"]
        ops = [r[0] for r in got["records"]]
        assert ops == (["all_reduce", "all_to_all_single", "all_gather"]
                       + (["all_reduce"] if rank in (1, 3) else []))
        assert got["before_wait"] == 2
        # the per-peer split the record sums away: group-local peer, sent, received
        assert got["a2a_peers"] == [
            (j, 8 * a2a_send_rows(rank, j), 8 * a2a_send_rows(j, rank))
            for j in range(p) if j != rank]
        assert got["group_ranks"]["world"] == (0, 1, 2, 3)
        if rank in (1, 3):
            assert got["group_ranks"]["odd"] == (1, 3)
            # the 2-rank ring all-reduce of 32 B moves 2(p-1)/p * N = 32 B each way
            assert got["records"][-1][1:] == ("odd", 32, 32, 2)


# --- gradients against a single-process reference --------------------------------------


def _global_inputs(p: int, cols: int = 3):
    """The same global tensors on every rank and in the reference (own generator, seed 0)."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(sum(a2a_send_rows(r, j) for j in range(p)), cols, generator=gen,
                      dtype=torch.float64) for r in range(p)]
    ws = [torch.randn(sum(a2a_send_rows(q, r) for q in range(p)), cols, generator=gen,
                      dtype=torch.float64) for r in range(p)]
    return xs, ws


def _a2a_grad(rank: int, world_size: int):
    p = world_size
    xs, ws = _global_inputs(p)
    comm = Communicator()
    x = xs[rank].clone().requires_grad_(True)
    send = [a2a_send_rows(rank, j) for j in range(p)]
    recv = [a2a_send_rows(q, rank) for q in range(p)]
    out = all_to_all_single_autograd(x, comm, recv, send)
    (out * ws[rank]).sum().backward()
    return out.detach(), x.grad, comm.log.count("all_to_all_single")


def _a2a_reference(p: int):
    xs, ws = _global_inputs(p)
    xs = [x.requires_grad_(True) for x in xs]
    pieces = [torch.split(x, [a2a_send_rows(r, j) for j in range(p)]) for r, x in enumerate(xs)]
    outs = [torch.cat([pieces[q][r] for q in range(p)]) for r in range(p)]
    sum((o * w).sum() for o, w in zip(outs, ws, strict=False)).backward()
    return [o.detach() for o in outs], [x.grad for x in xs]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_to_all_autograd_matches_single_process(world_size):
    out = run_distributed(_a2a_grad, world_size)
    ref_outs, ref_grads = _a2a_reference(world_size)
    for rank, (y, grad, calls) in enumerate(out):
        # a permutation of float64 values: exact
        assert_close(f"out[{rank}]", ref_outs[rank], y, 0.0)
        assert_close(f"grad[{rank}]", ref_grads[rank], grad, 0.0)
        assert calls == 2  # forward and backward


def _all_reduce_grad(rank: int, world_size: int):
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(world_size)]
    ws = [torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(world_size)]
    comm = Communicator()
    x = xs[rank].clone().requires_grad_(True)
    y = all_reduce_autograd(x, comm)
    (y * ws[rank]).sum().backward()
    return y.detach(), x.grad, xs, ws


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_autograd_matches_single_process(world_size):
    out = run_distributed(_all_reduce_grad, world_size)
    xs = [x.clone().requires_grad_(True) for x in out[0][2]]
    ws = out[0][3]
    y = sum(xs)
    sum((y * w).sum() for w in ws).backward()
    for rank, (y_rank, grad, _, _) in enumerate(out):
        # sums of p float64 values in another order: a few ulps at most
        assert_close(f"y[{rank}]", y.detach(), y_rank, 1e-15)
        assert_close(f"grad[{rank}]", xs[rank].grad, grad, 1e-15)


# --- the log itself ---------------------------------------------------------------------


def test_log_summary_merge_json_and_table():
    a = CommLog([CommRecord("all_reduce", "world", 0, 2, 96, 96, 2, 0.001),
                 CommRecord("all_reduce", "world", 0, 2, 96, 96, 2, 0.002)])
    b = CommLog([CommRecord("all_reduce", "world", 1, 2, 96, 96, 2, 0.003, 0.004, "emulated")])
    merged = CommLog.merge([a, b])
    summary = merged.summary()
    assert summary[(0, "all_reduce")].calls == 2
    assert summary[(0, "all_reduce")].bytes_sent == 192
    assert summary[(1, "all_reduce")].modelled_s == pytest.approx(0.004)
    assert merged.bytes_sent() == 288 and merged.count(rank=1) == 1
    assert CommLog.from_json(merged.to_json()).records == merged.records
    table = merged.table()
    assert table.row_count == 2
    assert any("model ms" in str(c.header) for c in table.columns)
