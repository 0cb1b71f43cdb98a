"""One worker per torch.distributed rank (torchrun, gloo) against the in-process [N, D] simulation,
and against steadystep.mpi's files."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR
from tests.helpers import run_python
from tests.rank_worker import gathered, launcher, rank_environment, simulate
from tests.rank_worker import launch as launch_ranks

pytestmark = pytest.mark.skipif(SIMULATOR, reason="torch.distributed runs the CPU target in subprocesses")
pytest.importorskip("torch.distributed")


def launch(ranks: int, out: Path, *options: str, **settings) -> subprocess.CompletedProcess:
    return launch_ranks("torch", ranks, out, *options, **settings)


RANKS_SCRIPT = r"""
import os, sys, time
import numba
rank = int(os.environ["RANK"])
simulator = numba.config.ENABLE_CUDASIM
sys.stdout.write(f"rank {rank} of {os.environ['WORLD_SIZE']}: {__name__} {sys.argv[1:]} {simulator}\n")  # one write
sys.stdout.flush()
if sys.argv[1] == "fail":
    if rank == 1:
        sys.exit(3)
    if rank == 2:
        raise KeyError("rank 2 raised")
    time.sleep(600)  # stopped by the launcher, or the launch times out
if sys.argv[1] == "hang":
    open(os.path.join(os.path.dirname(__file__), f"rank{rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a process killed but not yet reaped by its new parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_rank_launcher_runs_each_rank_as_main_and_stops_the_others_when_one_fails(tmp_path):
    """tests/spawn_ranks.py forks its ranks from a server that imported torch: each still runs
    the script as ``python`` would, the first rank to fail ends the launch with its code, the
    others stopped rather than left waiting; a launch that needs other imports (the simulator)
    runs apart, and a launch whose client is killed is stopped."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    environment = rank_environment()

    def run(what: str, ranks: int = 4, timeout: float = 120, **settings: str) -> subprocess.CompletedProcess:
        command = [*launcher("torch", ranks), str(script), what]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**environment, **settings})

    passed = run("pass")
    assert passed.returncode == 0, passed.stderr
    assert sorted(passed.stdout.splitlines()) == [f"rank {rank} of 4: __main__ ['pass'] 0" for rank in range(4)]
    failed = run("fail")
    assert failed.returncode in (1, 3), failed.stderr
    if failed.returncode == 3:
        assert "spawn_ranks: rank 1 exited with 3" in failed.stderr
    else:
        assert "KeyError: 'rank 2 raised'" in failed.stderr and "spawn_ranks: rank 2 exited with 1" in failed.stderr
    # The launch server imported Numba for the CPU: a launch on the simulator gets ranks of its own
    simulated = run("pass", ranks=1, NUMBA_ENABLE_CUDASIM="1")
    assert simulated.returncode == 0 and simulated.stdout == "rank 0 of 1: __main__ ['pass'] 1\n", simulated.stderr
    # A test's timeout kills the launch's client (as subprocess.run does, once both ranks run):
    # the server then stops the launch's ranks
    client = subprocess.Popen(
        [*launcher("torch", 2), str(script), "hang"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment,
    )
    files = [tmp_path / f"rank{rank}.pid" for rank in range(2)]
    deadline = time.monotonic() + 120
    while not all(file.exists() and file.read_text() for file in files) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.poll() is None, "the hanging launch ended by itself"
    client.kill()
    client.wait()
    pids = [int(file.read_text()) for file in files]
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in pids)


def test_without_a_process_group_the_worker_says_what_to_call():
    code = """
import numpy as np
from steadystep import decentral
from steadystep.torch.distributed import DistributedAdamW
try:
    DistributedAdamW(np.zeros(4), topology=decentral.ring())
except RuntimeError as error:
    print(error)
"""
    result = run_python(code)
    assert "torch.distributed is not initialised: call torch.distributed.init_process_group('gloo')" in result.stdout


def test_the_torch_backend_demo_alone_warns_and_a_contradicting_worker_count_is_refused():
    code = """
import sys
from steadystep import demo
from steadystep.demo import cli
rank, settings = cli.start_backend(demo.Settings(backend="torch", device="cpu", workers=8), [])
print("ranks", rank, settings.workers)
try:
    cli.start_backend(demo.Settings(backend="torch", device="cpu", workers=8), ["--workers", "8"])
except SystemExit:
    print("refused")
"""
    result = run_python(code)
    assert "ranks 0 1" in result.stdout and "refused" in result.stdout, result.stdout + result.stderr
    assert "--backend torch with one torch.distributed rank" in result.stderr
    assert "--workers 8 but torchrun started 1 ranks" in result.stderr


def test_a_run_moves_between_mpi_and_torch_distributed(tmp_path):
    """Two steps over MPI, saved; two more over torch.distributed from those files: where four
    steps in one process end, bit for bit (the backends write the same per-rank files)."""
    pytest.importorskip("mpi4py")
    from tests.test_mpi import launch as launch_mpi

    result = launch_mpi(3, tmp_path, "--topology", "ring", "--steps", "2", "--save-at-end", str(tmp_path / "mpi"))
    assert result.returncode == 0, result.stdout + result.stderr
    result = launch(3, tmp_path, "--topology", "ring", "--steps", "2", "--resume-from", str(tmp_path / "mpi"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert gathered(tmp_path, 3, "params").tobytes() == simulate(3, "ring", "awc", steps=4).params.tobytes()
