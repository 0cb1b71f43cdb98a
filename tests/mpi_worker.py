"""Run by tests/test_mpi.py under mpiexec: a few steps of MPIAdamW with deterministic gradients."""

import argparse
import sys

import numpy as np
from mpi4py import MPI

from steadystep import decentral
from steadystep.mpi import MPIAdamW


def gradient(rank: int, t: int, width: int, poison: tuple[int, int] | None) -> np.ndarray:
    grad = np.random.default_rng(1000 * t + rank).normal(size=width)
    if poison == (rank, t):
        grad[1] = np.nan
    return grad


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", required=True)
    parser.add_argument("--order", default="awc")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=37)
    parser.add_argument("--out", required=True)
    parser.add_argument("--poison", type=int, nargs=2)
    parser.add_argument("--resume-at", type=int)
    arguments = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    topology = decentral.from_matrix(np.full((size, size), 1 / size), "matrix") if arguments.topology == "matrix" \
        else decentral.TOPOLOGIES[arguments.topology]()
    start = np.random.default_rng(rank).normal(size=arguments.width)
    options = dict(topology=topology, order=arguments.order, lr=0.05, weight_decay=0.01, max_norm=1.0)
    worker = MPIAdamW(start, **options)
    poison = tuple(arguments.poison) if arguments.poison else None
    try:
        for t in range(arguments.steps):
            if arguments.resume_at is not None and t == arguments.resume_at:
                worker.save(f"{arguments.out}/checkpoint")
                worker = MPIAdamW.load(f"{arguments.out}/checkpoint", topology=topology)
            worker.step(gradient(rank, t, arguments.width, poison))
    except decentral.NonFiniteGradientError as error:
        print(f"rank {rank}: {error}", flush=True)
        return 3
    np.savez(f"{arguments.out}/rank{rank}.npz", params=worker.params, exp_avg=worker.local.exp_avg.reshape(-1),
             exp_avg_sq=worker.local.exp_avg_sq.reshape(-1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
