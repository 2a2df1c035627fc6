"""Every P-Reduce backend returns the exact mean of its members and leaves non-members
untouched (design note `prague.md` section 2.2), on 4 gloo ranks against the float64
reference in `naive`; and no backend creates groups with
``new_group(use_local_synchronization=True)``, which hangs for dynamic groups (note 4.3).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from furnace.decentralized import naive
from furnace.decentralized.generator import Group, GroupTimeoutError
from furnace.decentralized.preduce import make_backend
from furnace.decentralized.worker import _coordination_store
from furnace.runtime.launch import run_distributed

# every rank runs at one thread (run_distributed) whatever the pass, and gloo's sums do not
# depend on the thread count: `make test`'s 1-thread pass skips these
pytestmark = pytest.mark.thread_independent

# float32 sums of at most 4 values: the mean differs from the float64 one by a few ulps
TOL = 1e-6
WORLD = 4
GROUPS = [(0, 1), (1, 2, 3), (0, 1, 2, 3), (0, 3), (2,), (0, 2), (1, 2, 3), (0, 1)]


def _values(rank: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seq + rank)
    return torch.randn(1000, generator=g) * (1 + rank)


def _run_backends(rank: int, world: int) -> dict[str, list[torch.Tensor]]:
    store, _, _ = _coordination_store(rank, 20.0)
    out: dict[str, list[torch.Tensor]] = {}
    for offset, name in enumerate(("p2p", "cached", "precreated")):
        backend = make_backend(name, rank, store, timeout_s=20.0,
                               namespace=f"test{offset}",
                               static_groups=sorted(set(GROUPS)))
        results = []
        for k, members in enumerate(GROUPS):
            seq = 100 * offset + k
            flat = _values(rank, seq)
            if rank in members:
                backend(flat, Group(seq, members, members))
            results.append(flat)
        out[name] = results
        if name == "cached":
            # one creation per distinct member set with 2+ members, reused after that
            mine = {m for m in GROUPS if rank in m and len(m) > 1}
            assert backend.stats.cache_misses == len(mine), backend.stats
    return out


@pytest.mark.timeout(90)
def test_every_backend_returns_the_exact_mean() -> None:
    per_rank = run_distributed(_run_backends, WORLD, timeout_s=80)
    for name in ("p2p", "cached", "precreated"):
        for k, members in enumerate(GROUPS):
            seq = 100 * ("p2p", "cached", "precreated").index(name) + k
            before = [_values(r, seq) for r in range(WORLD)]
            expected = naive.preduce_reference(before, members)
            for r in range(WORLD):
                got = per_rank[r][name][k]
                scale = float(expected[r].abs().max())
                err = float((got - expected[r]).abs().max()) / scale
                assert err <= TOL, (name, members, r, err)


def _missing_member(rank: int, world: int) -> str:
    store, _, _ = _coordination_store(rank, 10.0)
    backend = make_backend("p2p", rank, store, timeout_s=1.0)
    dist.barrier()
    message = "absent"
    if rank != 2:
        try:
            backend(torch.ones(10), Group(0, (0, 1, 2), (0, 1, 2)))
            message = "no error"
        except GroupTimeoutError as exc:
            message = str(exc)
    # rank 0 hosts the store: it must outlive the others' look at who is missing
    dist.barrier()
    return message


@pytest.mark.timeout(60)
def test_a_missing_member_is_named() -> None:
    messages = run_distributed(_missing_member, 3, timeout_s=50)
    for rank in (0, 1):
        assert "still waiting for rank(s) 2 " in messages[rank], messages[rank]


def test_no_backend_uses_local_synchronization() -> None:
    """Dynamic groups from new_group(use_local_synchronization=True) hang: never call it."""
    package = Path(__file__).parents[2] / "src" / "furnace" / "decentralized"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    assert kw.arg != "use_local_synchronization", f"{path.name}:{node.lineno}"
