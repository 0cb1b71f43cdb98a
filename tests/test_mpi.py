"""One worker per MPI rank (mpiexec -n N) against the in-process [N, D] simulation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT, import_error_without, run_python
from tests.rank_worker import BACKENDS, MPIEXEC, gathered, launcher, rank_environment, simulate
from tests.rank_worker import launch as launch_ranks

pytestmark = pytest.mark.skipif(SIMULATOR, reason="MPI runs the CPU target in subprocesses")
if BACKENDS["mpi"]():
    pytest.skip(BACKENDS["mpi"](), allow_module_level=True)


def launch(ranks: int, out: Path, *options: str, **settings) -> subprocess.CompletedProcess:
    return launch_ranks("mpi", ranks, out, *options, **settings)


RANKS_SCRIPT = r"""
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
sys.stdout.write(f"rank {comm.Get_rank()} of {comm.Get_size()}: {__name__} {sys.argv[1:]} {total} {os.getppid()}\n")
sys.stdout.flush()
if sys.argv[1] == "fail" and comm.Get_rank() == 1:
    sys.exit(3)
"""


def test_mpi_ranks_forked_by_the_launch_server_meet_over_mpi_and_end_with_their_code(tmp_path):
    """tests/spawn_ranks.py --join: each process mpiexec starts hands itself over to the launch
    server, whose fork is the rank: it runs the script as ``python`` would, initialises MPI over
    mpiexec's connection (the ranks sum over MPI) in a process other than the one mpiexec started,
    and its exit code is the launch's."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)

    command = launcher("mpi", 3)
    server = command[-1]  # the launch server's pid: each rank's parent

    def run(what: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*command, str(script), what], capture_output=True, text=True, timeout=120, env=rank_environment()
        )

    passed = run("pass")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert sorted(passed.stdout.splitlines()) == [
        f"rank {rank} of 3: __main__ ['pass'] 6 {server}" for rank in range(3)
    ]
    failed = run("fail")
    assert failed.returncode == 3, failed.stdout + failed.stderr


@pytest.mark.parametrize("topology", ["one_peer_exponential", "sparse"])
def test_gpu_rows_go_to_mpi_through_the_cuda_array_interface(topology, tmp_path):
    """Rows in (simulated) GPU memory are handed to MPI as device buffers, after a synchronise;
    the steps run on the CUDA target and equal the in-process CPU simulation."""
    result = launch(4, tmp_path, "--topology", topology, "--steps", "3", "--device-rows", simulator=True)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, topology, "awc", steps=3)
    np.testing.assert_allclose(gathered(tmp_path, 4, "params"), expected.params, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gathered(tmp_path, 4, "exp_avg_sq"), expected.exp_avg_sq, rtol=1e-12, atol=1e-18)


def test_checkpoint_resumes_gpu_rows_on_the_gpu(tmp_path):
    """MPIAdamW.load(like=row) puts the resumed state where the run's rows live."""
    result = launch(
        4,
        tmp_path,
        "--topology",
        "one_peer_exponential",
        "--steps",
        "3",
        "--resume-at",
        "1",
        "--device-rows",
        simulator=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, "one_peer_exponential", "awc", steps=3)
    np.testing.assert_allclose(gathered(tmp_path, 4, "params"), expected.params, rtol=1e-12, atol=1e-15)


def test_a_checkpoint_from_another_world_size_is_refused(tmp_path):
    code = f"""
import numpy as np
from steadystep import decentral
from steadystep.mpi import MPIAdamW

class Ranks:  # rank 0 of `size`: no other process is needed to save and load rank 0's file
    def __init__(self, size): self.size = size
    def Get_rank(self): return 0
    def Get_size(self): return self.size
    def allgather(self, value): return [value] * self.size  # every rank did as rank 0
    def Split_type(self, kind): return self  # the ranks on this machine: all of them
    def Free(self): pass

MPIAdamW(np.zeros(4), topology=decentral.ring(), comm=Ranks(2)).save({str(tmp_path / "run")!r})
try:
    MPIAdamW.load({str(tmp_path / "run")!r}, topology=decentral.ring(), comm=Ranks(3))
except ValueError as error:
    print(error)
"""
    result = run_python(code)
    assert (
        result.stdout.strip() == "checkpoint is from 2 ranks with topology 'ring'; this run has 3 ranks and 'ring'"
    ), result.stdout + result.stderr


