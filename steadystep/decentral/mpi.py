"""Decentralized AdamW with one worker per MPI rank (``mpiexec -n N``), matching the in-process
[N, D] simulation of [`steadystep.decentral`][steadystep.decentral].

Import it explicitly (``import steadystep.mpi``); it needs mpi4py (``pip install
'steadystep[mpi]'`` brings mpi4py and MPICH from PyPI; on a cluster, build mpi4py against
the system MPI instead: ``MPICC=mpicc pip install --no-binary=mpi4py mpi4py``).

The run is [`RankAdamW`][steadystep.decentral.ranked.RankAdamW] over MPI: a one-peer topology exchanges one row
with Sendrecv, complete averaging uses Allreduce, and a user matrix exchanges rows point to
point only where W_t has non-zeros; one-peer steps equal the in-process simulation bit for bit.

    workers = MPIAdamW(row, topology=decentral.one_peer_exponential(), lr=1e-3, max_norm=1.0)
    workers.step(grad_row)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

try:
    from mpi4py import MPI
except ImportError as error:  # not a dependency of steadystep itself
    raise ImportError(
        "steadystep.mpi needs mpi4py: pip install 'steadystep[mpi]' (mpi4py with MPICH from PyPI), or "
        "build mpi4py against your cluster's MPI"
    ) from error

from steadystep import _arrays, decentral, dispatch
from steadystep.cpu.threads import share_cores
from steadystep.decentral.communication import ring_all_reduce
from steadystep.decentral.ranked import RankAdamW, RankError

__all__ = ["MPIAdamW", "RankError", "cuda_aware", "local_rank"]


class MPIAdamW(RankAdamW):
    """This rank's worker of a decentralized AdamW run over ``comm`` (default COMM_WORLD).

    ``params`` is this rank's [D] row (NumPy, torch, CuPy or Numba device array). GPU rows are
    handed to MPI through ``__cuda_array_interface__``, which needs a CUDA-aware MPI; with
    ``host_staging=True`` they are copied through host memory instead. The rest is
    [`RankAdamW`][steadystep.decentral.ranked.RankAdamW]'s.
    """

    def __init__(self, params: Any, *, comm: Any = None, host_staging: bool = False, **options: Any):
        # options: RankAdamW's (topology, order, lr, betas, eps, weight_decay, max_norm,
        # decay_mask, consensus, target)
        self.host_staging = host_staging
        world = comm if comm is not None else MPI.COMM_WORLD
        super().__init__(params, comm=_Communicator(world, host_staging), **options)

    def _check_row(self, operand: _arrays.Operand) -> None:
        if operand.kind == "device" and not self.host_staging and not cuda_aware():
            raise RuntimeError(
                "GPU rows need a CUDA-aware MPI; this one is not: pass host_staging=True to copy through the host"
            )

    @classmethod
    def load(
        cls,
        prefix: Union[str, Path],
        *,
        topology: decentral.Topology,
        comm: Any = None,
        like: Any = None,
        host_staging: bool = False,
        target: Optional[str] = None,
    ) -> MPIAdamW:
        """Resume this rank from ``<prefix>.rank<r>.npz``; the world size must match the saved run.
        The hyper-parameters are the saved ones; ``like`` (an array) or ``target`` says where the
        state goes (NumPy by default), as for
        [`DecentralizedAdamW.load()`][steadystep.decentral.DecentralizedAdamW.load]."""
        comm = comm if comm is not None else MPI.COMM_WORLD
        communicator = _Communicator(comm, host_staging)
        return cls._resumed(prefix, communicator, topology, like, target, comm=comm, host_staging=host_staging)


class _Communicator:
    """steadystep.decentral.ranked's Communicator over an mpi4py communicator."""

    def __init__(self, comm: Any, host_staging: bool):
        self.comm, self.host_staging = comm, host_staging
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.bytes_sent = 0.0
        share_cores(_on_this_machine(comm)[1])

    def allgather(self, value: Any) -> list:
        return self.comm.allgather(value)

    def local(self, row: Any) -> np.ndarray:
        return dispatch.host_array(row).reshape(-1)  # received rows land on the host: mixed there

    def exchange(self, row: Any, destination: int, source: int) -> np.ndarray:
        incoming = np.empty(row.shape[0], _arrays.classify("row", row).dtype)
        self.comm.Sendrecv(self._outgoing(row), dest=destination, recvbuf=incoming, source=source)
        self.bytes_sent += incoming.nbytes
        return incoming

    def sum(self, row: Any) -> np.ndarray:
        host = dispatch.host_array(row).reshape(-1)
        total = np.empty_like(host)
        self.comm.Allreduce(host, total, op=MPI.SUM)
        self.bytes_sent += ring_all_reduce(self.size) * host.nbytes
        return total

    def neighbours(self, row: Any, sources: list[int], destinations: list[int], tag: int) -> dict[int, np.ndarray]:
        dtype = np.dtype(_arrays.classify("row", row).dtype)
        received = {j: np.empty(row.shape[0], dtype) for j in sources}
        outgoing = self._outgoing(row) if destinations else None
        requests = [self.comm.Irecv(received[j], source=j, tag=tag) for j in sources]
        requests += [self.comm.Isend(outgoing, dest=k, tag=tag) for k in destinations]
        MPI.Request.Waitall(requests)
        self.bytes_sent += len(destinations) * row.shape[0] * dtype.itemsize
        return received

    def broadcast(self, row: np.ndarray, root: int) -> np.ndarray:
        value = np.array(row)
        self.comm.Bcast(value, root=root)
        return value

    def _outgoing(self, row: Any) -> Any:
        """What MPI sends: host rows as they are; GPU rows through __cuda_array_interface__ once
        the kernels that produced them have finished, or a host copy with ``host_staging``."""
        if self.host_staging or _arrays.classify("row", row).kind == "host":
            return np.ascontiguousarray(dispatch.host_array(row).reshape(-1))
        from steadystep.cuda.runtime import require_cuda

        require_cuda().synchronize()
        return row


def cuda_aware() -> bool:
    """Whether this MPI can take GPU buffers directly (through __cuda_array_interface__)."""
    query = getattr(MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query else False
    except Exception:
        return False


def local_rank(comm: Any = None) -> int:
    """This rank's place (0, 1, ...) among the ranks of ``comm`` (default COMM_WORLD) on its
    machine. With one rank per GPU, make ``local_rank() % GPUs`` current before any GPU work
    (``torch.cuda.set_device`` or ``numba.cuda.select_device``): otherwise every rank of a
    machine shares its first GPU."""
    return _on_this_machine(comm if comm is not None else MPI.COMM_WORLD)[0]


def _on_this_machine(comm: Any) -> tuple[int, int]:
    """(this rank's place among the ranks of ``comm`` on its machine, how many they are)."""
    machine = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return machine.Get_rank(), machine.Get_size()
    finally:
        machine.Free()
