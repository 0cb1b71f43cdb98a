"""One worker per rank at 4 ranks on the CPU, D = 4M float32: a one-peer AWC step (clip +
exchange + mix + AdamW) over torch.distributed (gloo) and over MPI, each beside the bare
exchange of one row with the same backend (the bytes a one-peer step must move). Then
compressed gossip over the directed ring (ATC): dense rows, int8 and top-k 1 % payloads, the
bytes each rank's communicator sent per step and the time. Then the torch-module trainer: the
language-model job's transformer with one worker per rank (DistributedTrainer, gloo) against
the 4 workers of the in-process DecentralizedTrainer.

Run: python -m benchmarks.ranks_cpu [--quick]. It starts the ranks itself (torchrun, mpiexec);
rank 0 of each run reports median milliseconds per step and per bare exchange.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

RANKS = 4
ROOT = Path(__file__).resolve().parent.parent


COMPRESSIONS = ("dense", "int8", "top-k 1%")


def compressed(name: str) -> dict:
    """The worker options of a compressed-gossip run ``name`` (one of COMPRESSIONS)."""
    from steadystep import compress, decentral

    chosen = {"dense": None, "int8": compress.int8(), "top-k 1%": compress.top_k(0.01)}[name]
    return dict(topology=decentral.directed_ring(), order="atc", compression=chosen)


def worker(backend: str, width: int, repeats: int, gossip: str = "") -> None:
    """One rank's part: time the step and the bare exchange, rank 0 prints the medians (with
    ``gossip``, a compressed-gossip run's step and the bytes sent per step)."""
    from steadystep import decentral

    if backend == "torch":
        import torch
        import torch.distributed as dist

        from steadystep.torch.distributed import DistributedAdamW as Worker

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()

        def exchange(row: np.ndarray, destination: int, source: int) -> None:
            incoming = torch.empty(row.shape[0], dtype=torch.float32)
            operations = [
                dist.P2POp(dist.isend, torch.from_numpy(row), destination),
                dist.P2POp(dist.irecv, incoming, source),
            ]
            for request in dist.batch_isend_irecv(operations):
                request.wait()

        barrier = dist.barrier
    else:
        from mpi4py import MPI

        from steadystep.decentral.mpi import MPIAdamW as Worker

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()

        def exchange(row: np.ndarray, destination: int, source: int) -> None:
            comm.Sendrecv(row, dest=destination, recvbuf=np.empty_like(row), source=source)

        barrier = comm.Barrier
    rng = np.random.default_rng(rank)
    row = rng.standard_normal(width, dtype=np.float32)
    grad = rng.standard_normal(width, dtype=np.float32)
    topology = decentral.one_peer_exponential()
    if gossip:
        workers = Worker(row, lr=1e-3, max_norm=1.0, **compressed(gossip))
        before = workers.bytes_sent
        seconds = time_steps(lambda index: workers.step(grad), repeats, barrier)
        if rank == 0:
            print(json.dumps({"step": seconds, "bytes": (workers.bytes_sent - before) / (repeats + 2)}))
        if backend == "torch":
            dist.destroy_process_group()
        return
    workers = Worker(row, topology=topology, order="awc", lr=1e-3, max_norm=1.0)
    steps, exchanges = [], []
    for index in range(repeats + 2):
        barrier()
        start = time.perf_counter()
        workers.step(grad)
        steps.append(time.perf_counter() - start)
        peers = np.asarray(topology.peers(size, index))
        source, destination = int(peers[rank]), int(np.flatnonzero(peers == rank)[0])
        barrier()
        start = time.perf_counter()
        exchange(row, destination, source)
        exchanges.append(time.perf_counter() - start)
    if rank == 0:
        print(json.dumps({"step": statistics.median(steps[2:]), "exchange": statistics.median(exchanges[2:])}))
    if backend == "torch":
        dist.destroy_process_group()  # gloo's threads still running at exit would abort the process


LM = dict(context=64, width=96, layers=2, heads=4)  # the language-model job's transformer
BATCH = 8  # windows per worker and step, as the job's


def tokens(step: int, workers: int) -> Any:
    """[workers, B, C + 1] random bytes, the same for every run of ``step``."""
    import torch

    return torch.randint(0, 256, (workers, BATCH, LM["context"] + 1), generator=torch.Generator().manual_seed(step))


def trainer_options() -> dict:
    from steadystep import decentral

    return dict(topology=decentral.one_peer_exponential(), lr=1e-3, weight_decay=0.1, max_norm=1.0)


