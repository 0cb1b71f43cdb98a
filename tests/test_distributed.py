"""One worker per torch.distributed rank (torchrun, gloo) against the in-process [N, D] simulation,
and against steadystep.mpi's files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR
from tests.helpers import run_python
from tests.rank_worker import gathered, simulate
from tests.rank_worker import launch as launch_ranks

pytestmark = pytest.mark.skipif(SIMULATOR, reason="torch.distributed runs the CPU target in subprocesses")
pytest.importorskip("torch.distributed")


def launch(ranks: int, out: Path, *options: str, **settings) -> subprocess.CompletedProcess:
    return launch_ranks("torch", ranks, out, *options, **settings)


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
