"""One worker per torch.distributed rank (torchrun, gloo) against the in-process [N, D] simulation,
and against steadystep.mpi's files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT, run_python
from tests.rank_worker import DEMO, assert_same_report, gathered, simulate

pytestmark = pytest.mark.skipif(SIMULATOR, reason="torch.distributed runs the CPU target in subprocesses")
pytest.importorskip("torch.distributed")

WORKER = Path(__file__).with_name("rank_worker.py")


def launch(ranks: int, out: Path, *options: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """torchrun with ``ranks`` processes on this machine (a free port of its own: --standalone)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command += [str(WORKER), "--backend", "torch", "--out", str(out), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)


@pytest.mark.parametrize("ranks", [4, 3])
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", ["one_peer_exponential", "ring", "complete", "matrix", "sparse"])
def test_ranks_match_the_in_process_simulation(topology, order, ranks, tmp_path):
    result = launch(ranks, tmp_path, "--topology", topology, "--order", order)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(ranks, topology, order)
    assert gathered(tmp_path, ranks, "local_rank").tolist() == list(range(ranks))  # torchrun's LOCAL_RANK
    exact = topology in ("one_peer_exponential", "ring")  # the same operations in the same order
    for name, reference in (
        ("params", expected.params),
        ("exp_avg", expected.exp_avg),
        ("exp_avg_sq", expected.exp_avg_sq),
    ):
        ours = gathered(tmp_path, ranks, name)
        if exact:
            assert ours.tobytes() == reference.tobytes(), name
        else:  # gloo's all_reduce and the sparse sums add in their own order
            np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-15 * np.max(np.abs(reference)))


def test_a_nan_on_one_rank_stops_every_rank(tmp_path):
    result = launch(4, tmp_path, "--topology", "ring", "--poison", "2", "1")
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"rank {rank}: NonFiniteGradientError: non-finite gradient on worker(s) [2] at step 1" in result.stdout
        ), result.stdout + result.stderr
    assert not list(tmp_path.glob("rank*.npz"))


def test_bad_input_on_one_rank_stops_every_rank_instead_of_hanging_them(tmp_path):
    result = launch(3, tmp_path, "--topology", "complete", "--short-gradient", "1", "2", timeout=120)
    assert result.returncode != 0
    reason = "ValueError: grad must be this rank's row, of shape (37,); got (36,)"
    assert f"rank 1: {reason}" in result.stdout, result.stdout + result.stderr
    for rank in (0, 2):
        assert (
            f"rank {rank}: RankError: step 2 failed on rank(s) [1] (rank 1: {reason}); no rank changed anything"
            in result.stdout
        ), result.stdout + result.stderr


def test_ranks_that_disagree_on_a_setting_are_refused_on_every_rank(tmp_path):
    """Rank 2 was given another learning rate: every rank says so as the workers are made,
    instead of training a different problem than the others without a word."""
    result = launch(3, tmp_path, "--topology", "one_peer_exponential", "--odd-lr", "2", timeout=120)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: every rank must run with the same settings; they differ in lr: "
            "rank 0 0.05, rank 1 0.05, rank 2 0.07"
        ) in result.stdout, result.stdout + result.stderr


def test_rows_of_different_lengths_are_refused_on_every_rank(tmp_path):
    result = launch(3, tmp_path, "--topology", "ring", "--short-row", "1", timeout=120)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: every rank's params row must have the same length and dtype; got "
            "rank 0: 37 float64, rank 1: 36 float64, rank 2: 37 float64"
        ) in result.stdout, result.stdout + result.stderr