def test_the_demo_gives_each_rank_on_a_machine_its_own_gpu(monkeypatch):
    """--backend mpi --device cuda: the rank's place on its machine, modulo its GPUs, is made
    current before any GPU work (rank 3 of a machine with 2 GPUs takes GPU 1)."""
    import steadystep.cuda.runtime
    import steadystep.mpi
    from steadystep import demo
    from steadystep.demo import cli

    selected = []

    class TwoGpus:
        gpus = ["gpu 0", "gpu 1"]
        select_device = staticmethod(selected.append)

    monkeypatch.setattr(steadystep.cuda.runtime, "require_cuda", lambda: TwoGpus)
    monkeypatch.setattr(steadystep.mpi, "local_rank", lambda comm=None: 3)
    cli.start_backend(demo.Settings(backend="mpi", device="cuda", workers=1), [])
    assert selected == [1]
    cli.start_backend(demo.Settings(backend="mpi", device="cpu", workers=1), [])
    assert selected == [1]


def test_demo_workers_flag_must_match_the_ranks(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        MPIEXEC,
        "-n",
        "2",
        sys.executable,
        "-m",
        "steadystep",
        "demo",
        "--backend",
        "mpi",
        "--workers",
        "3",
        "--output-dir",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 2
    assert "--workers 3 but mpiexec started 2 ranks" in result.stderr and "Traceback" not in result.stderr


def test_a_bad_learning_rate_is_refused_before_awc_mixes(tmp_path):
    """AWC mixes the parameters before the local step; a bad lr must stop it first."""
    code = """
import numpy as np
from steadystep import decentral
from steadystep.mpi import MPIAdamW

class TwoRanks:  # rank 0 of two, the other rank's row all 100s: no second process is needed
    def Get_rank(self): return 0
    def Get_size(self): return 2
    def allgather(self, value): return [value, value]
    def Split_type(self, kind): return self
    def Free(self): pass
    def Allreduce(self, send, receive, op): receive[...] = send + 100.0

row = np.arange(6.0)
worker = MPIAdamW(row, topology=decentral.complete(), consensus=0.5, comm=TwoRanks())
worker.step(np.ones(6), lr=0.1)
before = worker.params.copy()
try:
    worker.step(np.ones(6), lr=float("nan"))
except ValueError as error:
    assert "lr must" in str(error), error
    assert worker.params.tobytes() == before.tobytes() and worker.t == 1
    print("refused, nothing written")
"""
    result = run_python(code)
    assert result.stdout.strip() == "refused, nothing written", result.stdout + result.stderr


def test_without_mpi4py_the_import_says_what_to_install():
    error = import_error_without("mpi4py", "steadystep.mpi")
    assert error.startswith("steadystep.mpi needs mpi4py: pip install 'steadystep[mpi]'"), error


def test_a_consensus_outside_zero_to_one_a_topology_by_name_or_a_matrix_for_another_world_is_refused():
    # The rank's local worker mixes nothing (consensus 1), so MPIAdamW checks it itself.
    code = """
import numpy as np
from steadystep import decentral
from steadystep.mpi import MPIAdamW
for consensus in (1.5, -0.1, float("nan"), "0.5"):
    try:
        MPIAdamW(np.zeros(4), topology=decentral.ring(), consensus=consensus)
    except ValueError as error:
        assert "consensus must be a number in [0, 1]" in str(error), error
    else:
        raise AssertionError(consensus)
# a name instead of a Topology, and a list (it would train a copy): AttributeErrors before
for row, topology, message in ((np.zeros(4), "ring", "topology must be a Topology, such as decentral.ring()"),
                               ([0.0] * 4, decentral.ring(), "params is a list, which can only be read as a copy")):
    try:
        MPIAdamW(row, topology=topology)
    except TypeError as error:
        assert message in str(error), error
    else:
        raise AssertionError(message)
try:  # a fixed matrix for another number of ranks (this is one), refused before any exchange
    MPIAdamW(np.zeros(4), topology=decentral.from_matrix(np.full((2, 2), 0.5)))
except ValueError as error:
    assert "has shape (2, 2); the run has 1 worker(s), so it must be (1, 1)" in str(error), error
else:
    raise AssertionError("matrix")
print("refused")
print(repr(MPIAdamW(np.zeros(1000, np.float32), topology=decentral.ring(), lr=0.01)))  # what a notebook shows
"""
    result = run_python(code)
    assert result.stdout.splitlines() == [
        "refused",
        "MPIAdamW(rank 0 of 1, 1,000 float32 on cpu, topology=ring, t=0, order='awc', lr=0.01, "
        "betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0, max_norm=None, consensus=1.0)",
    ], result.stdout + result.stderr
