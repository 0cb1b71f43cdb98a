"""Decentralized AdamW with one worker per process (a rank), over any communicator: what
[`steadystep.decentral.mpi`][steadystep.decentral.mpi] (MPI) and
[`steadystep.torch.distributed`][steadystep.torch.distributed] (torch.distributed: gloo, NCCL) share, matching the
in-process [N, D] simulation of [`steadystep.decentral`][steadystep.decentral].

Each rank holds its own row x_i, m_i, v_i and steps it with the local kernel of the
in-process step (one worker of it). Every rank computes the same W_t from (N, t) with no
communication; one-peer topologies then exchange a single row (send to the rank that reads
from us, receive from our peer), complete averaging sums the rows, and a user matrix exchanges
rows point to point only where W_t has non-zeros. The mixing is computed in the rows' dtype,
in the simulation's order (on the host, or on the GPU where the communicator keeps GPU rows),
so one-peer steps equal the simulation bit for bit; complete averaging equals it within the
rounding of the backend's sum. The torch-module trainer over torch.distributed
([`steadystep.torch.distributed.DistributedTrainer`][steadystep.torch.distributed.DistributedTrainer])
mixes its rows through the same `mix()`.

Every collective action is agreed: a rank whose part fails raises its error, and every other
rank a `RankError` naming it, before anything is written, so no rank is left waiting
for a peer. A non-finite gradient on any rank stops every rank with one
NonFiniteGradientError naming those ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Union

import numpy as np

from steadystep import _arrays, checks, compress, decentral, dispatch
from steadystep.decentral.outer_copies import OUTER_BUFFERS, OuterCopies
from steadystep.decentral.public_copies import PublicCopies

__all__ = [
    "Communicator",
    "RankAdamW",
    "RankError",
    "RankedRun",
    "agree",
    "check_same",
    "checkpoint_file",
    "digest",
    "each_rank",
    "fingerprint",
    "hyperparameters",
    "join_checkpoint",
    "joined",
    "mix",
    "rank_files",
    "resume",
    "run_of",
    "split_checkpoint",
]


class Communicator(Protocol):
    """What a rank needs of its backend (steadystep.mpi and steadystep.torch.distributed
    provide one each). Rows are this rank's [D] arrays; what comes back is host memory."""

    rank: int
    size: int
    bytes_sent: float  # what this rank's calls have sent so far (a sum: 2·(N − 1)/N rows, a ring all-reduce's)

    def allgather(self, value: Any) -> list:
        """Every rank's ``value`` (a small Python object), in rank order."""

    def exchange(self, row: Any, destination: int, source: int) -> np.ndarray:
        """Send ``row`` to ``destination`` and receive ``source``'s row."""

    def sum(self, row: Any) -> np.ndarray:
        """The elementwise sum of every rank's ``row``."""

    def neighbours(self, row: Any, sources: list[int], destinations: list[int], tag: int) -> dict[int, np.ndarray]:
        """``row`` to each rank of ``destinations``, and the rows of ``sources``, by rank."""

    def broadcast(self, row: np.ndarray, root: int) -> np.ndarray:
        """Rank ``root``'s ``row`` (a host array, of the same shape and dtype on every rank)."""

    def local(self, row: Any) -> Any:
        """``row`` where this communicator mixes it: a host copy, or the GPU row itself where
        the rows travel GPU to GPU (what exchange and sum then return too)."""


class RankError(RuntimeError):
    """Another rank's part of a collective call failed, so this rank did nothing either."""

    def __init__(self, action: str, failures: dict[int, str]):
        self.action, self.failures = action, failures
        reasons = "; ".join(f"rank {rank}: {reason}" for rank, reason in failures.items())
        super().__init__(f"{action} failed on rank(s) {sorted(failures)} ({reasons}); no rank changed anything")