def time_steps(step: Callable[[int], None], repeats: int, barrier: Callable[[], Any] = lambda: None) -> float:
    """Median seconds of ``step(index)`` after two warm-up calls."""
    times = []
    for index in range(repeats + 2):
        barrier()
        start = time.perf_counter()
        step(index)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def trainer_worker(repeats: int) -> None:
    """One rank of the module trainer: rank 0 prints the median step time."""
    import torch
    import torch.distributed as dist

    from steadystep import lm
    from steadystep.torch.distributed import DistributedTrainer

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    trainer = DistributedTrainer(lm.ByteTransformer(**LM), **trainer_options())

    def step(index: int) -> None:
        batch = tokens(index, size)[rank]
        trainer.step(batch[:, :-1], batch[:, 1:])

    seconds = time_steps(step, repeats, dist.barrier)
    if rank == 0:
        print(json.dumps({"step": seconds, "parameters": int(trainer.params.numel())}))
    dist.destroy_process_group()


def in_process_trainer(repeats: int) -> float:
    import torch

    from steadystep import lm
    from steadystep.torch.decentral import DecentralizedTrainer

    torch.manual_seed(0)
    trainer = DecentralizedTrainer(lm.ByteTransformer(**LM), RANKS, **trainer_options())

    def step(index: int) -> None:
        batch = tokens(index, RANKS)
        trainer.step(batch[..., :-1], batch[..., 1:])

    return time_steps(step, repeats)


def launch(backend: str, width: int, repeats: int, gossip: str = "") -> dict | None:
    arguments = [str(Path(__file__).resolve()), "--worker", backend, str(width), str(repeats), gossip]
    if backend in ("torch", "trainer"):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS)]
        command += arguments
    else:
        mpiexec = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        if mpiexec is None:
            return None
        command = [mpiexec, "-n", str(RANKS), sys.executable, *arguments]
    # more ranks than cores: one thread each (a rank's parallel kernels would only contend)
    threads = "1" if RANKS >= (os.cpu_count() or 1) else str((os.cpu_count() or 1) // RANKS)
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads, "NUMBA_NUM_THREADS": threads}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> None:
    from benchmarks.common import machine, table

    width, repeats = (1 << 18, 5) if quick else (4 << 20, 10)
    print(f"one-peer AWC + clip, {RANKS} ranks, D = {width:,} float32 per rank, CPU: {machine()}")
    rows = []
    for backend, label in (("torch", "torch.distributed (gloo)"), ("mpi", "MPI (mpi4py)")):
        times = launch(backend, width, repeats)
        if times is None:
            rows.append([label, "not installed", "", ""])
            continue
        rows.append(
            [
                label,
                f"{times['step'] * 1e3:.1f}",
                f"{times['exchange'] * 1e3:.1f}",
                f"{times['step'] / times['exchange']:.2f}",
            ]
        )
    print(table(rows, ["backend", "step ms", "bare exchange ms", "step/exchange"]))
    print(f"(the exchange moves one row each way: {width * 4 / 1e6:.1f} MB)")

    print(f"\ncompressed gossip over the directed ring, ATC + clip, {RANKS} ranks, D = {width:,} float32 per rank:")
    rows = []
    for backend, label in (("torch", "gloo"), ("mpi", "MPI")):
        dense = None
        for gossip in COMPRESSIONS:
            times = launch(backend, width, repeats, gossip)
            if times is None:
                rows.append([label, gossip, "not installed", "", ""])
                continue
            dense = dense or times
            rows.append(
                [
                    label,
                    gossip,
                    f"{times['step'] * 1e3:.1f}",
                    f"{times['bytes'] / 1e6:.3f}",
                    f"{dense['bytes'] / times['bytes']:.2f}",
                ]
            )
    print(table(rows, ["backend", "payload", "step ms", "MB sent a step", "fewer bytes"]))

    steps = 3 if quick else 10
    ranked = launch("trainer", 0, steps)
    assert ranked is not None
    local = in_process_trainer(steps)
    print(
        f"\nthe language-model job's transformer ({ranked['parameters']:,} parameters packed), {RANKS} workers × "
        f"{BATCH} windows of {LM['context']} bytes, one-peer AWC + clip:"
    )
    rows = [
        [f"in-process DecentralizedTrainer (vmap over {RANKS}, one process)", f"{local * 1e3:.1f}", "1.00"],
        [f"DistributedTrainer, {RANKS} ranks (gloo)", f"{ranked['step'] * 1e3:.1f}", f"{ranked['step'] / local:.2f}"],
    ]
    print(table(rows, ["workers", "step ms", "× in-process"]))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        backend, width, repeats, gossip = sys.argv[sys.argv.index("--worker") + 1 :][:4]
        if backend == "trainer":
            trainer_worker(int(repeats))
        else:
            worker(backend, int(width), int(repeats), gossip)
    else:
        main(quick="--quick" in sys.argv)