def test_one_rank_is_plain_decentralized_adamw(tmp_path):
    result = launch(1, tmp_path, "--topology", "one_peer_exponential")
    assert result.returncode == 0, result.stdout + result.stderr
    assert gathered(tmp_path, 1, "params").tobytes() == simulate(1, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_per_rank_resumes_bit_for_bit(tmp_path):
    result = launch(4, tmp_path, "--topology", "one_peer_exponential", "--order", "atc", "--resume-at", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(tmp_path.glob("checkpoint.rank*.npz"))) == 4
    assert gathered(tmp_path, 4, "params").tobytes() == simulate(4, "one_peer_exponential", "atc").params.tobytes()


def test_torch_rows_train_as_numpy_rows_and_resume_as_torch(tmp_path):
    result = launch(3, tmp_path, "--topology", "one_peer_exponential", "--torch-rows", "--resume-at", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, "one_peer_exponential", "awc")
    for name, reference in (("params", expected.params), ("exp_avg_sq", expected.exp_avg_sq)):
        assert gathered(tmp_path, 3, name).tobytes() == reference.tobytes(), name


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


@pytest.mark.parametrize("ranks", [4, 3])
def test_demo_with_the_torch_backend_matches_the_local_demo(ranks, tmp_path):
    """`torchrun --nproc-per-node N -m steadystep demo --backend torch`: rank 0 writes the report,
    and its numbers are the in-process run's (bit for bit where the operations are the same)."""
    from steadystep import demo

    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command += ["-m", "steadystep", "demo", "--backend", "torch", *DEMO, "--output-dir", str(tmp_path / "ranks")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("wrote") == 1  # only rank 0 reports
    assert demo.main([*DEMO, "--workers", str(ranks), "--output-dir", str(tmp_path / "local")]) == 0
    assert_same_report(tmp_path / "ranks", tmp_path / "local", "torch", ranks)


def test_the_torch_backend_demo_alone_warns_and_a_contradicting_worker_count_is_refused():
    code = """
import sys
from steadystep import demo
rank, settings = demo._backend(demo.Settings(backend="torch", device="cpu", workers=8), [])
print("ranks", rank, settings.workers)
try:
    demo._backend(demo.Settings(backend="torch", device="cpu", workers=8), ["--workers", "8"])
except SystemExit:
    print("refused")
"""
    result = run_python(code)
    assert "ranks 0 1" in result.stdout and "refused" in result.stdout, result.stdout + result.stderr
    assert "--backend torch with one torch.distributed rank" in result.stderr
    assert "--workers 8 but torchrun started 1 ranks" in result.stderr


@pytest.mark.parametrize("topology", ["one_peer_exponential", "complete"])
def test_a_run_moves_between_one_process_and_ranks_through_its_checkpoint(topology, tmp_path):
    """Two steps in one process, split into rank files, two more under torchrun; and the
    reverse: two steps under torchrun, the rank files joined, two more in one process. Both
    end where four steps in one process do (bit for bit for one peer; complete: the ranks'
    sum adds in another order)."""
    from steadystep import ranks
    from tests.rank_worker import gradient

    order, width = "atc", 37
    ranks.split_checkpoint(simulate(4, topology, order, steps=2), tmp_path / "split")
    result = launch(
        4, tmp_path, "--topology", topology, "--order", order, "--steps", "2", "--resume-from", str(tmp_path / "split")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    straight = simulate(4, topology, order, steps=4)
    check = (
        (lambda a, b: a.tobytes() == b.tobytes())
        if topology != "complete"
        else (lambda a, b: np.allclose(a, b, rtol=1e-12, atol=1e-15))
    )
    assert check(gathered(tmp_path, 4, "params"), straight.params)

    result = launch(
        4, tmp_path, "--topology", topology, "--order", order, "--steps", "2", "--save-at-end", str(tmp_path / "run")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    joined = ranks.join_checkpoint(tmp_path / "run")
    assert (joined.workers, joined.t, joined.order, joined.topology.name) == (4, 2, order, topology)
    for t in (2, 3):
        joined.step(np.stack([gradient(rank, t, width, None) for rank in range(4)]))
    for name in ("params", "exp_avg", "exp_avg_sq"):
        assert check(getattr(joined, name), getattr(straight, name)), name


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
