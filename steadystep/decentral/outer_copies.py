"""Local steps with an outer optimizer (DiLoCo, SPEC §8) with one worker per rank: what a rank
keeps and sends so that its row equals worker ``rank`` of the in-process step.

A rank keeps its outer copy y, outer momentum b and what compression left of its
pseudo-gradients e ([1, D] each, where its row lives). Inner steps send nothing. After every
H-th step it forms q = Q(e + y − x) as the in-process kernel does
([`compress.encode`][steadystep.compress.encode], the identity without compression), sends it
to the ranks that mix it in this round (complete averaging without compression: a sum over
the ranks, as an all-reduce), and runs the in-process `outer_step` kernel over what it
received: Δ̄ = Σ_j W_ij q_j, Nesterov on y, x ← y.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from steadystep import _arrays, compress, dispatch
from steadystep.compress import Compressor
from steadystep.decentral.communication import DiLoCo, mixing_neighbours
from steadystep.decentral.topology import Topology

__all__ = ["OUTER_BUFFERS", "OuterCopies"]

OUTER_BUFFERS = ("outer", "momentum_buffer", "residual")  # as DecentralizedAdamW.buffers names them


class OuterCopies:
    """Rank ``rank``'s outer state for its worker ``local`` (a one-row DecentralizedAdamW):
    ``saved`` buffers (name → [1, D]) to continue from, or None to start (`start`)."""

    def __init__(
        self,
        outer: DiLoCo,
        compressor: Optional[Compressor],
        seed: int,
        topology: Topology,
        rank: int,
        size: int,
        local: Any,
        saved: Optional[dict[str, np.ndarray]] = None,
    ):
        self.outer, self.compressor, self.seed, self.topology = outer, compressor, seed, topology
        self.rank, self.size, self.local = rank, size, local
        operand = _arrays.classify("params", local.params)
        self.width, self.dtype = operand.shape[1], np.dtype(operand.dtype)
        self.where = dispatch.choose_target([operand], None)
        self.buffers: dict[str, Any] = {}
        for name in OUTER_BUFFERS:
            start = np.zeros((1, self.width), self.dtype) if saved is None else np.asarray(saved[name], self.dtype)
            if start.shape != (1, self.width):
                raise ValueError(f"the saved {name} has shape {start.shape}; this rank's row is (1, {self.width})")
            self.buffers[name] = dispatch.as_like(start, local.params)

    def start(self, comm: Any) -> None:
        """Every outer copy starts at the workers' mean, as in process (from every rank's row)."""
        rows = np.stack(comm.allgather(dispatch.host_array(self.local.params).reshape(-1)))
        dispatch.copy_into(self.buffers["outer"], rows.mean(axis=0, dtype=rows.dtype)[None])

    def step(self, comm: Any, t: int) -> None:
        """The outer step if step t ends a round (nothing otherwise)."""
        round_index = self.outer.round_ending(t)
        if round_index is None:
            return
        x, y, e = (
            dispatch.host_array(value) for value in (self.local.params, self.buffers["outer"], self.buffers["residual"])
        )
        residual = e + (y - x)  # the kernel's operations, in the rows' dtype
        sent = np.zeros_like(residual)
        compressor = self.compressor or compress.identity()
        options = dict(seed=self.seed, step=round_index)
        payload = compress.encode(residual[0], sent[0], compressor, worker=self.rank, **options)
        dispatch.copy_into(self.buffers["residual"], residual - sent)
        neighbours, weights = mixing_neighbours(self.topology, self.size, round_index)
        if self.topology.kind == "complete" and self.compressor is None:  # an all-reduce of the rows
            stack, places, scale = comm.sum(sent[0])[None], [0], np.full(1, 1.0 / self.size)
        else:
            mine = neighbours[self.rank][weights[self.rank] != 0.0]
            sources = [int(j) for j in mine if j != self.rank]
            matrix = self.topology.matrix(self.size, round_index)
            destinations = [int(k) for k in np.flatnonzero(matrix[:, self.rank]) if k != self.rank]
            received = comm.neighbours(payload, sources, destinations, round_index % 32768)
            rows = {self.rank: sent[0]}
            for source in sources:
                rows[source] = np.zeros(self.width, self.dtype)
                compress.decode(rows[source], dispatch.host_array(received[source]), compressor, **options)
            order = sorted(rows)
            stack = np.stack([rows[j] for j in order])
            places = [order.index(int(j)) if int(j) in rows else 0 for j in neighbours[self.rank]]
            scale = weights[self.rank]
        self._run_outer_step(stack, np.array([places], np.int64), scale[None].astype(self.dtype), compressor)

    def _run_outer_step(
        self, stack: np.ndarray, places: np.ndarray, weights: np.ndarray, compressor: Compressor
    ) -> None:
        """The in-process `outer_step` over this rank's row, with the received q's as ``stack``."""
        backend = dispatch.backend(self.where)
        named = {
            "params": self.local.params,
            "outer": self.buffers["outer"],
            "momentum_buffer": self.buffers["momentum_buffer"],
        }
        rows = [backend.kernel_array(_arrays.classify(name, value)) for name, value in named.items()]
        cast = self.dtype.type
        arguments = [*rows, backend.to_target(np.ascontiguousarray(stack)), backend.to_target(places)]
        arguments += [backend.to_target(weights), cast(self.outer.lr), cast(self.outer.momentum), compressor.block_size]
        grid = (1, compressor.blocks(self.width))
        dispatch.run_grid(self.where, "compress", "outer_step", self.dtype, grid, arguments)
        _arrays.mark_written(self.local.params, *self.buffers.values())
