"""Topologies: who mixes with whom at step t, as pure functions of (N, t), so every process
computes the same W_t with no communication; and the checks of how the workers mix."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from steadystep import _html, checks, dispatch

__all__ = [
    "ORDERS",
    "TOPOLOGIES",
    "Topology",
    "base_graph",
    "base_graph_period",
    "check_is_topology",
    "check_mixing",
    "check_topology",
    "complete",
    "directed_ring",
    "from_matrix",
    "one_peer_exponential",
    "ring",
]


ORDERS = ("awc", "atc")


@dataclass(frozen=True)
class Topology:
    """A mixing topology. ``peers(N, t)`` gives each worker's single incoming peer (one-peer
    topologies) and ``matrix(N, t)`` the dense row-stochastic W_t (for tests, plots and MPI)."""

    name: str
    kind: str  # "complete", "peer" or "dense"
    peer_rule: Optional[Callable[[int, int], np.ndarray]] = field(default=None, repr=False)
    matrix_rule: Optional[Callable[[int, int], np.ndarray]] = field(default=None, repr=False)
    static: bool = True  # False for a user matrix given as a function of t
    period_rule: Optional[Callable[[int], int]] = field(default=None, repr=False)

    def period(self, workers: int) -> Optional[int]:
        """P, after which W_t repeats (W_{t+P} = W_t) for ``workers`` workers; None when a user's
        function of t does not say."""
        checks.counts(workers=(workers, 1))
        if self.period_rule is not None:
            return self.period_rule(workers)
        return 1 if self.kind == "complete" or self.static else None

    def peers(self, workers: int, t: int) -> Optional[np.ndarray]:
        checks.counts(workers=(workers, 1), t=(t, 0))  # t = −1 or 1.5 would pick a peer all the same
        return None if self.peer_rule is None else self.peer_rule(workers, t)

    def matrix(self, workers: int, t: int) -> np.ndarray:
        checks.counts(workers=(workers, 1), t=(t, 0))
        if self.kind == "complete":
            return np.full((workers, workers), 1.0 / workers)
        if self.peer_rule is not None:
            weights = np.zeros((workers, workers))
            for worker, peer in enumerate(self.peer_rule(workers, t)):
                weights[worker, worker] += 0.5
                weights[worker, peer] += 0.5
            return weights
        assert self.matrix_rule is not None, f"a {self.kind!r} topology needs a peer or a matrix rule"
        return _checked_matrix(self.matrix_rule(workers, t), workers)

    def _repr_html_(self) -> str:
        """What Jupyter shows: the rule, and for one-peer topologies whom each of 8 workers
        hears from at the first steps."""
        rows: list[tuple[str, object]] = [("name", self.name)]
        if self.kind == "complete":
            rows.append(("mixing", "W = 11ᵀ/N: every worker becomes the mean"))
        elif self.kind == "peer":
            rows.append(("mixing", "½ own row + ½ one peer's"))
            rule = self.peer_rule
            assert rule is not None, "a one-peer topology has a peer rule"
            rows += [(f"peers of 8 workers, t = {t}", rule(8, t).tolist()) for t in range(3)]
        elif self.static:  # a fixed matrix: its rule returns it whatever N and t
            assert self.matrix_rule is not None, "a dense topology has a matrix rule"
            rows.append(("mixing", "a fixed {} × {} W".format(*np.shape(self.matrix_rule(0, 0)))))
        else:
            rows.append(("mixing", "W_t, a function of t"))
        return _html.table("Topology", rows)


def complete() -> Topology:
    """W = 11ᵀ/N: every worker becomes the mean."""
    return Topology("complete", "complete")


def one_peer_exponential() -> Topology:
    """Worker i receives from (i − 2^(t mod τ)) mod N, τ = bit_length(N − 1); W_ii = W_i,peer = ½.
    With N a power of two, any τ consecutive steps average exactly."""
    return Topology("one_peer_exponential", "peer", peer_rule=_exponential_peers, period_rule=_exponential_period)


def ring() -> Topology:
    """Alternating one-peer ring: peer (i − 1) mod N at even t, (i + 1) mod N at odd t; ½/½."""
    return Topology("ring", "peer", peer_rule=_ring_peers, period_rule=_ring_period)


def directed_ring() -> Topology:
    """A fixed one-peer ring: worker i receives from (i − 1) mod N at every step; ½/½. It mixes
    slower than one-peer exponential, but the same peer every step is what compressed gossip
    wants: each worker's compressed differences go to one reader, not to each of τ."""
    return Topology("directed_ring", "peer", peer_rule=_directed_ring_peers)


