"""Run by tests/test_mpi.py under mpiexec and by tests/test_distributed.py with torchrun's environment: a few
steps of one worker per rank (MPIAdamW or DistributedAdamW) with deterministic gradients; and
the in-process simulation the tests compare them with."""

import argparse
import atexit
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import numpy as np

from steadystep import compress, decentral
from steadystep.ranks import RankError

# compressed gossip's cases: one of each kind (int4 to nearest; the sparsifiers keep a quarter)
COMPRESSORS = {
    "int8": compress.int8(),
    "int4": compress.int4(rounding="nearest"),
    "top_k": compress.top_k(0.25),
    "random_k": compress.random_k(0.25),
}


def gradient(rank: int, t: int, width: int, poison: tuple[int, int] | None) -> np.ndarray:
    grad = np.random.default_rng(1000 * t + rank).normal(size=width)
    if poison == (rank, t):
        grad[1] = np.nan
    return grad


def sparse_matrix(size: int):
    """A user topology that changes with t and is mostly zeros (neighbour exchanges only)."""

    def weights(t: int) -> np.ndarray:
        matrix = np.zeros((size, size))
        rows = np.arange(size)
        if t % 2 == 0:
            for offset, weight in ((0, 0.5), (1, 0.25), (-1, 0.25)):
                np.add.at(matrix, (rows, (rows + offset) % size), weight)
        else:
            np.add.at(matrix, (rows, rows), 0.6)
            np.add.at(matrix, (rows, (rows + 2) % size), 0.4)
        return matrix

    return weights


def topology_named(name: str, size: int) -> decentral.Topology:
    if name == "matrix":
        return decentral.from_matrix(np.full((size, size), 1 / size), "matrix")
    if name == "sparse":
        return decentral.from_matrix(sparse_matrix(size), "sparse")
    if name == "base_2_graph":
        return decentral.base_graph(1)
    return decentral.TOPOLOGIES[name]()


OUTER = decentral.DiLoCo(every=2, lr=0.7, momentum=0.9)  # two rounds in the cases' four steps


def gossip(compression: str | None, outer: bool = False) -> dict:
    """The options of compressed gossip named ``compression`` (none for None), or with
    ``outer`` of DiLoCo's outer steps (compressing the pseudo-gradients if named)."""
    options = {} if compression is None else dict(compression=COMPRESSORS[compression], seed=7)
    if outer:
        return {**options, "outer": OUTER}
    return {**options, "consensus": 0.8} if options else {}


def simulate(
    ranks: int,
    topology_name: str,
    order: str,
    steps: int = 4,
    width: int = 37,
    compression: str | None = None,
    outer: bool = False,
):
    """The in-process [N, D] run the ranks must match."""
    topology = topology_named(topology_name, ranks)
    start = np.stack([np.random.default_rng(rank).normal(size=width) for rank in range(ranks)])
    workers = decentral.DecentralizedAdamW(
        start, topology=topology, order=order, lr=0.05, weight_decay=0.01, max_norm=1.0, **gossip(compression, outer)
    )
    for t in range(steps):
        workers.step(np.stack([gradient(rank, t, width, None) for rank in range(ranks)]))
    return workers


def gathered(out: Path, ranks: int, name: str) -> np.ndarray:
    """Every rank's saved ``name``, stacked as the simulation's [N, D]."""
    return np.stack([np.load(out / f"rank{rank}.npz")[name] for rank in range(ranks)])


# A small demo run, the same for every backend and the in-process one it is compared with: each
# topology (complete averaging sums in another order; the others are bit for bit) with AWC (the
# rank cases above check ATC and every topology against the simulation), one eigenvalue
DEMO = [
    "--order",
    "awc",
    "--eigenvalues",
    "1",
    "--steps",
    "6",
    "--eval-every",
    "3",
    "--batch-size",
    "8",
    "--hidden",
    "4",
    "--noise-samples",
    "3",
    "--probes",
    "3",
    "--samples",
    "200",
    "--no-progress",
    "--device",
    "cpu",
    "--dtype",
    "float64",
]


def assert_same_report(ranks_directory: Path, local_directory: Path, backend: str, ranks: int) -> None:
    """The report one worker per rank wrote has the in-process run's numbers: bit for bit where
    the operations are the same, within rounding for complete averaging (summed in another order)."""
    import json

    ours = json.loads((ranks_directory / "report.json").read_text())
    local = json.loads((local_directory / "report.json").read_text())
    assert ours["settings"]["backend"] == backend and ours["settings"]["workers"] == ranks
    for run, reference in zip(ours["runs"], local["runs"], strict=True):
        assert (run["topology"], run["order"]) == (reference["topology"], reference["order"])
        for name in ("train_loss", "consensus_distance", "test_accuracy", "mean_model_train_loss"):
            if run["topology"] == "complete":
                np.testing.assert_allclose(run["curves"][name], reference["curves"][name], rtol=1e-12, atol=1e-15)
            else:
                assert run["curves"][name] == reference["curves"][name], (run["topology"], run["order"], name)


