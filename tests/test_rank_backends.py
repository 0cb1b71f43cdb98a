"""One worker per rank, under mpiexec (MPI) and under torchrun (torch.distributed, gloo): the
same worker script, the same checks against the in-process [N, D] simulation. The cases of a
rank count share one launch per backend (tests/launches.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numba
import numpy as np
import pytest

from tests.conftest import SIMULATOR
from tests.launches import Launches
from tests.rank_worker import (
    BACKENDS,
    DEMO,
    assert_same_report,
    gathered,
    launch,
    launcher,
    rank_environment,
    simulate,
)

pytestmark = [
    pytest.mark.skipif(SIMULATOR, reason="the ranks run the CPU target in subprocesses"),
    pytest.mark.xdist_group("rank_backends"),
]

TOPOLOGIES = ["one_peer_exponential", "ring", "complete", "matrix", "sparse"]
RANKS = Launches(Path(__file__).with_name("rank_worker.py"), launch)
MATCH = {
    (topology, order, ranks): RANKS.case(ranks, "--topology", topology, "--order", order)
    for topology in TOPOLOGIES
    for order in ("awc", "atc")
    for ranks in (4, 3)
}
TORCH_ROWS = RANKS.case(4, "--topology", "one_peer_exponential", "--torch-rows", "--resume-at", "2")
NAN = RANKS.case(4, "--topology", "ring", "--poison", "2", "1")
SHORT_GRADIENT = RANKS.case(4, "--topology", "ring", "--short-gradient", "2", "1")
SHORT_ROW = RANKS.case(3, "--topology", "ring", "--short-row", "1")
MATRIX_ROW = RANKS.case(3, "--topology", "complete", "--matrix-row", "0")
RESUMED = ("--topology", "one_peer_exponential", "--resume-at", "2")  # 3 ranks, saving at step 2 and resuming
LOST = RANKS.case(3, *RESUMED, "--lose-checkpoint", "1")
FAILED_SAVE = RANKS.case(3, *RESUMED, "--failed-save", "1")
STALE = RANKS.case(3, *RESUMED, "--stale-checkpoint", "2")
ONE_RANK = RANKS.case(1, "--topology", "one_peer_exponential")
RESUME = RANKS.case(4, "--topology", "one_peer_exponential", "--order", "atc", "--resume-at", "2")
ODD_LR = RANKS.case(3, "--topology", "one_peer_exponential", "--odd-lr", "2")
GOSSIP = {  # compressed gossip: (topology, order, compressor), 4 ranks, rows of two blocks
    case: RANKS.case(4, "--topology", case[0], "--order", case[1], "--compression", case[2], "--width", "300")
    for case in [
        ("one_peer_exponential", "awc", "int8"),
        ("one_peer_exponential", "atc", "int8"),
        ("ring", "atc", "top_k"),
        ("complete", "awc", "random_k"),
        ("directed_ring", "atc", "int4"),
        ("base_2_graph", "awc", "int8"),
    ]
}
GOSSIP_RESUMED = RANKS.case(
    3, "--topology", "one_peer_exponential", "--order", "atc", "--compression", "int8", "--resume-at", "2"
)
GOSSIP_NO_PERIOD = RANKS.case(3, "--topology", "sparse", "--compression", "int8")
OUTER = {  # DiLoCo every 2 steps: (topology, compressor of the pseudo-gradients), 4 ranks
    case: RANKS.case(
        4, "--topology", case[0], "--outer", "--width", "300", *(("--compression", case[1]) * bool(case[1]))
    )
    for case in [("complete", ""), ("complete", "int8"), ("one_peer_exponential", ""), ("base_2_graph", "top_k")]
}
OUTER_RESUMED = RANKS.case(3, "--topology", "ring", "--outer", "--compression", "int4", "--resume-at", "3")


def _split_after_two_steps(topology: str, compression: str | None, outer: bool):
    def prepare(out: Path) -> None:
        from steadystep import ranks

        run = simulate(4, topology, "atc", steps=2, compression=compression, outer=outer)
        ranks.split_checkpoint(run, out / "split")

    return prepare


MOVES = {  # (2 more steps from rank files split from 2 in one process, 2 steps saved as rank files)
    (topology, compression, outer): (
        RANKS.case(
            4,
            *two_steps,
            "--resume-from",
            "{out}/split",
            prepare=_split_after_two_steps(topology, compression, outer),
        ),
        RANKS.case(4, *two_steps, "--save-at-end", "{out}/run"),
    )
    for topology, compression, outer in (
        ("one_peer_exponential", None, False),
        ("complete", None, False),
        ("ring", "int8", False),
        ("ring", "int8", True),
    )
    for two_steps in [
        ("--topology", topology, "--order", "atc", "--steps", "2")
        + (("--compression", compression) if compression else ())
        + (("--outer",) if outer else ())
    ]
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    missing = BACKENDS[request.param]()
    if missing:
        pytest.skip(missing)
    return request.param


@pytest.mark.parametrize("ranks", [4, 3])
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_ranks_match_the_in_process_simulation(backend, topology, order, ranks):
    result = MATCH[topology, order, ranks].run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(ranks, topology, order)
    assert gathered(result.out, ranks, "local_rank").tolist() == list(range(ranks))  # all on this machine
    # the ranks split the machine's cores between them, rather than each starting a thread a core
    share = min(max(1, len(os.sched_getaffinity(0)) // ranks), numba.config.NUMBA_NUM_THREADS)
    assert gathered(result.out, ranks, "threads").ravel().tolist() == [share] * ranks
    exact = topology in ("one_peer_exponential", "ring")  # same operations in the same order
    for name, reference in (
        ("params", expected.params),
        ("exp_avg", expected.exp_avg),
        ("exp_avg_sq", expected.exp_avg_sq),
    ):
        ours = gathered(result.out, ranks, name)
        if exact:
            assert ours.tobytes() == reference.tobytes(), name
        else:
            np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-15 * np.max(np.abs(reference)))
    # each rank counts what it sent as the simulation counts its worker
    np.testing.assert_array_equal(gathered(result.out, ranks, "bytes_sent").ravel(), expected.bytes_sent)


def test_torch_rows_train_as_numpy_rows_and_resume_as_torch(backend):
    pytest.importorskip("torch")
    result = TORCH_ROWS.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, "one_peer_exponential", "awc")
    for name, reference in (("params", expected.params), ("exp_avg_sq", expected.exp_avg_sq)):
        assert gathered(result.out, 4, name).tobytes() == reference.tobytes(), name


def test_a_nan_on_one_rank_stops_every_rank(backend):
    result = NAN.run(backend)
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"rank {rank}: NonFiniteGradientError: non-finite gradient on worker(s) [2] at step 1" in result.stdout
        ), result.stdout + result.stderr
    assert not list(result.out.glob("rank*.npz"))


def test_bad_input_on_one_rank_stops_every_rank_instead_of_hanging_them(backend):
    """Rank 2's gradient is one element short at step 1: it raises the ValueError, and the
    others, which would otherwise wait for it forever in the next exchange, a RankError."""
    result = SHORT_GRADIENT.run(backend)
    assert result.returncode != 0
    reason = "ValueError: grad must be this rank's row, of shape (37,); got (36,)"
    assert f"rank 2: {reason}" in result.stdout, result.stdout + result.stderr
    for rank in (0, 1, 3):
        assert (
            f"rank {rank}: RankError: step 1 failed on rank(s) [2] (rank 2: {reason}); no rank changed anything"
            in result.stdout
        ), result.stdout + result.stderr
    assert not list(result.out.glob("rank*.npz"))


def test_rows_of_different_lengths_are_refused_on_every_rank(backend):
    """MPI would otherwise truncate or pad the rows it exchanges: ranks 0 and 2 stepped with
    garbage in their last element."""
    result = SHORT_ROW.run(backend)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: every rank's params row must have the same length and dtype; got "
            "rank 0: 37 float64, rank 1: 36 float64, rank 2: 37 float64"
        ) in result.stdout, result.stdout + result.stderr


def test_a_bad_row_on_one_rank_stops_every_rank_as_the_workers_are_created(backend):
    result = MATRIX_ROW.run(backend)
    assert result.returncode != 0
    reason = "ValueError: params must be this rank's [D] row, got shape (1, 37)"
    assert f"rank 0: {reason}" in result.stdout, result.stdout + result.stderr
    for rank in (1, 2):
        assert f"rank {rank}: RankError: creating the workers failed on rank(s) [0] (rank 0: {reason})" in result.stdout


def test_a_checkpoint_missing_on_one_rank_stops_every_rank(backend):
    result = LOST.run(backend)
    assert result.returncode != 0
    assert "rank 1: FileNotFoundError" in result.stdout, result.stdout + result.stderr
    for rank in (0, 2):
        assert (
            f"rank {rank}: RankError: loading the checkpoint failed on rank(s) [1] (rank 1: FileNotFoundError"
            in result.stdout
        ), result.stdout + result.stderr


def test_a_save_that_fails_on_one_rank_leaves_every_ranks_previous_checkpoint(backend):
    """Rank 1 cannot write its file: the other ranks used to replace theirs anyway, leaving a
    set of files from two different steps. Now every rank keeps the previous save, resumes
    from it, and the run ends as the simulation does."""
    result = FAILED_SAVE.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1: save failed: IsADirectoryError" in result.stdout, result.stdout
    for rank in range(3):
        assert f"rank {rank}: resumed at t=2" in result.stdout, result.stdout
    assert gathered(result.out, 3, "params").tobytes() == simulate(3, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_files_of_different_saves_are_refused_on_every_rank(backend):
    """One rank's file from an earlier save (restored by hand, or a copy gone wrong): the ranks
    would have mixed with different W_t, or waited forever on mismatched exchanges."""
    result = STALE.run(backend)
    assert result.returncode != 0
    for rank in range(3):
        assert f"rank {rank}: ValueError: the checkpoint files" in result.stdout, result.stdout + result.stderr
    assert "(rank 0: t=3, rank 1: t=3, rank 2: t=2)" in result.stdout, result.stdout


def test_one_rank_is_plain_decentralized_adamw(backend):
    result = ONE_RANK.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    assert gathered(result.out, 1, "params").tobytes() == simulate(1, "one_peer_exponential", "awc").params.tobytes()


def test_checkpoint_per_rank_resumes_bit_for_bit(backend):
    result = RESUME.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(result.out.glob("checkpoint.rank*.npz"))) == 4
    assert gathered(result.out, 4, "params").tobytes() == simulate(4, "one_peer_exponential", "atc").params.tobytes()


def test_ranks_that_disagree_on_a_setting_are_refused_on_every_rank(backend):
    """Rank 2 was given another learning rate: every rank says so as the workers are made,
    instead of training a different problem than the others without a word."""
    result = ODD_LR.run(backend)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: every rank must run with the same settings; they differ in lr: "
            "rank 0 0.05, rank 1 0.05, rank 2 0.07"
        ) in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("topology, compression, outer", list(MOVES))
def test_a_run_moves_between_one_process_and_ranks_through_its_checkpoint(backend, topology, compression, outer):
    """Two steps in one process, split into rank files, two more under torchrun; and the
    reverse: two steps under torchrun, the rank files joined, two more in one process. Both
    end where four steps in one process do (bit for bit for one peer and for compressed
    gossip; complete: the ranks' sum adds in another order)."""
    from steadystep import ranks
    from tests.rank_worker import gradient

    order, width = "atc", 37
    resumed, saved = MOVES[topology, compression, outer]
    result = resumed.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    straight = simulate(4, topology, order, steps=4, compression=compression, outer=outer)
    check = (
        (lambda a, b: a.tobytes() == b.tobytes())
        if topology != "complete"
        else (lambda a, b: np.allclose(a, b, rtol=1e-12, atol=1e-15))
    )
    assert check(gathered(result.out, 4, "params"), straight.params)

    result = saved.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    joined = ranks.join_checkpoint(result.out / "run")
    assert (joined.workers, joined.t, joined.order, joined.topology.name) == (4, 2, order, topology)
    for t in (2, 3):
        joined.step(np.stack([gradient(rank, t, width, None) for rank in range(4)]))
    for name in straight.buffers:  # params, moments, and public copies or outer state
        assert check(getattr(joined, name) if name == "params" else joined.buffers[name], straight.buffers[name]), name


@pytest.mark.parametrize("topology, order, compression", list(GOSSIP))
def test_compressed_gossip_over_ranks_is_the_in_process_step_bit_for_bit(backend, topology, order, compression):
    """Each rank sends its payload (codes and scales, values and offsets) to every rank keeping
    a copy of its public row, and ends where worker ``rank`` of the in-process step does, bit
    for bit: parameters, moments, public copy, and the bytes its communicator sent."""
    result = GOSSIP[topology, order, compression].run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, topology, order, width=300, compression=compression)
    for name in ("params", "exp_avg", "exp_avg_sq", "public"):
        assert gathered(result.out, 4, name).tobytes() == getattr(expected, name).tobytes(), name
    sent = gathered(result.out, 4, "bytes_sent").ravel()
    np.testing.assert_array_equal(sent, expected.bytes_sent)
    assert sent.min() > 0