def from_matrix(
    weights: Union[np.ndarray, Callable[[int], np.ndarray]], name: str = "matrix", period: Optional[int] = None
) -> Topology:
    """A user topology: a row-stochastic [N, N] matrix, or a function of t returning one, which
    repeats after ``period`` steps if given (compressed gossip needs to know who will ever read a
    worker: `Topology.period`)."""
    if period is not None:
        checks.counts(period=(period, 1))
        if not callable(weights):
            raise ValueError("period is for a matrix that is a function of t; a fixed matrix repeats every step")
    rule = functools.partial(_matrix_of_t, weights) if callable(weights) else functools.partial(_fixed_matrix, weights)
    given = None if period is None else functools.partial(_fixed_period, period)
    return Topology(name, "dense", matrix_rule=rule, static=not callable(weights), period_rule=given)


def base_graph(peers: int = 1) -> Topology:
    """The Base-(k+1) graph of Takezawa et al. (NeurIPS 2023) with k = ``peers``: a sequence
    W_0, ..., W_{P−1} (repeated) in which each worker mixes with at most k others per step and
    whose product W_{P−1}···W_0 is exactly 11ᵀ/N for every N, where one-peer exponential is exact
    only for powers of two. P ≤ 2⌊log_{k+1} N⌋ + 2 (`base_graph_period`).

    >>> import numpy as np
    >>> W = base_graph_period(6, peers=1)
    >>> product = np.linalg.multi_dot(W[::-1]) if len(W) > 1 else W[0]
    >>> bool(np.allclose(product, 1 / 6)), len(W)
    (True, 5)
    """
    checks.counts(peers=(peers, 1))
    return Topology(
        f"base_{peers + 1}_graph",
        "dense",
        matrix_rule=functools.partial(_base_graph_matrix, peers),
        static=False,
        period_rule=functools.partial(_base_graph_length, peers),
    )


def _base_graph_length(peers: int, workers: int) -> int:
    return len(base_graph_period(workers, peers))


def _base_graph_matrix(peers: int, workers: int, t: int) -> np.ndarray:
    period = base_graph_period(workers, peers)
    return period[t % len(period)]


