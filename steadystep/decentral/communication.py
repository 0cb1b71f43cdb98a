"""What a decentralized step communicates (SPEC §8): whom each worker hears from in compressed
gossip, and the bytes each worker sends, counted the same way in process and over ranks."""

from __future__ import annotations

from typing import Optional

import numpy as np

from steadystep.compress import Compressor
from steadystep.decentral.topology import Topology

__all__ = ["bytes_sent", "gossip_neighbours", "payloads_sent"]


def gossip_neighbours(topology: Topology, workers: int, t: int, consensus: float) -> tuple[np.ndarray, np.ndarray]:
    """Each worker's neighbours j ≠ i with W_ij ≠ 0 at step t, and their weights γ·W_ij, as two
    [N, K] arrays (K the most any worker has, at least 1; a shorter row is padded with the worker
    itself at weight 0, whose difference x̂_i − x̂_i is 0)."""
    weights = topology.matrix(workers, t)
    off = weights.copy()
    np.fill_diagonal(off, 0.0)
    nonzero = off != 0.0
    width = max(1, int(nonzero.sum(axis=1).max(initial=0)))
    neighbours = np.tile(np.arange(workers, dtype=np.int64)[:, None], (1, width))
    scaled = np.zeros((workers, width))
    for worker in range(workers):
        columns = np.flatnonzero(nonzero[worker])
        neighbours[worker, : columns.size] = columns
        scaled[worker, : columns.size] = consensus * off[worker, columns]
    return neighbours, scaled


def payloads_sent(topology: Topology, workers: int, t: int, compressed: bool) -> np.ndarray:
    """Rows' worth each worker sends at step t: one per peer that reads its row (W_ji ≠ 0,
    j ≠ i); complete averaging as a ring all-reduce, 2·(N − 1)/N, unless the rows are compressed,
    which cannot be summed on the way: then an all-gather, N − 1."""
    if workers == 1:
        return np.zeros(1)
    if topology.kind == "complete":
        return np.full(workers, (workers - 1.0) if compressed else 2.0 * (workers - 1) / workers)
    off = topology.matrix(workers, t) != 0.0
    np.fill_diagonal(off, False)
    return off.sum(axis=0).astype(np.float64)


def bytes_sent(
    topology: Topology,
    workers: int,
    t: int,
    width: int,
    itemsize: int,
    compression: Optional[Compressor] = None,
) -> np.ndarray:
    """The bytes each worker sends at step t for rows of ``width`` values of ``itemsize`` bytes,
    compressed by ``compression`` or dense."""
    payload = width * itemsize if compression is None else compression.payload_bytes(width, itemsize)
    return payloads_sent(topology, workers, t, compression is not None) * payload