def test_compressed_gossip_over_ranks_resumes_bit_for_bit(backend):
    result = GOSSIP_RESUMED.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, "one_peer_exponential", "atc", compression="int8")
    for name in ("params", "exp_avg", "exp_avg_sq", "public"):
        assert gathered(result.out, 3, name).tobytes() == getattr(expected, name).tobytes(), name


@pytest.mark.parametrize("topology, compression", list(OUTER))
def test_outer_steps_over_ranks_are_the_in_process_step(backend, topology, compression):
    """DiLoCo over ranks: the pseudo-gradients (compressed or not) go to the ranks that mix
    them; each rank ends where worker ``rank`` of the in-process step does, bit for bit (complete
    averaging without compression: a sum over the ranks, within its rounding), and its
    communicator sent what the in-process step counts."""
    result = OUTER[topology, compression].run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(4, topology, "awc", width=300, compression=compression or None, outer=True)
    for name in ("params", "exp_avg", "exp_avg_sq", "outer"):
        ours, theirs = gathered(result.out, 4, name).reshape(4, -1), dispatch_rows(expected, name)
        if topology == "complete" and not compression:
            np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)
        else:
            assert ours.tobytes() == theirs.tobytes(), name
    np.testing.assert_array_equal(gathered(result.out, 4, "bytes_sent").ravel(), expected.bytes_sent)


