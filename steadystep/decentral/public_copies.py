"""Compressed gossip with one worker per rank (CHOCO, SPEC §8): what a rank keeps and sends so
that its row equals worker ``rank`` of the in-process step bit for bit.

The in-process step keeps every public copy x̂_j once, in an [N, D] buffer. A rank keeps its
own x̂_i and a copy of x̂_j for every rank j it reads from at some step of the topology's period
(`decentral.readers`); each step it sends the payload of q_i = Q(x_i − x̂_i)
([`compress.encode`][steadystep.compress.encode]: codes and scales, or values and offsets) to
every rank that keeps a copy of x̂_i, and applies those it receives
([`compress.decode`][steadystep.compress.decode]), so every copy stays current even for the
steps its holder does not mix with it. The mixing x_i += Σ_j γW_ij (x̂_j − x̂_i) is the in-process
kernel itself, run over the rank's copies.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from steadystep import _arrays, compress, dispatch
from steadystep.compress import Compressor
from steadystep.decentral.communication import gossip_neighbours, readers
from steadystep.decentral.topology import Topology

__all__ = ["PublicCopies"]


class PublicCopies:
    """Rank ``rank``'s public copies for its worker ``local`` (a one-row DecentralizedAdamW): its
    own x̂ (row 0) and those of ``sources``, the ranks it reads from at some step (rows 1, 2, ...
    in rank order), on the device of its row. ``rows`` starts them from saved copies; None at
    zeros, for `start` to fill with the ranks' rows."""

    def __init__(
        self,
        compressor: Compressor,
        seed: int,
        topology: Topology,
        rank: int,
        size: int,
        local: Any,
        rows: Optional[np.ndarray] = None,
    ):
        self.compressor, self.seed, self.topology = compressor, seed, topology
        self.rank, self.size = rank, size
        readers_of = readers(topology, size)
        self.sources = [int(j) for j in np.flatnonzero(readers_of[rank])]  # whom this rank reads from
        self.destinations = [int(k) for k in np.flatnonzero(readers_of[:, rank])]  # who keep a copy of ours
        self.local = local
        params = self.params = local.params
        operand = _arrays.classify("params", params)
        self.width, self.dtype = operand.shape[1], np.dtype(operand.dtype)
        self.where = dispatch.choose_target([operand], None)
        shape = (1 + len(self.sources), self.width)
        if rows is not None and np.shape(rows) != shape:
            raise ValueError(
                f"the saved public copies have shape {np.shape(rows)}; rank {rank} of {size} over "
                f"{topology.name} keeps {shape} (its own and {len(self.sources)} peers')"
            )
        start = np.zeros(shape, self.dtype) if rows is None else np.asarray(rows, self.dtype)
        self.rows = dispatch.as_like(start, params)
        backend = dispatch.backend(self.where)  # choco_mix's local-step operands, never read here
        self._unused = [backend.to_target(np.ones(1, self.dtype)), backend.to_target(np.ones(self.width, self.dtype))]

    def start(self, comm: Any) -> None:
        """Every x̂ starts equal to its worker's x: this rank's own from its row, the others'
        from the rows the ranks send each other once (not counted as gossip)."""
        row = self.params.reshape(-1)
        dispatch.copy_into(self.rows[0], dispatch.host_array(row))
        received = comm.neighbours(row, self.sources, self.destinations, 32767)
        for index, source in enumerate(self.sources, 1):
            dispatch.copy_into(self.rows[index], dispatch.host_array(received[source]))

    def mix(self, comm: Any, t: int, gamma: float) -> None:
        """Step t's gossip: q_i's payload to every holder of a copy, the payloads received
        applied to their copies, then x_i += Σ_j γW_ij (x̂_j − x̂_i) by the in-process kernel."""
        row = self.params.reshape(-1)
        options = dict(seed=self.seed, step=t)
        payload = compress.encode(row, self.rows[0], self.compressor, worker=self.rank, **options)
        received = comm.neighbours(payload, self.sources, self.destinations, t % 32768)
        for index, source in enumerate(self.sources, 1):
            compress.decode(self.rows[index], dispatch.host_array(received[source]), self.compressor, **options)
        neighbours, weights = gossip_neighbours(self.topology, self.size, t, gamma)
        place = {self.rank: 0, **{source: index for index, source in enumerate(self.sources, 1)}}
        local_neighbours = np.array([[place[int(j)] for j in neighbours[self.rank]]], np.int64)
        self._run_mix(local_neighbours, weights[self.rank : self.rank + 1].astype(self.dtype))

    def _run_mix(self, neighbours: np.ndarray, weights: np.ndarray) -> None:
        """The in-process `choco_mix` over this rank's row and copies, with no local step (the
        rank steps AdamW itself, before or after, as its order says)."""
        backend = dispatch.backend(self.where)
        row = backend.kernel_array(_arrays.classify("params", self.params))
        copies = backend.kernel_array(_arrays.classify("public", self.rows))
        zero = self.dtype.type(0)
        arguments = [row, row, row, row, copies, *self._unused]
        arguments += [backend.to_target(neighbours), backend.to_target(weights), True, *[zero] * 7]
        grid = (1, self.compressor.blocks(self.width))
        dispatch.run_grid(
            self.where, "compress", "choco_mix", self.dtype, grid, [*arguments, self.compressor.block_size]
        )
        _arrays.mark_written(self.params)