def agree(comm: Communicator, action: str, work: Callable[[], Any]) -> Any:
    """``work()`` on this rank, then every rank learns how every rank's went. A rank that raised
    alone would leave the others waiting forever in their next collective call (a launcher does
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
        outcome = (failure.what, failure.step)
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
        what, step = outcomes[non_finite[0]]
        raise decentral.NonFiniteGradientError(non_finite, step, what)
    return result


class RankedRun:
    """The protocol every ranked worker follows (the flat [D] row's and the torch-module
    trainer's), over ``comm``, mixing over ``topology`` in ``order``:

    - agree: every rank runs its part of a collective action, then learns how the others'
      went (`agree()`), and checks that all passed the same settings (`check_same()`);
    - step: check the step on every rank (nothing written), then mix the rows around the local
      update: before it (AWC) or after it (ATC);
    - save: each rank writes ``<prefix>.rank<r>.npz`` beside its previous file, and replaces
      it only once every rank has written;
    - resume: every rank reads its file, and all must hold the same step.

    A local worker brings what is its own: how to check and apply its step, which rows the
    ranks mix, and how it writes and reads its state.
    """

    def __init__(self, comm: Communicator, topology: decentral.Topology, order: str):
        self.comm, self.topology, self.order = comm, topology, order
        self.rank, self.size = comm.rank, comm.size

    def agree(self, action: str, work: Callable[[], Any]) -> Any:
        """`agree()` over this run's ranks."""
        return agree(self.comm, action, work)

    def check_same(self, settings: dict[str, Any]) -> None:
        """`check_same()` over this run's ranks."""
        check_same(self.comm, settings)

    def step(
        self,
        t: int,
        check: Callable[[], Any],
        apply: Callable[[Any], Any],
        rows: Callable[[], Iterable[Union[decentral.DecentralizedAdamW, PublicCopies]]],
        gamma: Callable[[Any], float],
    ) -> Any:
        """Step ``t``: ``check()`` on every rank, agreed (it writes nothing), then ``apply`` to
        what it returned, with the ``rows`` (a group's worker, or its public copies for
        compressed gossip) mixed at consensus strength ``gamma(checked)`` before (AWC) or after
        (ATC) it. Returns what ``apply`` returned."""
        checked = self.agree(f"step {t}", check)
        if self.order == "awc":
            self._mix(t, rows(), gamma(checked))
        result = apply(checked)
        if self.order == "atc":
            self._mix(t, rows(), gamma(checked))
        return result

    def _mix(self, t: int, rows: Iterable[Union[decentral.DecentralizedAdamW, PublicCopies]], gamma: float) -> None:
        """Mix each of this rank's row groups with its peers (dense rows, or compressed gossip
        over their public copies), and add to the group's ``bytes_sent`` what the communicator
        sent for it (the in-process step counts the same for worker ``rank``)."""
        for row in rows:
            before = self.comm.bytes_sent
            if isinstance(row, PublicCopies):
                row.mix(self.comm, t, gamma)
                local = row.local
            else:
                mix(self.comm, self.topology, t, gamma, row)
                local = row
            local.bytes_sent += self.comm.bytes_sent - before

    def outer_steps(self, t: int, outers: Iterable[OuterCopies]) -> None:
        """DiLoCo's outer step of each row group if step t ends a round, counting what the
        communicator sent for it as `_mix` does."""
        for outer in outers:
            before = self.comm.bytes_sent
            outer.step(self.comm, t)
            outer.local.bytes_sent += self.comm.bytes_sent - before

    def file(self, prefix: Union[str, Path]) -> Path:
        """This rank's checkpoint file of ``prefix``."""
        return checkpoint_file(prefix, self.rank)

    def save(self, prefix: Union[str, Path], write: Callable[[Path], None]) -> Path:
        """``write(path)`` this rank's state beside its file, then, once every rank has written,
        in its place: a save that fails on one rank (a full disk) leaves every rank's previous
        file as it was, so the set never mixes steps."""
        path = self.file(prefix)
        with decentral.written_beside(path, ".pending") as pending:
            self.agree("saving the checkpoint", lambda: write(pending))
        return path

    def resume(self, prefix: Union[str, Path], read: Callable[[Path], Any]) -> Any:
        """``read(path)`` of this rank's file on every rank, agreed (see `resume`)."""
        return resume(self.comm, prefix, read)


def checkpoint_file(prefix: Union[str, Path], rank: int) -> Path:
    """Rank ``rank``'s checkpoint file of ``prefix``."""
    return Path(f"{prefix}.rank{rank}.npz")  # the one place the name is made


def resume(comm: Communicator, prefix: Union[str, Path], read: Callable[[Path], Any]) -> Any:
    """``read(path)`` of this rank's file on every rank of ``comm``, agreed; the files must hold
    one save's step (``.t``), or every rank refuses them. A run resumes before it knows its
    settings (they are the file's), so this needs only the communicator."""
    saved = agree(comm, "loading the checkpoint", lambda: read(checkpoint_file(prefix, comm.rank)))
    steps = comm.allgather(saved.t)
    if len(set(steps)) > 1:  # files of different saves: the ranks would mix with different W_t, or wait forever
        found = ", ".join(f"rank {rank}: t={t}" for rank, t in enumerate(steps))
        raise ValueError(
            f"the checkpoint files {prefix}.rank*.npz are from different saves ({found}); restore one "
            "save's files on every rank"
        )
    return saved


class RankAdamW:
    """This rank's worker of a decentralized AdamW run over ``comm``.

    ``params`` is this rank's [D] row, trained in place. Every rank must pass the same
    topology, order and hyper-parameters, and rows of one length and dtype: each rank checks
    that all agree as the workers are made, and names the ranks that differ.

    ``compression`` gossips compressed payloads with public copies (CHOCO; `PublicCopies`),
    ``outer`` runs DiLoCo's local steps and outer steps (`OuterCopies`; the pseudo-gradients
    compressed when ``compression`` is given), each as
    [`DecentralizedAdamW`][steadystep.decentral.DecentralizedAdamW] does for worker ``rank``.
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
        compression: Optional[compress.Compressor] = None,
        seed: int = 0,
        outer: Optional[decentral.DiLoCo] = None,
        comm: Communicator,
        target: Optional[str] = None,
    ):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.topology, self.consensus, self.order = topology, consensus, order
        self.compression, self.seed, self.outer = compression, seed, outer
        self.run = RankedRun(comm, topology, order)

        def set_up() -> decentral.DecentralizedAdamW:
            decentral.check_mixing(topology, order, consensus)  # the local worker mixes nothing: checked here
            decentral.check_topology(topology, self.size)
            checks.count("seed", seed)
            decentral.check_communication(topology, self.size, compression, outer, consensus)
            operand = _arrays.classify("params", params)
            if len(operand.shape) != 1:
                raise ValueError(f"params must be this rank's [D] row, got shape {operand.shape}")
            _arrays.check_writable(operand)  # a list, say, would train a copy (before it is reshaped)
            if operand.storage:  # the exchange would mix the rows' bits
                raise TypeError(
                    f"params is {operand.storage}; a rank's row is mixed in float32 or float64 (keep it in float32)"
                )
            self._check_row(operand)
            return decentral.DecentralizedAdamW(
                params.reshape(1, -1),
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

        self.local = self.run.agree("creating the workers", set_up)
        rows = comm.allgather((self.local.width, str(self.local.dtype)))
        if len(set(rows)) > 1:  # a backend would truncate or pad the exchanged rows, or wait forever in a sum
            described = ", ".join(f"rank {rank}: {width} {dtype}" for rank, (width, dtype) in enumerate(rows))
            raise ValueError(f"every rank's params row must have the same length and dtype; got {described}")
        self._check_settings()
        self.copies: Optional[PublicCopies] = None
        self.outer_copies: Optional[OuterCopies] = None
        if outer is not None:
            self.outer_copies = self._outer_copies(None)
            self.outer_copies.start(comm)
        elif compression is not None:
            self.copies = self._public_copies(None)
            self.copies.start(comm)

    def _outer_copies(self, saved: Optional[dict[str, np.ndarray]]) -> OuterCopies:
        """This rank's outer state for DiLoCo (``saved`` buffers, or None: to start)."""
        assert self.outer is not None
        copies = lambda: OuterCopies(  # noqa: E731
            self.outer, self.compression, self.seed, self.topology, self.rank, self.size, self.local, saved
        )
        return self.run.agree("keeping the outer copies", copies)

    def _public_copies(self, rows: Optional[np.ndarray]) -> PublicCopies:
        """This rank's public copies for compressed gossip (saved ``rows``, or None: to start)."""
        assert self.compression is not None
        copies = lambda: PublicCopies(  # noqa: E731
            self.compression, self.seed, self.topology, self.rank, self.size, self.local, rows
        )
        return self.run.agree("keeping the public copies", copies)

    def _check_row(self, operand: _arrays.Operand) -> None:
        """A backend's own requirement on this rank's row (MPI: a CUDA-aware build for GPU rows)."""

    def _settings(self) -> dict[str, Any]:
        """What every rank must agree on besides the rows: with another W, γ, order or
        hyper-parameters the ranks would train different problems without a word."""
        options = hyperparameters(self.local)
        return {
            "topology": fingerprint(self.topology, self.size),
            "order": self.order,
            "consensus": self.consensus,
            **options,
            "decay_mask": digest(options["decay_mask"]),
            "t": self.local.t,
            "compression": None if self.compression is None else self.compression.name,
            "seed": self.seed,
            "outer": repr(self.outer),
        }

    def _check_settings(self) -> None:
        self.run.check_same(self._settings())

    def __repr__(self) -> str:
        local = self.local
        options = ", ".join(
            f"{name}={getattr(local, name)!r}" for name in ("lr", "betas", "eps", "weight_decay", "max_norm")
        )
        return (
            f"{type(self).__name__}(rank {self.rank} of {self.size}, {local.width:,} {local.dtype} on {local.where}, "
            f"topology={self.topology.name}, t={self.t}, order={self.order!r}, {options}, consensus={self.consensus!r})"
        )

    @property
    def t(self) -> int:
        return self.local.t

    @property
    def params(self) -> Any:
        """This rank's current row."""
        return self.local.params.reshape(-1)

    @property
    def bytes_sent(self) -> float:
        """The bytes this rank has sent to its peers (counted as the in-process step counts worker ``rank``)."""
        return float(self.local.bytes_sent[0])

    @property
    def extra(self) -> dict:
        """The ``extra`` of the checkpoint `load()` read (with the run's world size,
        topology, order and consensus); {} for a run started afresh."""
        return self.local.extra

    def step(self, grad: Any, lr: Optional[float] = None) -> None:
        """One step; raises NonFiniteGradientError on every rank (naming the ranks) if any rank's
        gradient is not finite, with nothing written anywhere. Bad input on one rank (a
        gradient of the wrong shape, a negative lr) raises there and a `RankError` on
        the others, again before anything is written: no rank is left waiting for a peer."""

        def check() -> tuple:
            if lr is not None:
                checks.non_negative(lr=lr)  # before AWC mixes anything into the parameters
            operand = _arrays.classify("grad", grad)
            if operand.shape != (self.local.width,):
                raise ValueError(f"grad must be this rank's row, of shape ({self.local.width},); got {operand.shape}")
            # One reduction where the row lives (no host copy of a GPU gradient), and its
            # norm serves the local step too.
            row = (grad if operand.kind == "device" else operand.value).reshape(1, -1)  # a list too
            return row, self.local.gradient_norms(row)

        self.run.step(
            self.t,
            check,
            lambda checked: self.local.step(checked[0], lr, norms=checked[1]),
            rows=lambda: [] if self.outer is not None else [self.local if self.copies is None else self.copies],
            gamma=lambda checked: self.consensus,
        )
        if self.outer_copies is not None:  # every H-th step: the pseudo-gradients travel
            self.run.outer_steps(self.t - 1, [self.outer_copies])

    def save(self, prefix: Union[str, Path], extra: Optional[dict] = None) -> Path:
        """Each rank writes its own row and state to ``<prefix>.rank<r>.npz``: first beside it,
        then, once every rank has written, in its place. A save that fails on one rank (a full
        disk) leaves every rank's previous checkpoint as it was, so the set never mixes steps."""
        extra = {
            "world_size": self.size,
            "topology": self.topology.name,
            "order": self.order,
            "consensus": self.consensus,
            **gossip_of(self.compression, self.seed, self.outer),
            **(extra or {}),
        }
        arrays = {} if self.copies is None else {"public": self.copies.rows}
        if self.outer_copies is not None:
            arrays = dict(self.outer_copies.buffers)
        return self.run.save(prefix, lambda pending: self.local.save(pending, extra=extra, arrays=arrays))

    @classmethod
    def _resume(
        cls, prefix: Union[str, Path], comm: Communicator, topology: decentral.Topology, like: Any, target: Any
    ) -> tuple[decentral.DecentralizedAdamW, dict]:
        """This rank's state read from ``<prefix>.rank<r>.npz`` (agreed by every rank), and the
        options to make the worker with."""

        def read(path: Path) -> decentral.DecentralizedAdamW:
            local = decentral.DecentralizedAdamW.load(path, like=like, target=target)
            meta = local.extra
            if meta.get("world_size") != comm.size or meta.get("topology") != topology.name:
                raise ValueError(
                    f"checkpoint is from {meta.get('world_size')} ranks with topology "
                    f"{meta.get('topology')!r}; this run has {comm.size} ranks and {topology.name!r}"
                )
            return local

        # the order is the file's: a run of either order resumes (checked against the others' by the settings)
        local = resume(comm, prefix, read)
        meta = local.extra
        return local, dict(topology=topology, order=meta["order"], consensus=meta["consensus"], **gossip_in(meta))

    @classmethod
    def _resumed(
        cls,
        prefix: Union[str, Path],
        communicator: Communicator,
        topology: decentral.Topology,
        like: Any,
        target: Any,
        **backend: Any,
    ) -> Any:
        """What each backend's ``load`` is: this rank's file read over ``communicator``, the worker made
        with the saved options and the ``backend``'s own keywords, continuing from the state."""
        local, options = cls._resume(prefix, communicator, topology, like, target)
        worker = cls(local.params.reshape(-1), target=target, **backend, **options)
        worker.local = local
        worker._check_settings()
        if worker.outer is not None:
            worker.outer_copies = worker._outer_copies(local.arrays)
        elif worker.compression is not None:
            worker.copies = worker._public_copies(local.arrays.get("public"))
        return worker


def fingerprint(topology: decentral.Topology, size: int) -> str:
    """The topology's name and a digest of its W_0 for ``size`` ranks (a user matrix may differ by rank)."""
    return f"{topology.name} (W_0 {digest(np.asarray(topology.matrix(size, 0), np.float64))})"


def digest(array: Optional[np.ndarray]) -> Optional[str]:
    return None if array is None else hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:12]


