"""The launcher: results per rank, failures and hangs surfacing in the parent, no leaks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from furnace.runtime.launch import DistributedError, run_distributed, torch_threads
from furnace.runtime.testing import TORCHRUN_ENTRY, run_torchrun, torchrun_outcomes

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


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
        # 15 s: spawning and importing torch can take several seconds on a loaded machine,
        # and the stack is only dumped from a rank that got as far as its body
        run_distributed(_hang_on_rank_1, 2, str(tmp_path), timeout_s=15)
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.kind == "timeout"
    assert 1 in err.ranks
    assert "did not finish within 15 s" in str(err)
    # the dumped stack shows where the hanging rank was
    assert "_hang_on_rank_1" in str(err)
    assert elapsed < 45
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
with init_from_env() as ctx:
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.device.type) == (0, 1, "gloo", "cpu"), ctx
    assert ctx.owns_group
    assert dist.get_world_size() == 1
assert not dist.is_initialized()
print("single ok")
"""


@pytest.mark.timeout(60)
def test_init_from_env_without_launcher():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", _SINGLE], capture_output=True, text=True,
                         env=env, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "single ok" in out.stdout


def test_torch_threads_sets_the_count_and_restores_it_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


def _stop_inside_collective(rank: int, world_size: int) -> None:
    if rank == 1:
        # frozen as by `kill -STOP`: rank 0 is left waiting inside the all-reduce
        os.kill(os.getpid(), signal.SIGSTOP)
    x = torch.ones(1)
    dist.all_reduce(x)


@pytest.mark.timeout(90)
def test_a_stopped_rank_is_named_within_the_liveness_bound():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_distributed(_stop_inside_collective, 2, timeout_s=80, liveness_timeout_s=5)
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.kind == "stuck"
    assert err.ranks == [1]
    assert "rank 1 of 2 stopped responding" in str(err)
    assert "stopped by a signal" in str(err)
    assert elapsed < 60


def _listeners(pid: int) -> list[str]:
    """The local addresses on which ``pid`` has listening TCP sockets, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                address = cols[1].split(":")[0]
                assert len(address) == width
                found.append(address)
    return found


def _is_loopback_hex(address: str) -> bool:
    if len(address) == 8:  # IPv4, little-endian words: 0100007F is 127.0.0.1
        return address.endswith("7F")
    # IPv6 ::1, or an IPv4-mapped loopback
    return address in ("00000000000000000000000001000000",) or address.endswith("0100007F")


def _my_listeners(rank: int, world_size: int) -> tuple[list[str], list[str]]:
    dist.barrier()  # every rank has joined: gloo's pairs and the store client exist
    # the parent serves the rendezvous store while the ranks run
    return _listeners(os.getpid()), _listeners(os.getppid())


@pytest.mark.timeout(60)
def test_every_listener_of_a_local_run_is_on_loopback():
    # listeners this test process opened earlier (other tests) are not this run's
    before = _listeners(os.getpid())
    out = run_distributed(_my_listeners, 2, timeout_s=50)
    parent = list(out[0][1])
    for address in before:
        parent.remove(address)
    assert parent, "the parent's store listener should be visible"
    addresses = [a for mine, _ in out for a in mine] + parent
    assert all(_is_loopback_hex(a) for a in addresses), addresses


_SIGNALLED = """
import os, sys, time
from pathlib import Path
from furnace.runtime.launch import run_distributed

def body(rank, world_size, folder):
    Path(folder, f"{rank}.pid").write_text(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    run_distributed(body, 2, sys.argv[1], timeout_s=110)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_the_parent_leaves_no_rank_behind(tmp_path, sig):
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNALLED)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, parent.communicate(timeout=5)
    parent.send_signal(sig)
    code = parent.wait(timeout=30)
    # SIGTERM is handled: ranks reaped, exit 143; SIGKILL runs no handler: the kernel's
    # parent-death signal ends the ranks
    assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


_CONTEXT = """
import torch, torch.distributed as dist
from furnace.runtime.launch import init_from_env
with init_from_env(timeout_s=30) as ctx:
    x = torch.ones(1)
    dist.all_reduce(x)
assert not dist.is_initialized()
try:
    with init_from_env(timeout_s=30) as ctx:
        raise KeyError("inside")
except KeyError:
    pass
assert not dist.is_initialized()
print("context ok", ctx.world_size)
"""


