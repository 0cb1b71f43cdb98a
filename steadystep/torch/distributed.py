"""Decentralized AdamW with one worker per torch.distributed rank, launched by ``torchrun``:
gloo on CPUs, and on GPUs whatever process group the script made (NCCL).

    torchrun --nproc-per-node 4 train.py

    import torch.distributed as dist
    from steadystep import decentral
    from steadystep.torch.distributed import DistributedAdamW

    dist.init_process_group("gloo")
    workers = DistributedAdamW(row, topology=decentral.one_peer_exponential(), lr=1e-3, max_norm=1.0)
    workers.step(grad_row)
    dist.destroy_process_group()  # before the script ends: gloo's threads running at exit abort it

The run is :class:`steadystep.ranks.RankAdamW` over torch.distributed, the same as
:class:`steadystep.mpi.MPIAdamW` over MPI: a one-peer topology exchanges one row with
``batch_isend_irecv``, complete averaging sums the rows with ``all_reduce``, a user matrix
exchanges rows point to point only where W_t has non-zeros; one-peer steps equal the
in-process simulation bit for bit, complete averaging within the rounding of the sum. Rows
may be NumPy arrays or torch tensors. The rows travel as host tensors, so the process group
needs a CPU backend: gloo (``init_process_group("gloo")``, or ``"cpu:gloo,cuda:nccl"`` beside
NCCL for the model); GPU rows are copied through the host for the exchange.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from steadystep import _arrays, decentral, dispatch
from steadystep.ranks import RankAdamW, RankError

__all__ = ["DistributedAdamW", "RankError", "local_rank"]


class DistributedAdamW(RankAdamW):
    """This rank's worker of a decentralized AdamW run over the process ``group`` (default:
    the world, which ``torch.distributed.init_process_group`` must have made).

    ``params`` is this rank's [D] row (a NumPy array or a torch tensor), trained in place. The
    rest is :class:`steadystep.ranks.RankAdamW`'s: every rank checks that all agree on the
    rows, topology, order and hyper-parameters; a failure or a non-finite gradient on one
    rank stops every rank with nothing written.
    """

    def __init__(self, params: Any, *, group: Any = None, **options: Any):
        # options: RankAdamW's (topology, order, lr, betas, eps, weight_decay, max_norm,
        # decay_mask, consensus, target)
        super().__init__(params, comm=_Communicator(group), **options)

    @classmethod
    def load(
        cls,
        prefix: Union[str, Path],
        *,
        topology: decentral.Topology,
        group: Any = None,
        like: Any = None,
        target: Optional[str] = None,
    ) -> DistributedAdamW:
        """Resume this rank from ``<prefix>.rank<r>.npz`` (as :meth:`steadystep.mpi.MPIAdamW.load`,
        whose files these are too: a run may move between the two backends)."""
        local, options = cls._resume(prefix, _Communicator(group), topology, like, target)
        worker = cls(local.params.reshape(-1), group=group, target=target, **options)
        worker._adopt(local)
        return worker


class _Communicator:
    """steadystep.ranks' Communicator over a torch.distributed process group."""

    def __init__(self, group: Any):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group('gloo') "
                "(CPU) first, in a process torchrun started"
            )
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.ranks = [dist.get_global_rank(group, rank) for rank in range(self.size)] if group is not None else None

    def _global(self, rank: int) -> int:
        """A rank of the group as the point-to-point calls name it (the world's numbering)."""
        return rank if self.ranks is None else self.ranks[rank]

    def allgather(self, value: Any) -> list:
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def exchange(self, row: Any, destination: int, source: int) -> np.ndarray:
        return self.neighbours(row, [source], [destination], 0)[source]

    def sum(self, row: Any) -> np.ndarray:
        total = torch.from_numpy(np.array(dispatch.host_array(row).reshape(-1)))
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return total.numpy()

    def neighbours(self, row: Any, sources: list[int], destinations: list[int], tag: int) -> dict[int, np.ndarray]:
        outgoing = torch.from_numpy(np.ascontiguousarray(dispatch.host_array(row).reshape(-1)))
        dtype = _arrays.classify("row", row).dtype
        received = {j: torch.from_numpy(np.empty(row.shape[0], dtype)) for j in sources}
        operations = [dist.P2POp(dist.irecv, received[j], self._global(j), self.group, tag) for j in sources]
        operations += [dist.P2POp(dist.isend, outgoing, self._global(k), self.group, tag) for k in destinations]
        if operations:
            for request in dist.batch_isend_irecv(operations):
                request.wait()
        return {j: tensor.numpy() for j, tensor in received.items()}


def local_rank() -> int:
    """This rank's place among the ranks of its machine (torchrun's ``LOCAL_RANK``; 0 without
    it). With one rank per GPU, make that GPU current before any GPU work
    (``torch.cuda.set_device(local_rank())``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))