def check_same(comm: Communicator, settings: dict[str, Any]) -> None:
    """A ValueError on every rank, naming the settings that differ and each rank's value, unless
    every rank passed the same ``settings``."""
    gathered = comm.allgather(settings)
    differing = [name for name in gathered[0] if len({repr(each.get(name)) for each in gathered}) > 1]
    if differing:
        described = "; ".join(
            f"{name}: " + ", ".join(f"rank {rank} {each.get(name)!r}" for rank, each in enumerate(gathered))
            for name in differing
        )
        raise ValueError(f"every rank must run with the same settings; they differ in {described}")


def mix(
    comm: Communicator, topology: decentral.Topology, t: int, gamma: float, local: decentral.DecentralizedAdamW
) -> None:
    """This rank's parameters x_i (``local``'s one worker) ← Σ_j W_ij x_j with step t's W and
    consensus strength γ, through ``comm``: in their dtype, in the order of the in-process
    kernel, so that one-peer steps equal it bit for bit; on the host, or on the GPU where the
    communicator keeps the rows there (``comm.local``)."""
    if comm.size == 1 and topology.kind != "dense":  # W = [[1]]: nothing to exchange or compute
        return
    row, dtype = local.params.reshape(-1), local.dtype
    own = comm.local(row)  # the same operations on either side: NumPy's and torch's elementwise ones round alike
    if topology.kind == "peer":
        peers = np.asarray(topology.peers(comm.size, t))
        source, destination = int(peers[comm.rank]), int(np.flatnonzero(peers == comm.rank)[0])
        received = comm.exchange(row, destination, source)
        mixed = own * dtype.type(1 - gamma / 2) + received * dtype.type(gamma / 2)
    elif topology.kind == "complete":
        mean = comm.sum(row) * dtype.type(1 / comm.size)
        mixed = mean * dtype.type(gamma) + own * dtype.type(1 - gamma)
    else:
        weights = gamma * topology.matrix(comm.size, t) + (1 - gamma) * np.eye(comm.size)
        # rows of the ranks we read from (non-zeros of our row of W_t), our row to the ranks
        # that read from us (non-zeros of our column): point to point, only where W_t is non-zero
        sources = [int(j) for j in np.flatnonzero(weights[comm.rank]) if j != comm.rank]
        destinations = [int(k) for k in np.flatnonzero(weights[:, comm.rank]) if k != comm.rank]
        rows = comm.neighbours(row, sources, destinations, t % 32768)
        mixed = _arrays.zeros_like(own, row.shape[0], dtype)
        for j in map(int, np.flatnonzero(weights[comm.rank])):
            mixed += (rows[j] if j != comm.rank else own) * dtype.type(weights[comm.rank, j])
    dispatch.copy_into(row, mixed)


