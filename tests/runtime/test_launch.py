"""The launcher: results per rank, failures and hangs surfacing in the parent, no leaks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from furnace.runtime.launch import DistributedError, run_distributed, torch_threads


def _rank_info(rank: int, world_size: int, scale: int) -> tuple:
    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return rank, world_size, scale * x.item(), os.getpid()


def _raise_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("bad token count on purpose")
    # rank 0 waits in a collective that rank 1 never joins
    dist.barrier()


def _hang_on_rank_1(rank: int, world_size: int, pid_dir: str) -> None:
    Path(pid_dir, f"{rank}.pid").write_text(str(os.getpid()))
    if rank == 1:
        while True:
            time.sleep(0.05)
    dist.barrier()


def _exit_hard(rank: int, world_size: int) -> None:
    if rank == 0:
        os._exit(3)
    dist.barrier()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; it only waits to be reaped by its parent
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_returns_each_ranks_value(world_size):
    out = run_distributed(_rank_info, world_size, 10)
    total = sum(range(world_size))
    assert [o[:3] for o in out] == [(r, world_size, 10.0 * total) for r in range(world_size)]
    for *_, pid in out:
        assert not _alive(pid)


@pytest.mark.timeout(60)
def test_exception_names_rank_and_traceback():
    with pytest.raises(DistributedError) as info:
        run_distributed(_raise_on_rank_1, 2, timeout_s=30)
    err = info.value
    assert err.kind == "exception"
    assert err.ranks == [1]
    assert "rank 1 of 2 raised" in str(err)
    assert "ValueError: bad token count on purpose" in str(err)
    assert "_raise_on_rank_1" in str(err)


@pytest.mark.timeout(60)
def test_hang_is_killed_and_named(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_hang_on_rank_1, 2, str(tmp_path), timeout_s=4)
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.kind == "timeout"
    assert 1 in err.ranks
    assert "did not finish within 4 s" in str(err)
    # the dumped stack shows where the hanging rank was
    assert "_hang_on_rank_1" in str(err)
    assert elapsed < 30
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.timeout(60)
def test_hard_exit_is_reported():
    with pytest.raises(DistributedError) as info:
        run_distributed(_exit_hard, 2, timeout_s=30)
    assert info.value.kind == "exit"
    assert 0 in info.value.ranks
    assert "rank 0 of 2 died with exit code 3" in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(_rank_info, 0, 1)
    with pytest.raises(ValueError, match="timeout_s"):
        run_distributed(_rank_info, 2, 1, timeout_s=0)


_SINGLE = """
import torch.distributed as dist
from furnace.runtime.launch import init_from_env
ctx = init_from_env()
assert (ctx.rank, ctx.world_size, ctx.backend, ctx.device.type) == (0, 1, "gloo", "cpu"), ctx
assert dist.get_world_size() == 1
dist.destroy_process_group()
print("single ok")
"""


@pytest.mark.timeout(60)
def test_init_from_env_without_launcher():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", _SINGLE], capture_output=True, text=True,
                         env=env, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "single ok" in out.stdout


@pytest.mark.timeout(120)
def test_torchrun_selfcheck():
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m",
         "furnace.runtime.selfcheck"],
        capture_output=True, text=True, timeout=110,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "selfcheck: ok (10 ops per rank, 2 ranks, gloo)" in out.stdout


def test_torch_threads_sets_the_count_and_restores_it_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
