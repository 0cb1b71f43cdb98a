"""Decentralized AdamW with one worker per MPI rank (``mpiexec -n N``), matching the in-process
[N, D] simulation of :mod:`steadystep.decentral`.

Import it explicitly (``import steadystep.mpi``); it needs mpi4py (``pip install
'steadystep[mpi]'`` brings mpi4py and MPICH from PyPI; on a cluster, build mpi4py against
the system MPI instead: ``MPICC=mpicc pip install --no-binary=mpi4py mpi4py``).

Each rank holds its own row x_i, m_i, v_i. Every rank computes the same W_t from (N, t)
with no communication; one-peer topologies then exchange a single row with Sendrecv (send
to the rank that reads from us, receive from our peer), complete averaging uses Allreduce,
and a user matrix exchanges rows point to point only where W_t has non-zeros. The local update is the same fused kernel
as one worker of the simulation, so one-peer steps equal the simulation bit for bit.

    workers = MPIAdamW(row, topology=decentral.one_peer_exponential(), lr=1e-3, max_norm=1.0)
    workers.step(grad_row)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

try:
    from mpi4py import MPI
except ImportError as error:  # not a dependency of steadystep itself
    raise ImportError(
        "steadystep.mpi needs mpi4py: pip install 'steadystep[mpi]' (mpi4py with MPICH from PyPI), or "
        "build mpi4py against your cluster's MPI"
    ) from error

from steadystep import _arrays, checks, decentral, dispatch


class MPIAdamW:
    """This rank's worker of a decentralized AdamW run over ``comm`` (default COMM_WORLD).

    ``params`` is this rank's [D] row (NumPy, torch, CuPy or Numba device array). GPU rows are
    handed to MPI through ``__cuda_array_interface__``, which needs a CUDA-aware MPI; with
    ``host_staging=True`` they are copied through host memory instead.
    """

    def __init__(
        self,
        params: Any,
        *,
        topology: decentral.Topology,
        order: str = "awc",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_norm: Optional[float] = None,
        decay_mask: Any = None,
        consensus: float = 1.0,
        comm: Any = None,
        host_staging: bool = False,
        target: Optional[str] = None,
    ):
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.topology, self.consensus, self.host_staging, self.order = topology, consensus, host_staging, order

        def set_up() -> decentral.DecentralizedAdamW:
            decentral.check_mixing(topology, order, consensus)  # the local worker mixes nothing: checked here
            decentral.check_topology(topology, self.size)
            operand = _arrays.classify("params", params)
            if len(operand.shape) != 1:
                raise ValueError(f"params must be this rank's [D] row, got shape {operand.shape}")
            _arrays.check_writable(operand)  # a list, say, would train a copy (before _as_row reshapes it)
            if operand.kind == "device" and not host_staging and not cuda_aware():
                raise RuntimeError(
                    "GPU rows need a CUDA-aware MPI; this one is not: pass host_staging=True to copy through the host"
                )
            return decentral.DecentralizedAdamW(
                _as_row(params),
                topology=decentral.one_peer_exponential(),
                order="awc",
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                max_norm=max_norm,
                decay_mask=decay_mask,
                consensus=1.0,
                target=target,
            )

        self.local = _agree(self.comm, "creating the workers", set_up)
        rows = self.comm.allgather((self.local.width, str(self.local.dtype)))
        if len(set(rows)) > 1:  # MPI would truncate or pad the exchanged rows, or wait forever in Allreduce
            described = ", ".join(f"rank {rank}: {width} {dtype}" for rank, (width, dtype) in enumerate(rows))
            raise ValueError(f"every rank's params row must have the same length and dtype; got {described}")

    def __repr__(self) -> str:
        local = self.local
        options = ", ".join(
            f"{name}={getattr(local, name)!r}" for name in ("lr", "betas", "eps", "weight_decay", "max_norm")
        )
        return (
            f"MPIAdamW(rank {self.rank} of {self.size}, {local.width:,} {local.dtype} on {local.where}, "
            f"topology={self.topology.name}, t={self.t}, order={self.order!r}, {options}, consensus={self.consensus!r})"
        )

    @property
    def t(self) -> int:
        return self.local.t

    @property
    def params(self) -> Any:
        """This rank's current row."""
        return self.local.params.reshape(-1)

    def step(self, grad: Any, lr: Optional[float] = None) -> None:
        """One step; raises NonFiniteGradientError on every rank (naming the ranks) if any rank's
        gradient is not finite, with nothing written anywhere. Bad input on one rank (a
        gradient of the wrong shape, a negative lr) raises there and a :class:`RankError` on
        the others, again before anything is written: no rank is left waiting for a peer."""

        def check() -> tuple:
            if lr is not None:
                checks.non_negative(lr=lr)  # before AWC mixes anything into the parameters
            operand = _arrays.classify("grad", grad)
            if operand.shape != (self.local.width,):
                raise ValueError(f"grad must be this rank's row, of shape ({self.local.width},); got {operand.shape}")
            # One reduction where the row lives (no host copy of a GPU gradient), and its
            # norms serve the local step too.
            return self.local._checked(_as_row(grad if operand.kind == "device" else operand.value))  # a list too

        checked = _agree(self.comm, f"step {self.t}", check)
        t = self.t
        if self.order == "awc":
            self._mix_into_params(t)
            self.local._step_checked(*checked, lr)
        else:
            self.local._step_checked(*checked, lr)
            self._mix_into_params(t)

    def _mix_into_params(self, t: int) -> None:
        """x_i ← Σ_j W_ij x_j with step t's W (with consensus strength γ), through MPI."""
        row = self.local.params.reshape(-1)
        dtype = self.local.dtype
        gamma = self.consensus
        if self.topology.kind == "peer" and self.size > 1:
            peers = np.asarray(self.topology.peers(self.size, t))
            source, destination = int(peers[self.rank]), int(np.flatnonzero(peers == self.rank)[0])
            received = self._exchange(row, destination, source)
            mixed = dtype.type(1 - gamma / 2) * _host(row) + dtype.type(gamma / 2) * received
        elif self.topology.kind == "complete" and self.size > 1:
            total = np.empty_like(_host(row))
            self.comm.Allreduce(_host(row), total, op=MPI.SUM)
            mean = total * dtype.type(1 / self.size)
            mixed = dtype.type(gamma) * mean + dtype.type(1 - gamma) * _host(row)
        elif self.topology.kind == "dense":
            weights = gamma * self.topology.matrix(self.size, t) + (1 - gamma) * np.eye(self.size)
            rows = self._neighbour_exchange(row, weights, t)
            mixed = np.zeros(row.shape[0], dtype)
            for j in map(int, np.flatnonzero(weights[self.rank])):
                mixed += dtype.type(weights[self.rank, j]) * (rows[j] if j != self.rank else _host(row))
        else:
            return
        _write(row, mixed)

    def _outgoing(self, row: Any) -> Any:
        """What MPI sends: host rows as they are; GPU rows through __cuda_array_interface__ once
        the kernels that produced them have finished, or a host copy with ``host_staging``."""
        if self.host_staging or _arrays.classify("row", row).kind == "host":
            return np.ascontiguousarray(_host(row))
        from steadystep.cuda.runtime import require_cuda

        require_cuda().synchronize()
        return row

    def _exchange(self, row: Any, destination: int, source: int) -> np.ndarray:
        incoming = np.empty(row.shape[0], self.local.dtype)
        self.comm.Sendrecv(self._outgoing(row), dest=destination, recvbuf=incoming, source=source)
        return incoming

    def _neighbour_exchange(self, row: Any, weights: np.ndarray, t: int) -> dict[int, np.ndarray]:
        """Rows of the ranks we read from (non-zeros of our row of W_t), our row to the ranks
        that read from us (non-zeros of our column): point to point, only where W_t is non-zero."""
        sources = [int(j) for j in np.flatnonzero(weights[self.rank]) if j != self.rank]
        destinations = [int(k) for k in np.flatnonzero(weights[:, self.rank]) if k != self.rank]
        received = {j: np.empty(row.shape[0], self.local.dtype) for j in sources}
        outgoing = self._outgoing(row) if destinations else None
        requests = [self.comm.Irecv(received[j], source=j, tag=t % 32768) for j in sources]
        requests += [self.comm.Isend(outgoing, dest=k, tag=t % 32768) for k in destinations]
        MPI.Request.Waitall(requests)
        return received

    def save(self, prefix: Union[str, Path], extra: Optional[dict] = None) -> Path:
        """Each rank writes its own row and state to ``<prefix>.rank<r>.npz``: first beside it,
        then, once every rank has written, in its place. A save that fails on one rank (a full
        disk) leaves every rank's previous checkpoint as it was, so the set never mixes steps."""
        path = Path(f"{prefix}.rank{self.rank}.npz")
        extra = {
            "world_size": self.size,
            "topology": self.topology.name,
            "order": self.order,
            "consensus": self.consensus,
            **(extra or {}),
        }
        with decentral.written_beside(path, ".pending") as pending:  # in place only once every rank has written
            _agree(self.comm, "saving the checkpoint", lambda: self.local.save(pending, extra=extra))
        return path

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
        state goes (NumPy by default), as for :meth:`DecentralizedAdamW.load`."""
        comm = comm if comm is not None else MPI.COMM_WORLD

        def read() -> decentral.DecentralizedAdamW:
            local = decentral.DecentralizedAdamW.load(f"{prefix}.rank{comm.Get_rank()}.npz", like=like, target=target)
            meta = local.extra
            if meta.get("world_size") != comm.Get_size() or meta.get("topology") != topology.name:
                raise ValueError(
                    f"checkpoint is from {meta.get('world_size')} ranks with topology "
                    f"{meta.get('topology')!r}; this run has {comm.Get_size()} ranks and {topology.name!r}"
                )
            return local

        local = _agree(comm, "loading the checkpoint", read)
        steps = comm.allgather(local.t)
        if len(set(steps)) > 1:  # files of different saves: the ranks would mix with different W_t, or wait forever
            found = ", ".join(f"rank {rank}: t={t}" for rank, t in enumerate(steps))
            raise ValueError(
                f"the checkpoint files {prefix}.rank*.npz are from different saves ({found}); restore one "
                "save's files on every rank"
            )
        worker = cls(
            local.params.reshape(-1),
            topology=topology,
            order=local.extra["order"],
            consensus=local.extra["consensus"],
            comm=comm,
            host_staging=host_staging,
            target=target,
        )
        worker.local = local
        return worker

    @property
    def extra(self) -> dict:
        """The ``extra`` of the checkpoint :meth:`load` read (with the run's world size,
        topology, order and consensus); {} for a run started afresh."""
        return self.local.extra


class RankError(RuntimeError):
    """Another rank's part of a collective call failed, so this rank did nothing either."""

    def __init__(self, action: str, failures: dict[int, str]):
        self.action, self.failures = action, failures
        reasons = "; ".join(f"rank {rank}: {reason}" for rank, reason in failures.items())
        super().__init__(f"{action} failed on rank(s) {sorted(failures)} ({reasons}); no rank changed anything")