def hyperparameters(optimizer: decentral.DecentralizedAdamW) -> dict[str, Any]:
    """``optimizer``'s AdamW hyper-parameters and decay mask (on the host; None for none), as
    its constructor takes them: what a rank's file, a joined run and the settings check share."""
    mask = None if np.ndim(optimizer.decay) == 0 else dispatch.host_array(optimizer.decay)
    return dict(
        lr=optimizer.lr,
        betas=tuple(optimizer.betas),
        eps=optimizer.eps,
        weight_decay=optimizer.weight_decay,
        max_norm=optimizer.max_norm,
        decay_mask=mask,
    )


_RUN_KEYS = ("world_size", "topology", "order", "consensus", "compression", "seed", "outer")  # a rank file's


def gossip_of(
    compression: Optional[compress.Compressor], seed: int, outer: Optional[decentral.DiLoCo] = None
) -> dict[str, Any]:
    """What a rank's file records of compressed gossip and outer steps (nothing without them)."""
    recorded: dict[str, Any] = {} if compression is None else {"compression": dataclasses.asdict(compression)}
    if outer is not None:
        recorded["outer"] = dataclasses.asdict(outer)
    return {**recorded, "seed": seed} if recorded else {}


def gossip_in(meta: dict[str, Any]) -> dict[str, Any]:
    """The compression, outer steps and seed a rank's file recorded, as RankAdamW takes them."""
    options: dict[str, Any] = {}
    if meta.get("compression") is not None:
        options["compression"] = compress.Compressor(**meta["compression"])
    if meta.get("outer") is not None:
        options["outer"] = decentral.DiLoCo(**meta["outer"])
    return {**options, "seed": meta["seed"]} if options else {}