def test_outer_steps_over_ranks_resume_bit_for_bit(backend):
    result = OUTER_RESUMED.run(backend)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, "ring", "awc", compression="int4", outer=True)
    for name in ("params", "exp_avg", "exp_avg_sq", "outer"):
        assert gathered(result.out, 3, name).reshape(3, -1).tobytes() == dispatch_rows(expected, name).tobytes()


def dispatch_rows(optimizer, name: str) -> np.ndarray:
    return np.asarray(optimizer.params if name == "params" else optimizer.buffers[name])


def test_compressed_gossip_needs_a_topology_whose_readers_are_known(backend):
    result = GOSSIP_NO_PERIOD.run(backend)
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: ValueError: compressed gossip over the topology 'sparse' needs its period" in result.stdout
        )


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory):
    """The in-process demo's report for N workers, run once a module: both backends compare
    with it (and its kernels are the ones the ranks then load from the cache)."""
    from steadystep import demo

    reports = {}

    def report(workers: int) -> Path:
        if workers not in reports:
            directory = tmp_path_factory.mktemp(f"local-demo-{workers}")
            assert demo.main([*DEMO, "--workers", str(workers), "--output-dir", str(directory)]) == 0
            reports[workers] = directory
        return reports[workers]

    return report


@pytest.mark.parametrize("ranks", [4])  # 3 ranks (N not a power of two): the cases above
def test_the_demo_with_one_worker_per_rank_matches_the_local_demo(backend, ranks, local_demo, tmp_path):
    """`mpiexec -n N python -m steadystep demo --backend mpi` and `torchrun --nproc-per-node N -m
    steadystep demo --backend torch`: rank 0 writes the report, and its numbers are the
    in-process run's (bit for bit where the operations are the same)."""
    local = local_demo(ranks)  # first: the kernels it compiles are the ones the ranks load
    environment = rank_environment()
    command = [*launcher(backend, ranks), "-m", "steadystep", "demo", "--backend", backend, *DEMO]
    command += ["--output-dir", str(tmp_path / "ranks")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("wrote") == 1  # only rank 0 reports
    if backend == "mpi":  # one stream under mpiexec: hydra forwards stdout and stderr apart, and
        # spliced the table into the progress line
        assert "steadystep demo:" not in result.stderr
        assert result.stdout.index("steadystep demo:") < result.stdout.index("\nmean model x̄ after training")
    assert_same_report(tmp_path / "ranks", local, backend, ranks)


def test_ranks_sharing_a_machine_share_its_cores():
    """share_cores: each of N processes on a machine runs its parallel kernels on cores/N
    threads (at least one) from its next parallel launch on, and never on more than before."""
    from steadystep import numerical_stability
    from steadystep.cpu import backend, threads

    before, cores = numba.get_num_threads(), len(os.sched_getaffinity(0))
    large = np.zeros(backend.PARALLEL_MIN)
    try:
        assert threads.share_cores(cores + 1) == 1  # more ranks than cores
        numerical_stability.softplus(large)
        assert numba.get_num_threads() == 1
        assert threads.share_cores(1) == cores  # alone on the machine
        numerical_stability.softplus(large)
        assert numba.get_num_threads() == 1  # lowered only: the count set before stands
    finally:
        numba.set_num_threads(before)
