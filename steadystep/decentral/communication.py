"""What decentralized training communicates (SPEC §8): whom each worker hears from, the bytes
each one sends (counted the same way in process and over ranks), and DiLoCo's local steps with an
outer optimizer, which communicate once every H steps."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from steadystep import checks
from steadystep.compress import Compressor, check_compressor
from steadystep.decentral.topology import Topology

__all__ = [
    "DiLoCo",
    "check_communication",
    "bytes_sent",
    "gossip_neighbours",
    "mixing_neighbours",
    "payloads_sent",
    "readers",
    "ring_all_reduce",
]


@dataclass(frozen=True)
class DiLoCo:
    """Local steps with an outer optimizer (DiLoCo, Douillard et al. 2023; SPEC §8): the workers
    step AdamW alone (W = I), and after every ``every`` (H) steps their pseudo-gradients
    Δ_i = y_i − x_i are mixed over the topology (complete: the original all-reduce; any other:
    the decentralized variant) and the outer copies y take torch's Nesterov SGD step with ``lr``
    α and ``momentum`` μ; then x_i ← y_i. The outer copies all start at the workers' mean (their
    common model when they start equal, as DiLoCo's do). The inner moments are kept across rounds. Round r
    mixes with the topology's W_r. With the optimizer's ``compression``, the pseudo-gradients
    travel compressed with error feedback.

    Δ̄_i = Σ_j W_ij Q(e_j) (e_j += Δ_j first, then e_j −= Q(e_j));  b ← μb + Δ̄;  y ← y − α(Δ̄ + μb)

    ``DiLoCo(every=1, lr=1.0, momentum=0.0)`` over complete averaging is complete ATC.
    """

    every: int = 50
    lr: float = 0.7
    momentum: float = 0.9

    def __post_init__(self) -> None:
        checks.count("every", self.every, 1, why=" (H, the inner steps between outer steps)")
        checks.in_range("lr", self.lr, 0.0, low_open=True, why=" (the outer learning rate α)")
        checks.in_range("momentum", self.momentum, 0.0, 1.0, high_open=True, why=" (the outer Nesterov momentum μ)")

    def round_ending(self, t: int) -> Optional[int]:
        """The round that ends with step t (zero-based), or None if t is an inner step."""
        return (t + 1) // self.every - 1 if (t + 1) % self.every == 0 else None


def check_communication(
    topology: Topology,
    workers: int,
    compression: Optional[Compressor],
    outer: Optional[DiLoCo],
    consensus: float,
    public: Any = None,
) -> None:
    """Compressed gossip's and outer steps' options, checked wherever an optimizer is made (in
    one process, or a rank's worker): ``outer`` a DiLoCo with neither ``consensus`` nor
    ``public``; ``compression`` a compressor with γ > 0 and, for gossip, a topology whose
    readers are known (`readers()`)."""
    if outer is not None:
        if not isinstance(outer, DiLoCo):
            raise TypeError(f"outer must be a decentral.DiLoCo(every=, lr=, momentum=) or None; got {outer!r}")
        if consensus != 1.0 or public is not None:
            raise ValueError(
                "consensus and public are compressed gossip's; with outer= the workers mix only in the outer "
                "step (its lr and momentum say how much): leave them out"
            )
    if compression is not None:
        check_compressor(compression)
        if consensus == 0.0:
            raise ValueError(
                "consensus must be in (0, 1] with compression (CHOCO's consensus step size γ; 0 never mixes)"
            )
        if outer is None:  # public copies (not the outer step's pseudo-gradients) need the period
            readers(topology, workers)


def gossip_neighbours(topology: Topology, workers: int, t: int, consensus: float) -> tuple[np.ndarray, np.ndarray]:
    """Each worker's neighbours j ≠ i with W_ij ≠ 0 at step t, and their weights γ·W_ij, as two
    [N, K] arrays (K the most any worker has, at least 1; a shorter row is padded with the worker
    itself at weight 0, whose difference x̂_i − x̂_i is 0)."""
    off = topology.matrix(workers, t)
    np.fill_diagonal(off, 0.0)
    return _lists(consensus * off)


def mixing_neighbours(topology: Topology, workers: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Every j with W_ij ≠ 0 at step t, the worker itself included, and W_ij, as two [N, K]
    arrays (padded with the worker itself at weight 0)."""
    return _lists(topology.matrix(workers, t))


def _lists(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-zero entries of each row of ``weights``: columns and values, padded as above."""
    workers = len(weights)
    nonzero = weights != 0.0
    width = max(1, int(nonzero.sum(axis=1).max(initial=0)))
    neighbours = np.tile(np.arange(workers, dtype=np.int64)[:, None], (1, width))
    values = np.zeros((workers, width))
    for worker in range(workers):
        columns = np.flatnonzero(nonzero[worker])
        neighbours[worker, : columns.size] = columns
        values[worker, : columns.size] = weights[worker, columns]
    return neighbours, values


def readers(topology: Topology, workers: int) -> np.ndarray:
    """[N, N] booleans: ``readers[j, i]`` when worker j reads worker i's row (W_ji ≠ 0, j ≠ i) at
    some step of the topology's period. Compressed gossip sends to all of them at every step:
    each holds a public copy of worker i, which must take in every compressed difference."""
    period = topology.period(workers)
    if period is None:
        raise ValueError(
            f"compressed gossip over the topology {topology.name!r} needs its period: every worker that ever "
            "reads a worker keeps a public copy of it, updated at every step; pass "
            "decentral.from_matrix(W_of_t, period=P), or a fixed matrix"
        )
    return _readers(topology, workers, period)


@functools.lru_cache(maxsize=32)
def _readers(topology: Topology, workers: int, period: int) -> np.ndarray:
    found = np.zeros((workers, workers), bool)
    for t in range(period):
        found |= topology.matrix(workers, t) != 0.0
    np.fill_diagonal(found, False)
    found.setflags(write=False)
    return found


def ring_all_reduce(workers: int) -> float:
    """Rows' worth each worker sends in a ring all-reduce of one row each: 2·(N − 1)/N (what
    complete averaging counts; a backend may sum another way, sending about as much)."""
    return 2.0 * (workers - 1) / workers


def payloads_sent(topology: Topology, workers: int, t: int, compressed: bool, public: bool = False) -> np.ndarray:
    """Rows' worth each worker sends at step t: one per peer that reads its row (W_ji ≠ 0,
    j ≠ i); complete averaging as a ring all-reduce, 2·(N − 1)/N, unless the rows are compressed,
    which cannot be summed on the way: then an all-gather, N − 1. With ``public`` copies
    (compressed gossip), one per worker that reads the row at any step of the period
    (`readers()`), as each of them keeps its public copy current."""
    if workers == 1:
        return np.zeros(1)
    if topology.kind == "complete":
        return np.full(workers, (workers - 1.0) if compressed else ring_all_reduce(workers))
    if public:
        return readers(topology, workers).sum(axis=0).astype(np.float64)
    if topology.kind == "peer":  # every step counts this: from the peers, not an N × N matrix
        peers = np.asarray(topology.peers(workers, t))
        return np.bincount(peers[peers != np.arange(workers)], minlength=workers).astype(np.float64)
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
    public: bool = False,
) -> np.ndarray:
    """The bytes each worker sends at step t for rows of ``width`` values of ``itemsize`` bytes,
    compressed by ``compression`` or dense; ``public``: to every holder of a public copy, as
    compressed gossip sends (`payloads_sent()`)."""
    payload = width * itemsize if compression is None else compression.payload_bytes(width, itemsize)
    return payloads_sent(topology, workers, t, compression is not None, public) * payload