def join_checkpoint(
    prefix: Union[str, Path], *, topology: Optional[decentral.Topology] = None, like: Any = None
) -> decentral.DecentralizedAdamW:
    """The files ``<prefix>.rank<r>.npz`` of one save by N ranks (MPI or torch.distributed) as
    one in-process optimizer with N workers, which continues the run bit for bit. A topology
    that changes with t is saved by name only: pass it as ``topology``."""
    files, run = rank_files(prefix, lambda local: local.extra)
    whole = joined(files, run, topology, like)
    whole.extra = {key: value for key, value in files[0].extra.items() if key not in _RUN_KEYS}
    return whole


def split_checkpoint(optimizer: decentral.DecentralizedAdamW, prefix: Union[str, Path]) -> list[Path]:
    """Write an in-process optimizer's N workers as the files ``<prefix>.rank<r>.npz`` that N
    ranks resume from (``MPIAdamW.load``, ``DistributedAdamW.load``), continuing bit for bit;
    with compressed gossip, each rank's file holds the public copies it keeps."""
    public = None if optimizer.public is None else dispatch.host_array(optimizer.public)
    outer = {name: dispatch.host_array(optimizer.buffers[name]) for name in OUTER_BUFFERS if name in optimizer.buffers}
    sources = None if public is None else decentral.readers(optimizer.topology, optimizer.workers)
    paths = []
    for rank, local in enumerate(each_rank(optimizer)):
        path = checkpoint_file(prefix, rank)
        arrays = {}
        if public is not None and sources is not None:  # its own x̂, then those of the ranks it reads from
            arrays["public"] = public[[rank, *np.flatnonzero(sources[rank])]]
        arrays.update({name: rows[rank : rank + 1] for name, rows in outer.items()})
        local.save(path, extra={**run_of(optimizer), **optimizer.extra}, arrays=arrays)
        paths.append(path)
    return paths