@pytest.mark.timeout(60)
def test_init_from_env_as_a_context_destroys_the_group_on_success_and_error():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", _CONTEXT], capture_output=True, text=True,
                         env=env, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "context ok 1" in out.stdout


def _joined_existing(rank: int, world_size: int) -> tuple[bool, bool, list[str]]:
    from furnace.runtime.launch import init_from_env

    with pytest.warns(RuntimeWarning) as caught:
        with init_from_env(backend="nccl", timeout_s=7) as ctx:
            owned = ctx.owns_group
    # the group belongs to run_distributed: leaving the block must not have destroyed it
    alive = dist.is_initialized()
    dist.barrier()
    return owned, alive, [str(w.message) for w in caught]


@pytest.mark.timeout(60)
def test_joining_an_existing_group_warns_about_each_ignored_argument_and_leaves_it_alive():
    out = run_distributed(_joined_existing, 2, timeout_s=50)
    for owned, alive, messages in out:
        assert not owned
        assert alive
        assert len(messages) == 2, messages
        assert "backend='nccl' is ignored" in messages[0]
        assert "already exists with backend 'gloo'" in messages[0]
        assert "timeout_s=7 is ignored" in messages[1]


_TINY_BENCH = ["moe", "bench", "--mode", "measured", "--world-size", "2", "--tokens", "8",
               "--d-model", "8", "--d-hidden", "8", "--steps", "1", "--policies", "baseline"]


def _torchrun(tmp_path: Path, entry: str, *argv: str) -> str:
    script = tmp_path / "entry.py"
    script.write_text(TORCHRUN_ENTRY)
    try:
        returncode, out, err = run_torchrun(script, entry, *argv)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert returncode == 0, out + err
    return out + err


_outcomes = torchrun_outcomes


# every entry point that joins a process group under torchrun, on success and on an error
# inside the group; the error is raised on rank 1 only, the harder case for rank 0
_TORCHRUN_CASES = {
    "selfcheck": (("selfcheck",), ("returned 0", "returned 0")),
    "selfcheck-fails": (("selfcheck", "--fail-on-rank-1",
                         "furnace.runtime.selfcheck:check_collectives"),
                        (None, "raised RuntimeError")),
    "cli-selfcheck": (("cli", "selfcheck", "--world-size", "2"), ("returned 0", "returned 0")),
    "moe-bench": (("cli", *_TINY_BENCH), ("returned 0", "returned 0")),
    "moe-bench-fails": (("cli", "--fail-on-rank-1", "furnace.moe.bench:_bench_rank",
                         *_TINY_BENCH), (None, "raised RuntimeError")),
}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(_TORCHRUN_CASES))
def test_no_rank_leaves_a_process_group_alive_under_torchrun(tmp_path, case):
    argv, expected = _TORCHRUN_CASES[case]
    log = _torchrun(tmp_path, *argv)
    outcomes = _outcomes(log)
    assert sorted(outcomes) == [0, 1], log
    for rank, (outcome, alive) in outcomes.items():
        assert alive == "False", f"rank {rank} left its group alive:\n{log}"
        if expected[rank] is not None:
            assert outcome == expected[rank], log
        else:
            # rank 0 fails in a collective its peer left, whichever one it was in
            assert outcome.startswith("raised"), log
    if case == "selfcheck":
        assert "selfcheck: ok (10 ops per rank, 2 ranks, gloo)" in log
    if case == "moe-bench":
        assert "baseline" in log


_THREE_GROUPS = """
import os
import torch
import torch.distributed as dist
from furnace.runtime.launch import init_from_env

rank = int(os.environ["RANK"])
for i in range(3):
    with init_from_env() as ctx:
        total = torch.tensor([float(rank + i)])
        dist.all_reduce(total)
        print(f"rank {rank} group {i} sum {total.item():g}", flush=True)
print(f"rank {rank} done; group alive: {dist.is_initialized()}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_one_process_creates_several_groups_in_turn_under_torchrun(tmp_path):
    # each group has its own namespace in torchrun's store: a second group once read the
    # first one's gloo addresses from a shared prefix and hung or was refused
    script = tmp_path / "groups.py"
    script.write_text(_THREE_GROUPS)
    try:
        returncode, out, err = run_torchrun(script)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    log = out + err
    assert returncode == 0, log
    for rank in (0, 1):
        for i in range(3):
            assert f"rank {rank} group {i} sum {1 + 2 * i:g}" in log, log
        assert f"rank {rank} done; group alive: False" in log, log