ROOT = Path(__file__).resolve().parent.parent
# The mpich wheel puts mpiexec beside the interpreter, which need not be on PATH.
MPIEXEC = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _mpi_missing() -> str:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'steadystep[mpi]')"
    return "" if MPIEXEC else "mpiexec is not installed (pip install 'steadystep[mpi]')"


def _torch_missing() -> str:
    return "" if importlib.util.find_spec("torch") is not None else "torch is not installed"


BACKENDS = {"mpi": _mpi_missing, "torch": _torch_missing}  # each says what is missing to run it, or ""


def launcher(backend: str, ranks: int, simulator: bool = False) -> list[str]:
    """The command that starts ``ranks`` processes of what follows it (a script, or ``-m module``),
    each forked from a server of this process's that imported what the ranks import
    (tests/spawn_ranks.py says why and how), one for the CPU target and one for the simulator."""
    path, server = _launch_server(simulator)
    if backend == "mpi":  # mpiexec starts light clients, each of which the server makes a rank
        assert MPIEXEC is not None
        return [MPIEXEC, "-n", str(ranks), sys.executable, str(SPAWN_RANKS), "--join", path, str(server)]
    # torchrun's environment on a free port of its own (parallel tests do not meet), from a light
    # launcher instead of torchrun itself
    return [sys.executable, str(SPAWN_RANKS), "--via", path, str(server), str(ranks)]


SPAWN_RANKS = Path(__file__).with_name("spawn_ranks.py")