def run_of(optimizer: decentral.DecentralizedAdamW) -> dict[str, Any]:
    """What a rank's file records of an in-process optimizer's run besides its own state."""
    return {
        "world_size": optimizer.workers,
        "topology": optimizer.topology.name,
        "order": optimizer.order,
        "consensus": optimizer.consensus,
        **gossip_of(optimizer.compression, optimizer.seed, optimizer.outer),
    }


def rank_files(
    prefix: Union[str, Path], run_in: Callable[[decentral.DecentralizedAdamW], Any]
) -> tuple[list[decentral.DecentralizedAdamW], dict[str, Any]]:
    """The files ``<prefix>.rank<r>.npz`` of one save, in rank order, and the run they record
    (``run_in`` finds it in a file's extra)."""
    first = decentral.DecentralizedAdamW.load(checkpoint_file(prefix, 0))
    run = run_in(first)
    size = run.get("world_size") if isinstance(run, dict) else None
    if not isinstance(size, int):
        raise ValueError(f"{prefix}.rank0.npz is not a rank's checkpoint (no world size in it)")
    files = [first] + [decentral.DecentralizedAdamW.load(checkpoint_file(prefix, rank)) for rank in range(1, size)]
    described = {
        (local.t, local.width, str(local.dtype), *(repr((run_in(local) or {}).get(key)) for key in _RUN_KEYS))
        for local in files
    }
    if len(described) > 1:
        raise ValueError(f"the files {prefix}.rank*.npz are not of one save (their steps, rows or runs differ)")
    return files, {key: run.get(key) for key in _RUN_KEYS}