def _agree(comm: Any, action: str, work: Callable[[], Any]) -> Any:
    """``work()`` on this rank, then every rank learns how every rank's went. A rank that raised
    alone would leave the others waiting forever in their next collective call (mpiexec does
    not end a job whose processes still run); instead the failing rank raises its own error
    and the others a RankError naming it. A non-finite gradient on some ranks becomes one
    NonFiniteGradientError naming those ranks, raised on every rank."""
    try:
        result, failure = work(), None
    except Exception as error:  # shared with the other ranks, then raised as it was
        result, failure = None, error
    outcome: Union[None, tuple[str, int], str]
    if failure is None:
        outcome = None
    elif isinstance(failure, decentral.NonFiniteGradientError):
        outcome = ("non-finite", failure.step)
    else:
        outcome = f"{type(failure).__name__}: {failure}"
    outcomes = comm.allgather(outcome)
    failures = {rank: reason for rank, reason in enumerate(outcomes) if isinstance(reason, str)}
    if failure is not None and not isinstance(failure, decentral.NonFiniteGradientError):
        raise failure
    if failures:
        raise RankError(action, failures)
    non_finite = [rank for rank, reason in enumerate(outcomes) if reason is not None]
    if non_finite:
        raise decentral.NonFiniteGradientError(non_finite, outcomes[non_finite[0]][1])
    return result


def _as_row(array: Any) -> Any:
    return array.reshape(1, -1)


def _host(array: Any) -> np.ndarray:
    return dispatch.host_array(array).reshape(-1)


def _write(row: Any, values: np.ndarray) -> None:

    dispatch.copy_into(row, values)


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
    comm = comm if comm is not None else MPI.COMM_WORLD
    machine = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return machine.Get_rank()
    finally:
        machine.Free()