@functools.cache
def _launch_server(simulator: bool) -> tuple[str, int]:
    """The socket and pid of this process's launch server (tests/spawn_ranks.py) for the CPU
    target or the simulator, started on the first launch in the ranks' environment, and stopped
    when this process ends."""
    directory = tempfile.mkdtemp(prefix="steadystep-launches-")
    path = os.path.join(directory, "socket")
    with open(os.path.join(directory, "server.log"), "w") as log:
        server = subprocess.Popen(
            [sys.executable, str(SPAWN_RANKS), "--serve", path],
            env=rank_environment(simulator),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    atexit.register(server.kill)  # registered last: runs first
    return path, server.pid


def rank_environment(simulator: bool = False) -> dict[str, str]:
    """The environment of a launch's ranks: this checkout importable, and one thread each for
    OpenMP (and OpenBLAS), as torchrun's default gives them; on the CUDA simulator if asked."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if simulator:
        environment["NUMBA_ENABLE_CUDASIM"] = "1"
    return environment


def launch(
    backend: str,
    ranks: int,
    out: Path,
    *options: str,
    simulator: bool = False,
    timeout: float = 300,
    script: Path = Path(__file__),
) -> subprocess.CompletedProcess:
    """``script`` (this one by default) on ``ranks`` processes of ``backend``, writing into ``out``."""
    environment = rank_environment(simulator)
    command = [*launcher(backend, ranks, simulator), str(script), "--backend", backend, "--out", str(out), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)


def backend(name: str):
    """(worker class, rank, size, local rank) of the backend ``name``."""
    if name == "torch":
        import torch.distributed as dist

        import steadystep.torch.distributed

        if not dist.is_initialized():  # once a process: it may run many cases (tests/launches.py)
            dist.init_process_group("gloo")
        module = steadystep.torch.distributed
        return module.DistributedAdamW, dist.get_rank(), dist.get_world_size(), module.local_rank()
    from mpi4py import MPI

    import steadystep.mpi

    comm = MPI.COMM_WORLD
    return steadystep.mpi.MPIAdamW, comm.Get_rank(), comm.Get_size(), steadystep.mpi.local_rank()


def barrier() -> None:
    """Every rank of this launch meets here (between two cases of a launch)."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            return
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["mpi", "torch"], default="mpi")
    parser.add_argument("--topology", required=True)
    parser.add_argument("--order", default="awc")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=37)
    parser.add_argument("--out", required=True)
    parser.add_argument("--poison", type=int, nargs=2)
    parser.add_argument("--short-gradient", type=int, nargs=2, metavar=("RANK", "T"))
    parser.add_argument("--lose-checkpoint", type=int, metavar="RANK")
    parser.add_argument("--short-row", type=int, metavar="RANK")
    parser.add_argument("--matrix-row", type=int, metavar="RANK")
    parser.add_argument("--resume-at", type=int)
    parser.add_argument("--failed-save", type=int, metavar="RANK")  # saves at --resume-at, steps, then fails to save
    parser.add_argument("--stale-checkpoint", type=int, metavar="RANK")  # that rank keeps the --resume-at save's file
    parser.add_argument("--device-rows", action="store_true")
    parser.add_argument("--torch-rows", action="store_true")
    parser.add_argument("--odd-lr", type=int, metavar="RANK")  # that rank alone trains with another lr
    parser.add_argument("--resume-from", metavar="PREFIX")  # rank files (an in-process run's, split)
    parser.add_argument("--save-at-end", metavar="PREFIX")
    parser.add_argument("--compression", choices=sorted(COMPRESSORS))
    parser.add_argument("--outer", action="store_true")
    arguments = parser.parse_args(argv)
    Worker, rank, size, local_rank = backend(arguments.backend)
    topology = topology_named(arguments.topology, size)
    start = np.random.default_rng(rank).normal(size=arguments.width)
    lr = 0.07 if arguments.odd_lr == rank else 0.05
    options = dict(
        topology=topology,
        order=arguments.order,
        lr=lr,
        weight_decay=0.01,
        max_norm=1.0,
        **gossip(arguments.compression, arguments.outer),
    )
    if arguments.device_rows:  # the CUDA-aware path: rows handed to MPI as GPU memory
        import steadystep.mpi
        from tests.helpers import to_device

        steadystep.mpi.cuda_aware = lambda: True  # the simulator's "GPU" memory is host memory MPI can read
        start = to_device(start)
    convert = lambda row: row  # noqa: E731
    if arguments.torch_rows:  # torch CPU tensors: stepped in place, resumed as torch
        import torch

        convert = torch.from_numpy
        start = convert(start)
    if arguments.short_row == rank:
        start = start[:-1]
    if arguments.matrix_row == rank:
        start = start.reshape(1, -1)
    poison = tuple(arguments.poison) if arguments.poison else None
    try:
        worker = Worker(start, **options)
        assert worker.extra == {}, "a run started afresh read no checkpoint"
        if arguments.resume_from:
            worker = Worker.load(arguments.resume_from, topology=topology)
        for t in range(worker.t, worker.t + arguments.steps):
            if arguments.resume_at is not None and t == arguments.resume_at:
                worker.save(f"{arguments.out}/checkpoint")
                own = Path(f"{arguments.out}/checkpoint.rank{rank}.npz")
                if arguments.failed_save is not None or arguments.stale_checkpoint is not None:
                    kept = own.read_bytes()
                    worker.step(gradient(rank, t, arguments.width, poison))  # the next save is of another step
                    if arguments.failed_save == rank:  # a directory where the rank writes its new file first
                        own.with_name(own.name + ".pending").mkdir()
                    try:
                        worker.save(f"{arguments.out}/checkpoint")
                    except (RankError, OSError) as error:
                        print(f"rank {rank}: save failed: {type(error).__name__}", flush=True)
                        assert own.read_bytes() == kept, "a failed save replaced this rank's checkpoint"
                    if arguments.stale_checkpoint == rank:
                        own.write_bytes(kept)
                if arguments.lose_checkpoint == rank:
                    Path(f"{arguments.out}/checkpoint.rank{rank}.npz").unlink()
                worker = Worker.load(
                    f"{arguments.out}/checkpoint",
                    topology=topology,
                    like=start if arguments.device_rows or arguments.torch_rows else None,
                )
                assert worker.extra["world_size"] == worker.size and worker.extra["topology"] == topology.name
                if arguments.device_rows:  # the resumed state is GPU memory (the simulator's has no CAI), not NumPy
                    assert hasattr(worker.params, "copy_to_host") or hasattr(worker.params, "__cuda_array_interface__")
                if arguments.failed_save is not None:
                    print(f"rank {rank}: resumed at t={worker.local.t}", flush=True)
            grad = gradient(rank, t, arguments.width, poison)
            if arguments.short_gradient is not None and tuple(arguments.short_gradient) == (rank, t):
                grad = grad[:-1]
            worker.step(convert(grad))
            if arguments.torch_rows:
                assert type(worker.params).__module__.startswith("torch")
    except (decentral.NonFiniteGradientError, RankError, ValueError, FileNotFoundError) as error:
        print(f"rank {rank}: {type(error).__name__}: {error}", flush=True)
        return 3
    if arguments.save_at_end:
        worker.save(arguments.save_at_end)
    from tests.helpers import to_host

    np.savez(
        f"{arguments.out}/rank{rank}.npz",
        params=to_host(worker.params),
        exp_avg=to_host(worker.local.exp_avg).reshape(-1),
        exp_avg_sq=to_host(worker.local.exp_avg_sq).reshape(-1),
        bytes_sent=np.array([worker.bytes_sent]),
        public=to_host(worker.copies.rows[0]) if worker.copies is not None else np.zeros(0),
        outer=to_host(worker.outer_copies.buffers["outer"]) if worker.outer_copies is not None else np.zeros(0),
        local_rank=local_rank,
        threads=np.array([_threads_of_a_parallel_launch()]),
    )
    return 0


def _threads_of_a_parallel_launch() -> int:
    """The threads this rank's parallel CPU kernels run on (its steps on short rows run none)."""
    from steadystep import numerical_stability
    from steadystep.cpu import backend

    numerical_stability.softplus(np.zeros(backend.PARALLEL_MIN))
    return numba.get_num_threads()


def _end() -> None:
    """Every rank leaves its process group before it exits: gloo's threads still running at the
    interpreter's exit abort the process ("terminate called without an active exception")."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    from tests.launches import serve

    try:
        code = serve(main, barrier, sys.argv[1:])
    finally:
        _end()
    sys.exit(code)