def joined(
    files: list[decentral.DecentralizedAdamW], run: dict[str, Any], topology: Optional[decentral.Topology], like: Any
) -> decentral.DecentralizedAdamW:
    """The ranks' workers ``files`` as one in-process optimizer of the ``run``."""
    if topology is None:
        if run["topology"] not in decentral.TOPOLOGIES:
            raise ValueError(f"the run used the topology {run['topology']!r}; pass it as topology=")
        topology = decentral.TOPOLOGIES[run["topology"]]()
    else:
        decentral.check_is_topology(topology)
        if topology.name != run["topology"]:
            raise ValueError(f"the run used the topology {run['topology']!r}, not {topology.name!r}")
    host = {
        name: np.concatenate([dispatch.host_array(getattr(local, name)) for local in files])
        for name in ("params", "exp_avg", "exp_avg_sq")
    }
    gossip = gossip_in(run)
    outer = {}
    if "outer" in gossip:  # each rank's [1, D] rows of the outer state
        outer = {name: np.concatenate([local.arrays[name] for local in files]) for name in OUTER_BUFFERS}
    elif gossip:  # each rank's own public copy is row 0 of what it keeps
        host["public"] = np.stack([local.arrays["public"][0] for local in files])
    joined = decentral.DecentralizedAdamW(
        dispatch.as_like(host["params"], like),
        topology=topology,
        order=run["order"],
        consensus=run["consensus"],
        **hyperparameters(files[0]),
        **gossip,
        **({"public": dispatch.as_like(host["public"], like)} if "public" in host else {}),
    )
    dispatch.copy_into(joined.exp_avg, host["exp_avg"])
    dispatch.copy_into(joined.exp_avg_sq, host["exp_avg_sq"])
    for name, rows in outer.items():
        dispatch.copy_into(joined.buffers[name], rows)
    joined.bytes_sent = np.concatenate([local.bytes_sent for local in files])
    joined.t = files[0].t
    return joined


def each_rank(optimizer: decentral.DecentralizedAdamW) -> Iterator[decentral.DecentralizedAdamW]:
    """Each worker of an in-process optimizer as a rank's own worker (on the host)."""
    rows = {name: dispatch.host_array(getattr(optimizer, name)) for name in ("params", "exp_avg", "exp_avg_sq")}
    options = hyperparameters(optimizer)
    for rank in range(optimizer.workers):
        local = decentral.DecentralizedAdamW(
            rows["params"][rank : rank + 1].copy(),
            topology=decentral.one_peer_exponential(),  # as a rank's own worker: it mixes nothing itself
            order="awc",
            consensus=1.0,
            **options,
            exp_avg=rows["exp_avg"][rank : rank + 1].copy(),
            exp_avg_sq=rows["exp_avg_sq"][rank : rank + 1].copy(),
        )
        local.t = optimizer.t
        local.bytes_sent = optimizer.bytes_sent[rank : rank + 1].copy()
        yield local
