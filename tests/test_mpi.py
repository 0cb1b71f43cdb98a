"""One worker per MPI rank (mpiexec -n N) against the in-process [N, D] simulation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from steadystep import decentral
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="MPI runs the CPU target in subprocesses")
pytest.importorskip("mpi4py")
# The mpich wheel puts mpiexec beside the interpreter, which need not be on PATH.
MPIEXEC = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
if MPIEXEC is None:
    pytest.skip("mpiexec is not installed (pip install 'steadystep[mpi]')", allow_module_level=True)

WORKER = Path(__file__).with_name("mpi_worker.py")
ROOT = Path(__file__).resolve().parents[1]


def launch(ranks: int, out: Path, *options: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [MPIEXEC, "-n", str(ranks), sys.executable, str(WORKER), "--out", str(out), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


def simulate(ranks: int, topology_name: str, order: str, steps: int = 4, width: int = 37):
    sys.path.insert(0, str(ROOT))
    from tests.mpi_worker import gradient

    topology = decentral.from_matrix(np.full((ranks, ranks), 1 / ranks), "matrix") if topology_name == "matrix" \
        else decentral.TOPOLOGIES[topology_name]()
    start = np.stack([np.random.default_rng(rank).normal(size=width) for rank in range(ranks)])
    workers = decentral.DecentralizedAdamW(start, topology=topology, order=order, lr=0.05, weight_decay=0.01, max_norm=1.0)
    for t in range(steps):
        workers.step(np.stack([gradient(rank, t, width, None) for rank in range(ranks)]))
    return workers


def gathered(out: Path, ranks: int, name: str) -> np.ndarray:
    return np.stack([np.load(out / f"rank{rank}.npz")[name] for rank in range(ranks)])


@pytest.mark.parametrize("ranks", [4, 3])
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", ["one_peer_exponential", "ring", "complete", "matrix"])
def test_ranks_match_the_in_process_simulation(topology, order, ranks, tmp_path):
    result = launch(ranks, tmp_path, "--topology", topology, "--order", order)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(ranks, topology, order)
    exact = topology in ("one_peer_exponential", "ring")  # same operations in the same order
    for name, reference in (("params", expected.params), ("exp_avg", expected.exp_avg), ("exp_avg_sq", expected.exp_avg_sq)):
        ours = gathered(tmp_path, ranks, name)
        if exact:
            assert ours.tobytes() == reference.tobytes(), name
        else:
            np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-15 * np.max(np.abs(reference)))


def test_a_nan_on_one_rank_stops_every_rank(tmp_path):
    result = launch(4, tmp_path, "--topology", "ring", "--poison", "2", "1")
    assert result.returncode != 0
    for rank in range(4):
        assert f"rank {rank}: non-finite gradient on worker(s) [2] at step 1" in result.stdout, result.stdout + result.stderr
    assert not list(tmp_path.glob("rank*.npz"))


def test_one_rank_is_plain_decentralized_adamw(tmp_path):
    result = launch(1, tmp_path, "--topology", "one_peer_exponential")
    assert result.returncode == 0, result.stderr
    assert gathered(tmp_path, 1, "params").tobytes() == simulate(1, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_per_rank_resumes_bit_for_bit(tmp_path):
    result = launch(4, tmp_path, "--topology", "one_peer_exponential", "--order", "atc", "--resume-at", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(tmp_path.glob("checkpoint.rank*.npz"))) == 4
    assert gathered(tmp_path, 4, "params").tobytes() == simulate(4, "one_peer_exponential", "atc").params.tobytes()
