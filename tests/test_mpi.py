"""One worker per MPI rank (mpiexec -n N) against the in-process [N, D] simulation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT, import_error_without, run_python
from tests.rank_worker import DEMO, assert_same_report, gathered, simulate

pytestmark = pytest.mark.skipif(SIMULATOR, reason="MPI runs the CPU target in subprocesses")
pytest.importorskip("mpi4py")
# The mpich wheel puts mpiexec beside the interpreter, which need not be on PATH.
MPIEXEC = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
if MPIEXEC is None:
    pytest.skip("mpiexec is not installed (pip install 'steadystep[mpi]')", allow_module_level=True)

WORKER = Path(__file__).with_name("rank_worker.py")


def launch(
    ranks: int, out: Path, *options: str, simulator: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **({"NUMBA_ENABLE_CUDASIM": "1"} if simulator else {})}
    command = [MPIEXEC, "-n", str(ranks), sys.executable, str(WORKER), "--out", str(out), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)


@pytest.mark.parametrize("ranks", [4, 3])
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", ["one_peer_exponential", "ring", "complete", "matrix", "sparse"])
def test_ranks_match_the_in_process_simulation(topology, order, ranks, tmp_path):
    result = launch(ranks, tmp_path, "--topology", topology, "--order", order)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(ranks, topology, order)
    assert gathered(tmp_path, ranks, "local_rank").tolist() == list(range(ranks))  # all on this machine
    exact = topology in ("one_peer_exponential", "ring")  # same operations in the same order
    for name, reference in (
        ("params", expected.params),
        ("exp_avg", expected.exp_avg),
        ("exp_avg_sq", expected.exp_avg_sq),
    ):
        ours = gathered(tmp_path, ranks, name)
        if exact:
            assert ours.tobytes() == reference.tobytes(), name
        else:
            np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-15 * np.max(np.abs(reference)))


@pytest.mark.parametrize("topology", ["one_peer_exponential", "sparse"])
def test_gpu_rows_go_to_mpi_through_the_cuda_array_interface(topology, tmp_path):
    """Rows in (simulated) GPU memory are handed to MPI as device buffers, after a synchronise;
    the steps run on the CUDA target and equal the in-process CPU simulation."""
    result = launch(4, tmp_path, "--topology", topology, "--steps", "3", "--device-rows", simulator=True)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, topology, "awc", steps=3)
    np.testing.assert_allclose(gathered(tmp_path, 4, "params"), expected.params, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gathered(tmp_path, 4, "exp_avg_sq"), expected.exp_avg_sq, rtol=1e-12, atol=1e-18)


def test_torch_rows_train_as_numpy_rows_and_resume_as_torch(tmp_path):
    pytest.importorskip("torch")
    result = launch(4, tmp_path, "--topology", "one_peer_exponential", "--torch-rows", "--resume-at", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, "one_peer_exponential", "awc")
    for name, reference in (("params", expected.params), ("exp_avg_sq", expected.exp_avg_sq)):
        assert gathered(tmp_path, 4, name).tobytes() == reference.tobytes(), name


def test_a_nan_on_one_rank_stops_every_rank(tmp_path):
    result = launch(4, tmp_path, "--topology", "ring", "--poison", "2", "1")
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"rank {rank}: NonFiniteGradientError: non-finite gradient on worker(s) [2] at step 1" in result.stdout
        ), result.stdout + result.stderr
    assert not list(tmp_path.glob("rank*.npz"))


def test_bad_input_on_one_rank_stops_every_rank_instead_of_hanging_them(tmp_path):
    """Rank 2's gradient is one element short at step 1: it raises the ValueError, and the
    others, which would otherwise wait for it forever in the next exchange, a RankError."""
    result = launch(4, tmp_path, "--topology", "ring", "--short-gradient", "2", "1", timeout=120)
    assert result.returncode != 0
    reason = "ValueError: grad must be this rank's row, of shape (37,); got (36,)"
    assert f"rank 2: {reason}" in result.stdout, result.stdout + result.stderr
    for rank in (0, 1, 3):
        assert (
            f"rank {rank}: RankError: step 1 failed on rank(s) [2] (rank 2: {reason}); no rank changed anything"
            in result.stdout
        ), result.stdout + result.stderr
    assert not list(tmp_path.glob("rank*.npz"))


def test_rows_of_different_lengths_are_refused_on_every_rank(tmp_path):
    """MPI would otherwise truncate or pad the rows it exchanges: ranks 0 and 2 stepped with
    garbage in their last element."""
    result = launch(3, tmp_path, "--topology", "ring", "--short-row", "1", timeout=120)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: every rank's params row must have the same length and dtype; got "
            "rank 0: 37 float64, rank 1: 36 float64, rank 2: 37 float64"
        ) in result.stdout, result.stdout + result.stderr


def test_a_bad_row_on_one_rank_stops_every_rank_as_the_workers_are_created(tmp_path):
    result = launch(3, tmp_path, "--topology", "complete", "--matrix-row", "0", timeout=120)
    assert result.returncode != 0
    reason = "ValueError: params must be this rank's [D] row, got shape (1, 37)"
    assert f"rank 0: {reason}" in result.stdout, result.stdout + result.stderr
    for rank in (1, 2):
        assert f"rank {rank}: RankError: creating the workers failed on rank(s) [0] (rank 0: {reason})" in result.stdout


def test_a_checkpoint_missing_on_one_rank_stops_every_rank(tmp_path):
    result = launch(
        3, tmp_path, "--topology", "one_peer_exponential", "--resume-at", "2", "--lose-checkpoint", "1", timeout=120
    )
    assert result.returncode != 0
    assert "rank 1: FileNotFoundError" in result.stdout, result.stdout + result.stderr
    for rank in (0, 2):
        assert (
            f"rank {rank}: RankError: loading the checkpoint failed on rank(s) [1] (rank 1: FileNotFoundError"
            in result.stdout
        ), result.stdout + result.stderr


def test_a_save_that_fails_on_one_rank_leaves_every_ranks_previous_checkpoint(tmp_path):
    """Rank 1 cannot write its file: the other ranks used to replace theirs anyway, leaving a
    set of files from two different steps. Now every rank keeps the previous save, resumes
    from it, and the run ends as the simulation does."""
    result = launch(
        3, tmp_path, "--topology", "one_peer_exponential", "--resume-at", "2", "--failed-save", "1", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1: save failed: IsADirectoryError" in result.stdout, result.stdout
    for rank in range(3):
        assert f"rank {rank}: resumed at t=2" in result.stdout, result.stdout
    assert gathered(tmp_path, 3, "params").tobytes() == simulate(3, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_files_of_different_saves_are_refused_on_every_rank(tmp_path):
    """One rank's file from an earlier save (restored by hand, or a copy gone wrong): the ranks
    would have mixed with different W_t, or waited forever on mismatched exchanges."""
    result = launch(
        3, tmp_path, "--topology", "one_peer_exponential", "--resume-at", "2", "--stale-checkpoint", "2", timeout=120
    )
    assert result.returncode != 0
    for rank in range(3):
        assert f"rank {rank}: ValueError: the checkpoint files" in result.stdout, result.stdout + result.stderr
    assert "(rank 0: t=3, rank 1: t=3, rank 2: t=2)" in result.stdout, result.stdout


def test_one_rank_is_plain_decentralized_adamw(tmp_path):
    result = launch(1, tmp_path, "--topology", "one_peer_exponential")
    assert result.returncode == 0, result.stderr
    assert gathered(tmp_path, 1, "params").tobytes() == simulate(1, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_per_rank_resumes_bit_for_bit(tmp_path):
    result = launch(4, tmp_path, "--topology", "one_peer_exponential", "--order", "atc", "--resume-at", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(tmp_path.glob("checkpoint.rank*.npz"))) == 4
    assert gathered(tmp_path, 4, "params").tobytes() == simulate(4, "one_peer_exponential", "atc").params.tobytes()


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


@pytest.mark.parametrize("ranks", [4, 3])
def test_demo_with_the_mpi_backend_matches_the_local_demo(ranks, tmp_path):
    """`mpiexec -n N python -m steadystep demo --backend mpi`: rank 0 writes the report, and its
    numbers are the in-process run's (bit for bit where the operations are the same)."""
    from steadystep import demo

    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        MPIEXEC,
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "steadystep",
        "demo",
        "--backend",
        "mpi",
        *DEMO,
        "--output-dir",
        str(tmp_path / "mpi"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("wrote") == 1  # only rank 0 reports
    # one stream under mpiexec: hydra forwards stdout and stderr apart, and spliced the table
    # into the progress line
    assert "steadystep demo:" not in result.stderr
    assert result.stdout.index("steadystep demo:") < result.stdout.index("\nmean model x̄ after training")
    assert demo.main([*DEMO, "--workers", str(ranks), "--output-dir", str(tmp_path / "local")]) == 0
    assert_same_report(tmp_path / "mpi", tmp_path / "local", "mpi", ranks)


def test_the_demo_gives_each_rank_on_a_machine_its_own_gpu(monkeypatch):
    """--backend mpi --device cuda: the rank's place on its machine, modulo its GPUs, is made
    current before any GPU work (rank 3 of a machine with 2 GPUs takes GPU 1)."""
    import steadystep.cuda.runtime
    import steadystep.mpi
    from steadystep import demo

    selected = []

    class TwoGpus:
        gpus = ["gpu 0", "gpu 1"]
        select_device = staticmethod(selected.append)

    monkeypatch.setattr(steadystep.cuda.runtime, "require_cuda", lambda: TwoGpus)
    monkeypatch.setattr(steadystep.mpi, "local_rank", lambda comm=None: 3)
    demo._backend(demo.Settings(backend="mpi", device="cuda", workers=1), [])
    assert selected == [1]
    demo._backend(demo.Settings(backend="mpi", device="cpu", workers=1), [])
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