@functools.lru_cache(maxsize=64)
def base_graph_period(workers: int, peers: int = 1) -> tuple[np.ndarray, ...]:
    """The period W_0, ..., W_{P−1} of the Base-(k+1) graph on ``workers`` nodes, k = ``peers``
    (read-only float64 arrays, each doubly stochastic with at most k off-diagonal entries a row).

    When every prime factor of N is at most k + 1, N = f_1···f_P (factors ≤ k + 1) and step r
    averages the groups of f_r workers that differ only in the r-th mixed-radix digit. Otherwise N
    is written in base k + 1 as blocks n_0 > n_1 > ... of a_l·(k+1)^{p_l} workers (a_l ≤ k):
    1. every block averages itself (the digit steps above), so block l holds its mean;
    2. at merge step q = 0, 1, ..., every worker of the blocks after q (S_{q+1} of them, fewer than
       (k+1)^{p_q}) takes weight n_q/(S_q·a_q) from one worker in each of block q's a_q sub-blocks
       of (k+1)^{p_q} (S_q = n_q + S_{q+1}). Block q's total then becomes n_q/S_q of the blocks ≥ q,
       its mean the global mean, split equally among its sub-blocks; the blocks after it stay
       uniform, holding the global mean once the last merge is done;
    3. from the step after its merge, block q averages each sub-block (digit steps again), while
       the later merges go on.
    """
    checks.counts(workers=(workers, 1), peers=(peers, 1))
    base = peers + 1
    steps: list[np.ndarray] = []

    def at(step: int) -> np.ndarray:
        while len(steps) <= step:
            steps.append(np.zeros((workers, workers)))
        return steps[step]

    def digits(nodes: list[int], first: int) -> int:
        """Average ``nodes`` exactly, from step ``first``; the step after the last one."""
        factors, rest = [], len(nodes)
        for factor in range(base, 1, -1):
            while rest % factor == 0:
                factors.append(factor)
                rest //= factor
        assert rest == 1, (len(nodes), peers)
        stride = 1
        for offset, factor in enumerate(factors):
            weights = at(first + offset)
            for index, node in enumerate(nodes):
                digit = (index // stride) % factor
                group = [nodes[index + (other - digit) * stride] for other in range(factor)]
                weights[node, group] = 1.0 / factor
            stride *= factor
        return first + len(factors)

    everyone = list(range(workers))
    if _largest_prime_factor(workers) <= base:
        digits(everyone, 0)
    else:
        sizes, rest, power = [], workers, base ** (len(np.base_repr(workers, base)) - 1)
        while rest:
            if rest >= power:
                sizes.append(rest // power * power)
                rest -= sizes[-1]
            power //= base
        starts = np.cumsum([0, *sizes]).tolist()
        blocks = [everyone[starts[index] : starts[index + 1]] for index in range(len(sizes))]
        merged = max(digits(block, 0) for block in blocks)
        for q, block in enumerate(blocks[:-1]):
            later = everyone[starts[q + 1] :]
            share = sizes[q] / (workers - starts[q])  # n_q / S_q
            power = _largest_power(sizes[q], base)  # (k+1)^{p_q}: a_q ≤ k is not a multiple of k + 1
            parts = [block[start : start + power] for start in range(0, len(block), power)]
            weights = at(merged + q)
            for position, node in enumerate(later):
                weights[node, node] = 1.0 - share
                for part in parts:
                    partner = part[position]
                    weights[node, partner] = weights[partner, node] = share / len(parts)
                    weights[partner, partner] = 1.0 - share / len(parts)
            for part in parts:
                digits(part, merged + q + 1)
    for weights in steps:
        idle = weights.sum(axis=1) == 0.0  # nothing to do at this step: keeps its value
        weights[idle, idle] = 1.0
        weights.setflags(write=False)
    return tuple(steps) if steps else (np.ones((1, 1)),)


def _largest_power(size: int, base: int) -> int:
    """The largest power of ``base`` dividing ``size``."""
    power = 1
    while size % (power * base) == 0:
        power *= base
    return power


def _largest_prime_factor(number: int) -> int:
    largest, divisor = 1, 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            largest, number = divisor, number // divisor
        divisor += 1
    return max(largest, number)


def _exponential_peers(workers: int, t: int) -> np.ndarray:
    period = (workers - 1).bit_length()
    offset = 1 << (t % period) if period else 0
    return (np.arange(workers) - offset) % workers


def _exponential_period(workers: int) -> int:
    return max(1, (workers - 1).bit_length())


def _ring_period(workers: int) -> int:
    return 2


def _fixed_period(period: int, workers: int) -> int:
    return period


def _directed_ring_peers(workers: int, t: int) -> np.ndarray:
    return (np.arange(workers) - 1) % workers


def _ring_peers(workers: int, t: int) -> np.ndarray:
    return (np.arange(workers) + (-1 if t % 2 == 0 else 1)) % workers


def _matrix_of_t(weights: Callable[[int], np.ndarray], workers: int, t: int) -> np.ndarray:
    return weights(t)


def _fixed_matrix(weights: Any, workers: int, t: int) -> np.ndarray:
    return np.asarray(weights)


TOPOLOGIES = {
    "complete": complete,
    "one_peer_exponential": one_peer_exponential,
    "ring": ring,
    "directed_ring": directed_ring,
}


def check_is_topology(topology: Any) -> None:
    """Refuse anything but a Topology (a name among them: say which function builds it)."""
    if isinstance(topology, Topology):
        return
    named = isinstance(topology, str) and topology in TOPOLOGIES
    raise TypeError(
        "topology must be a Topology, such as decentral.ring() or decentral.from_matrix(W); got "
        + (f"the name {topology!r}: pass decentral.{topology}()" if named else repr(topology))
    )


def check_mixing(topology: Topology, order: str, consensus: float) -> None:
    """How the workers mix, checked where an optimizer is built (in one process or over MPI)."""
    check_is_topology(topology)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if isinstance(consensus, bool) or not isinstance(consensus, numbers.Real) or not 0.0 <= consensus <= 1.0:
        raise ValueError(
            f"consensus must be a number in [0, 1] (the weight γ of W in γW + (1 − γ)I), got {consensus!r}"
        )


def check_topology(topology: Topology, workers: int) -> None:
    """Refuse a fixed user matrix that cannot mix ``workers`` workers (wrong shape, not
    row-stochastic) when the optimizer is built, not at its first step; a matrix that is a
    function of t is checked at each step."""
    if topology.kind == "dense" and topology.static:
        topology.matrix(workers, 0)


def _checked_matrix(weights: Any, workers: int) -> np.ndarray:
    """W as float64, refused unless it is a non-negative [N, N] matrix whose rows sum to 1 to
    the precision it was given in (a float32 W, torch's default, sums to 1 only within float32's
    rounding); its rows are then scaled to sum to 1 in float64, so mixing neither grows nor
    shrinks the parameters over a long run."""
    given = dispatch.host_array(weights)
    weights = given.astype(np.float64)
    if weights.shape != (workers, workers):
        raise ValueError(
            f"topology matrix has shape {weights.shape}; the run has {workers} worker(s), so it must be "
            f"({workers}, {workers})"
        )
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("topology matrix must be finite and non-negative")
    sums = weights.sum(axis=1)
    resolution = float(np.finfo(given.dtype if given.dtype.kind == "f" else np.float64).eps)
    bad = np.flatnonzero(np.abs(sums - 1.0) > max(1e-12, 4 * resolution) * workers)
    if bad.size:
        raise ValueError(
            f"topology matrix rows must sum to 1 (row-stochastic); rows {bad.tolist()} sum to {sums[bad].tolist()}"
        )
    return weights / sums[:, None]
