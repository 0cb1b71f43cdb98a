"""Decentralized training with one worker per torch.distributed rank, launched by ``torchrun``:
gloo on CPUs, NCCL on GPUs. [`DistributedTrainer`][steadystep.torch.distributed.DistributedTrainer]
trains a torch module (the in-process [`DecentralizedTrainer`][steadystep.torch.decentral.DecentralizedTrainer]
with N = the world size);
[`DistributedAdamW`][steadystep.torch.distributed.DistributedAdamW] steps a flat [D] row per rank.

    torchrun --nproc-per-node 4 train.py

    import torch.distributed as dist
    from steadystep import decentral
    from steadystep.torch.distributed import DistributedAdamW

    dist.init_process_group("gloo")
    workers = DistributedAdamW(row, topology=decentral.one_peer_exponential(), lr=1e-3, max_norm=1.0)
    workers.step(grad_row)
    dist.destroy_process_group()  # before the script ends: gloo's threads running at exit abort it

Both are [`RankAdamW`][steadystep.decentral.ranked.RankAdamW]'s protocol over torch.distributed, the same as
[`steadystep.mpi.MPIAdamW`][steadystep.decentral.mpi.MPIAdamW] over MPI: a one-peer topology exchanges one row with
``batch_isend_irecv``, complete averaging sums the rows with ``all_reduce``, a user matrix
exchanges rows point to point only where W_t has non-zeros; one-peer steps equal the
in-process step bit for bit, complete averaging within the rounding of the sum. Host rows
(NumPy arrays, CPU tensors) travel as host tensors over gloo. GPU rows (CUDA tensors, Numba or
CuPy device arrays) travel zero-copy over NCCL, and are mixed on the GPU: one GPU per rank,
made current before any GPU work (``torch.cuda.set_device(local_rank())``), and a process
group with both, ``init_process_group("cpu:gloo,cuda:nccl")`` (the settings check and the
small exchanges are host objects). Over gloo alone, GPU rows go through the host.
"""

from __future__ import annotations

import atexit
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from steadystep import decentral, dispatch
from steadystep.cpu.threads import share_cores
from steadystep.decentral import ranked
from steadystep.decentral import TokenSchedule
from steadystep.decentral.communication import ring_all_reduce
from steadystep.decentral.outer_copies import OUTER_BUFFERS, OuterCopies
from steadystep.decentral.public_copies import PublicCopies
from steadystep.decentral.ranked import RankAdamW, RankedRun, RankError
from steadystep.torch._batches import map_tensors, tensors_in
from steadystep.torch.decentral import FORMAT, DecentralizedTrainer, StepResult, cross_entropy

__all__ = [
    "DistributedAdamW",
    "DistributedTrainer",
    "GroupCommunicator",
    "RankError",
    "join_trainer_checkpoint",
    "local_rank",
    "split_trainer_checkpoint",
]


class DistributedAdamW(RankAdamW):
    """This rank's worker of a decentralized AdamW run over the process ``group`` (default:
    the world, which ``torch.distributed.init_process_group`` must have made).

    ``params`` is this rank's [D] row (a NumPy array or a torch tensor), trained in place. The
    rest is [`RankAdamW`][steadystep.decentral.ranked.RankAdamW]'s: every rank checks that all agree on the
    rows, topology, order and hyper-parameters; a failure or a non-finite gradient on one
    rank stops every rank with nothing written.
    """

    def __init__(self, params: Any, *, group: Any = None, **options: Any):
        # options: RankAdamW's (topology, order, lr, betas, eps, weight_decay, max_norm,
        # decay_mask, consensus, target)
        super().__init__(params, comm=GroupCommunicator(group), **options)

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
        """Resume this rank from ``<prefix>.rank<r>.npz`` (as
        [`steadystep.mpi.MPIAdamW.load()`][steadystep.decentral.mpi.MPIAdamW.load],
        whose files these are too: a run may move between the two backends)."""
        return cls._resumed(prefix, GroupCommunicator(group), topology, like, target, group=group)


class DistributedTrainer:
    """This rank's worker of a [`DecentralizedTrainer`][steadystep.torch.decentral.DecentralizedTrainer] run
    with one worker per rank of the process ``group`` (default: the world): N is the world size.

    Each rank holds its own ``module`` and steps it on its own batches; as the workers of the
    in-process trainer start from one template, every rank starts from rank 0's parameters and
    buffers (broadcast here, as DistributedDataParallel does), and ``module`` itself is never
    changed. Per step each rank runs its forward and backward pass, clips by the norm of its
    whole model, mixes its rows with its peers' over ``topology`` (AWC: before its AdamW
    update, ATC: after) and applies AdamW with the kernel of the in-process step: one-peer
    topologies equal the in-process trainer bit for bit, complete averaging within the
    rounding of the sum. The options are the in-process trainer's (``lr`` a number, a function
    of the step or a TokenSchedule; ``consensus`` γ or an AdaptiveConsensus; ``groups``,
    ``decay``, ...), and every rank checks that all ranks passed the same ones, and the same
    module (parameter names, shapes, dtype).

    Every call is collective: every rank must make it, in the same order. A bad batch or a
    non-finite loss or gradient on any rank stops every rank with nothing written anywhere
    (the error names the ranks). [`gather()`][steadystep.torch.distributed.DistributedTrainer.gather] gives the
    in-process trainer this run is, for evaluation
    ([`hvp()`][steadystep.torch.decentral.DecentralizedTrainer.hvp], ...).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        topology: decentral.Topology,
        order: str = "awc",
        group: Any = None,
        **options: Any,
    ):
        # options: DecentralizedTrainer's (lr, betas, eps, weight_decay, max_norm, consensus,
        # total_steps, decay, groups, vmap, target, compression, seed, outer)
        # one worker a rank, vmapped as the in-process trainer's N are (the two then agree bit
        # for bit), as is the trainer gather() builds
        options.setdefault("vmap", True)
        self.compression, self.outer = options.get("compression"), options.get("outer")
        self.seed = options.get("seed", 0)
        self.comm = GroupCommunicator(group)
        self.rank, self.size = self.comm.rank, self.comm.size
        self.topology, self.order, self._options = topology, order, options
        self.run = RankedRun(self.comm, topology, order)

        def set_up() -> tuple[DecentralizedTrainer, dict]:
            decentral.check_topology(topology, self.size)
            # one worker, mixing nothing itself: the ranks mix through the communicator (and
            # keep the public copies or outer state of compressed gossip and outer steps)
            own = {name: value for name, value in options.items() if name not in ("compression", "outer")}
            local = DecentralizedTrainer(module, 1, topology=decentral.one_peer_exponential(), **own)
            gamma = local.consensus if isinstance(local.consensus, float | int) else 1.0
            decentral.check_mixing(topology, order, gamma)
            if self.compression is not None or self.outer is not None:
                # the in-process trainer's own checks of these options, on one worker
                DecentralizedTrainer(module, 1, topology=decentral.complete(), **options)
            if self.compression is not None and self.outer is None:
                decentral.readers(topology, self.size)
            return local, self._settings(local)

        self.local, settings = self.run.agree("creating the trainer", set_up)
        self.run.check_same(settings)
        self._share_initial_state()
        self.copies = self._copies(None)
        for copies in self.copies:
            copies.start(self.comm)

    def _copies(self, saved: Optional[decentral.DecentralizedAdamW]) -> list[Any]:
        """Each class's public copies (compressed gossip) or outer state (outer steps), from the
        ``saved`` rank file or to start; [] for dense gossip."""
        if self.compression is None and self.outer is None:
            return []

        def made() -> list[Any]:
            copies: list[
                Union[OuterCopies, PublicCopies]
            ] = []  # each class draws with its own seed, as in process (the local optimizers have it)
            for index, optimizer in enumerate(self.local.optimizers):
                if self.outer is not None:
                    state = (
                        None if saved is None else {n: saved.arrays[f"rank/class{index}/{n}"] for n in OUTER_BUFFERS}
                    )
                    copies.append(
                        OuterCopies(
                            self.outer,
                            self.compression,
                            optimizer.seed,
                            self.topology,
                            self.rank,
                            self.size,
                            optimizer,
                            state,
                        )
                    )
                else:
                    rows = None if saved is None else saved.arrays[f"rank/class{index}/public"]
                    assert self.compression is not None
                    copies.append(
                        PublicCopies(
                            self.compression, optimizer.seed, self.topology, self.rank, self.size, optimizer, rows
                        )
                    )
            return copies

        return self.run.agree("keeping the public copies" if self.outer is None else "keeping the outer state", made)

    def _settings(self, local: DecentralizedTrainer) -> dict[str, Any]:
        """What every rank must agree on: otherwise the ranks train different problems without a word."""
        first = local.optimizers[0]
        lr = local.lr
        return {
            "topology": ranked.fingerprint(self.topology, self.size),
            "order": self.order,
            "consensus": repr(local.consensus),
            "lr": repr(lr)
            if not callable(lr) or isinstance(lr, TokenSchedule)
            else f"{local.learning_rate()!r} at t=0",
            "total_steps": local.total_steps,
            "betas": tuple(first.betas),
            "eps": first.eps,
            "max_norm": first.max_norm,
            "parameters": {**local.description(), "dtype": str(local.dtype), "device": local.device.type},
            "decay_masks": [
                ranked.digest(ranked.hyperparameters(optimizer)["decay_mask"]) for optimizer in local.optimizers
            ],
            "compression": None if self.compression is None else self.compression.name,
            "seed": self.seed,
            "outer": repr(self.outer),
        }

    def _share_initial_state(self) -> None:
        """Rank 0's parameters, buffers and frozen parameters on every rank."""
        local = self.local
        with torch.no_grad():
            for optimizer, rows in zip(local.optimizers, local.rows):
                dispatch.copy_into(optimizer.params, self.comm.broadcast(dispatch.host_array(rows), 0))
            for stacked in local.buffers.values():
                stacked.copy_(torch.from_numpy(self.comm.broadcast(dispatch.host_array(stacked), 0)))
            local.frozen = {
                name: torch.from_numpy(self.comm.broadcast(dispatch.host_array(tensor), 0)).to(tensor.device)
                for name, tensor in local.frozen.items()
            }

    def __repr__(self) -> str:
        return (
            f"DistributedTrainer(rank {self.rank} of {self.size}: {self.local!r}, topology={self.topology.name}, "
            f"order={self.order!r})".replace("1 workers × ", "")
        )

    @property
    def t(self) -> int:
        """Steps taken (the zero-based index of the next one)."""
        return self.local.t

    @property
    def module(self) -> torch.nn.Module:
        """The template this rank was built from (never changed)."""
        return self.local.module

    @property
    def params(self) -> torch.Tensor:
        """This rank's parameters as one packed [D] row (a view when there is one class of
        hyper-parameters, a copy otherwise)."""
        return self.local.params[0]

    def learning_rate(self, step: Optional[int] = None) -> float:
        """The learning rate of ``step`` (default: the next one)."""
        return self.local.learning_rate(step)

    def consensus_strength(self, step: Optional[int] = None) -> float:
        """γ of ``step`` (default: the next one)."""
        return self.local.consensus_strength(step)

    def step(
        self, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy
    ) -> StepResult:
        """One step of this rank on its own batch (``inputs`` a tensor or a tuple of them,
        ``targets`` any structure of tensors, no worker axis), mixed with its peers. Returns
        this rank's loss and gradient norm before clipping (0-d tensors). Raises
        NonFiniteGradientError on every rank, naming the ranks, if any rank's loss or
        gradient is not finite, and a rank's bad batch raises there and a RankError on the
        others: nothing is written on any rank."""

        def prepare() -> Any:
            if not tensors_in(inputs) or not tensors_in(targets):
                raise TypeError("inputs and targets must hold this rank's batch as tensors (no worker axis)")
            one = lambda tensor: tensor.unsqueeze(0)  # noqa: E731  (a worker axis of one)
            return self.local.prepare(map_tensors(one, inputs), map_tensors(one, targets), loss_fn)

        t = self.t
        if self.outer is not None:  # local steps: the ranks talk only in the outer step
            rows: Callable[[], list] = lambda: []  # noqa: E731
        else:
            rows = lambda: self.copies or self.local.optimizers  # noqa: E731
        result = self.run.step(t, prepare, self.local.apply, rows=rows, gamma=lambda prepared: prepared.gamma)
        if self.outer is not None:
            self.run.outer_steps(t, self.copies)
        return StepResult(result.losses[0], result.grad_norms[0])

    # evaluation ---------------------------------------------------------------------------------------

    def worker_model(self, into: Optional[torch.nn.Module] = None) -> torch.nn.Module:
        """A module holding this rank's parameters and buffers (a copy of the template, or ``into``)."""
        return self.local.worker_model(0, into)

    def mean_model(self, into: Optional[torch.nn.Module] = None) -> torch.nn.Module:
        """A module holding x̄ = mean_i x_i over the ranks (summed in float64) and the mean
        floating buffers (integer ones: rank 0's), on every rank; collective."""
        means = {id(rows): self._mean(rows) for rows in self.local.rows}
        buffers = {
            id(stacked): self._mean(stacked).to(stacked.dtype)
            if stacked.is_floating_point()
            else torch.from_numpy(self.comm.broadcast(dispatch.host_array(stacked), 0)).to(stacked.device)[0]
            for stacked in self.local.buffers.values()
        }
        return self.local.load_into(into, lambda rows: means[id(rows)], lambda stacked: buffers[id(stacked)])

    def _mean(self, stacked: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of this rank's [1, ...] ``stacked``, in float64, on its device."""
        total = self.comm.sum(dispatch.host_array(stacked).astype(np.float64))
        return torch.from_numpy(total / self.size).to(stacked.device).view(stacked.shape[1:])

    def consensus_distance(self) -> float:
        """mean_i ‖x_i − x̄‖² over all trainable parameters and ranks, in float64; collective."""
        own = sum(float(((rows[0].to(torch.float64) - self._mean(rows)) ** 2).sum()) for rows in self.local.rows)
        return math.fsum(self.comm.allgather(own)) / self.size  # exactly summed: no order to agree on

    def gather(self, into: Optional[DecentralizedTrainer] = None, *, moments: bool = True) -> DecentralizedTrainer:
        """The run as the in-process trainer with N workers: every rank's parameters, moments
        and buffers (worker i is rank i), its step count and options, on every rank (N times
        this rank's memory); ``into`` (an earlier result) is filled in place. ``moments=False``
        leaves the moments out (zeros in a new trainer): enough to evaluate, a third of the
        traffic. Collective."""
        whole = into
        if whole is None:
            whole = DecentralizedTrainer(
                self.module, self.size, topology=self.topology, order=self.order, **self._options
            )
        elif whole.workers != self.size or whole.description()["classes"] != self.local.description()["classes"]:
            raise ValueError(f"into must be a trainer that gather() made for this run ({self.size} workers)")
        for mine, theirs in zip(self.local.optimizers, whole.optimizers):
            for name in ("params", "exp_avg", "exp_avg_sq") if moments else ("params",):
                rows = np.concatenate(self.comm.allgather(dispatch.host_array(getattr(mine, name))))
                dispatch.copy_into(getattr(theirs, name), rows)
            theirs.t, theirs.consensus = mine.t, mine.consensus
            theirs.bytes_sent = np.concatenate(self.comm.allgather(mine.bytes_sent))
        for copies, theirs in zip(self.copies, whole.optimizers):  # each rank's own public copy, or outer state
            owned = {"public": copies.rows[:1]} if isinstance(copies, PublicCopies) else copies.buffers
            for name, rows in owned.items():
                dispatch.copy_into(theirs.buffers[name], np.concatenate(self.comm.allgather(dispatch.host_array(rows))))
        for name, stacked in self.local.buffers.items():
            whole.buffers[name].copy_(
                torch.from_numpy(np.concatenate(self.comm.allgather(dispatch.host_array(stacked))))
            )
        whole.frozen = self.local.frozen
        return whole

    # save and resume ----------------------------------------------------------------------------------

    def save(self, prefix: Union[str, Path], extra: Optional[dict] = None) -> Path:
        """Each rank writes its state to ``<prefix>.rank<r>.npz``, first beside it and, once
        every rank has written, in its place: a save that fails on one rank leaves every rank's
        previous file, so the set never mixes steps.
        [`load()`][steadystep.torch.distributed.DistributedTrainer.load] continues bit for bit;
        [`join_trainer_checkpoint()`][steadystep.torch.distributed.join_trainer_checkpoint] makes the in-process
        trainer's file of the set."""
        run = {
            "world_size": self.size,
            "rank": self.rank,
            "topology": self.topology.name,
            "order": self.order,
            "consensus": float(self.local.optimizers[0].consensus),
        }
        arrays: dict[str, Any] = {}
        for index, copies in enumerate(self.copies):
            owned = {"public": copies.rows} if isinstance(copies, PublicCopies) else copies.buffers
            arrays |= {f"class{index}/{name}": rows for name, rows in owned.items()}
        return self.run.save(prefix, lambda pending: self.local.save_with_run(pending, extra, run=run, arrays=arrays))

    def load(self, prefix: Union[str, Path]) -> dict:
        """Continue from the files [`save()`][steadystep.torch.distributed.DistributedTrainer.save] wrote (or
        [`split_trainer_checkpoint()`][steadystep.torch.distributed.split_trainer_checkpoint]),
        for the same module, options and world size; a file missing or different on any rank
        stops every rank with nothing changed. Returns the ``extra`` saved with them."""

        def read(path: Path) -> decentral.DecentralizedAdamW:
            saved = self.local.read_checkpoint(path, rank_file=True)
            run = saved.extra["run"]
            mine = (self.size, self.rank, self.topology.name, self.order)
            theirs = (run["world_size"], run["rank"], run["topology"], run["order"])
            if theirs != mine:
                raise ValueError(
                    f"{path} is rank {theirs[1]}'s of {theirs[0]} ranks with topology {theirs[2]!r} and order "
                    f"{theirs[3]!r}; this is rank {mine[1]} of {mine[0]} with {mine[2]!r} and {mine[3]!r}"
                )
            return saved

        saved = self.run.resume(prefix, read)
        copies = self._copies(saved)  # checked before anything changes
        self.local.restore(saved)
        self.copies = copies
        return saved.extra["extra"]


_NOT_MOVED = (
    "a trainer's run with compression or outer steps cannot move between one process and ranks yet; "
    "resume it where it was saved"
)


def join_trainer_checkpoint(
    prefix: Union[str, Path], path: Union[str, Path], *, topology: Optional[decentral.Topology] = None
) -> Path:
    """Write the files ``<prefix>.rank<r>.npz`` of one
    [`DistributedTrainer.save()`][steadystep.torch.distributed.DistributedTrainer.save] by N
    ranks as one file at ``path`` that the in-process trainer with N workers loads
    ([`DecentralizedTrainer.load()`][steadystep.torch.decentral.DecentralizedTrainer.load]),
    continuing the run bit for bit. A topology that changes with t is saved by name only: pass
    it as ``topology``."""
    files, run = ranked.rank_files(prefix, lambda local: local.extra.get("run"))
    first = files[0]
    if (
        first.extra.get("format") != FORMAT
        or len({repr(local.extra["trainer"]) for local in files}) > 1
        or [local.extra["run"].get("rank") for local in files] != list(range(len(files)))
    ):
        raise ValueError(f"the files {prefix}.rank*.npz are not one save of a DistributedTrainer's ranks")
    if any(name.startswith("rank/") for name in first.arrays):
        raise ValueError(_NOT_MOVED)
    joined = ranked.joined(files, run, topology, like=None)
    arrays = {name: np.concatenate([local.arrays[name] for local in files]) for name in first.arrays}
    trainer = {**first.extra["trainer"], "workers": run["world_size"]}
    meta = {"format": FORMAT, "trainer": trainer, "extra": first.extra["extra"], "vmap": first.extra.get("vmap")}
    joined.save(path, extra=meta, arrays=arrays)
    return Path(path)


def split_trainer_checkpoint(
    path: Union[str, Path], prefix: Union[str, Path], *, topology: Optional[decentral.Topology] = None
) -> list[Path]:
    """Write the file of an in-process trainer with N workers
    ([`DecentralizedTrainer.save()`][steadystep.torch.decentral.DecentralizedTrainer.save])
    as the files ``<prefix>.rank<r>.npz`` that N ranks of
    [`DistributedTrainer`][steadystep.torch.distributed.DistributedTrainer] load,
    continuing the run bit for bit."""
    whole = decentral.DecentralizedAdamW.load(path, topology=topology)
    if whole.extra.get("format") != FORMAT or "run" in whole.extra:
        raise ValueError(f"{path} is not the checkpoint of an in-process DecentralizedTrainer")
    if whole.compression is not None or whole.outer is not None:
        raise ValueError(_NOT_MOVED)
    paths = []
    for rank, local in enumerate(ranked.each_rank(whole)):
        extra = {
            "format": FORMAT,
            "trainer": {**whole.extra["trainer"], "workers": 1},
            "extra": whole.extra["extra"],
            "vmap": whole.extra.get("vmap"),
            "run": {**ranked.run_of(whole), "rank": rank},
        }
        arrays = {name: value[rank : rank + 1] for name, value in whole.arrays.items()}
        paths.append(ranked.checkpoint_file(prefix, rank))
        local.save(paths[-1], extra=extra, arrays=arrays)
    return paths


class GroupCommunicator:
    """steadystep.decentral.ranked's Communicator over a torch.distributed process group (None:
    the default group), what `DistributedAdamW` and `DistributedTrainer` talk through. A GPU row
    (a CUDA tensor, or a Numba or CuPy device array) in a group with NCCL travels as a CUDA
    tensor over the same memory, and what comes back (and the mixing) stays on the GPU;
    everything else travels as host tensors, which need a CPU backend (gloo) beside NCCL."""

    def __init__(self, group: Any):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group('gloo') "
                "(CPU) first, in a process torchrun started"
            )
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.ranks = [dist.get_global_rank(group, rank) for rank in range(self.size)] if group is not None else None
        backend = str(dist.get_backend(group)).lower()
        self.nccl = "nccl" in backend
        self.cpu = not self.nccl or "gloo" in backend or "mpi" in backend  # host tensors have a backend
        self.bytes_sent = 0.0
        share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # torchrun's ranks on this machine
        atexit.unregister(_let_gloo_threads_finish)  # registered once, however many communicators
        atexit.register(_let_gloo_threads_finish)

    def _global(self, rank: int) -> int:
        """A rank of the group as the point-to-point calls name it (the world's numbering)."""
        return rank if self.ranks is None else self.ranks[rank]

    def on_gpu(self, row: Any) -> bool:
        """Whether ``row`` travels from GPU memory: a GPU row in a group with NCCL."""
        if not self.nccl:
            return False
        return row.is_cuda if isinstance(row, torch.Tensor) else hasattr(row, "__cuda_array_interface__")

    def carried(self, row: Any, gpu: bool) -> torch.Tensor:
        """``row`` as a flat tensor the group can send (not to write into): the GPU row itself,
        zero-copy, once the kernels that wrote it have finished; otherwise the host row (moved
        to the GPU for a group with NCCL alone)."""
        if gpu:
            torch.cuda.synchronize()  # Numba's kernels run on their own stream
            return torch.as_tensor(row, device="cuda").reshape(-1)
        host = torch.from_numpy(np.ascontiguousarray(dispatch.host_array(row)).reshape(-1))  # row's memory if it can
        return host if self.cpu else host.to(torch.device("cuda", torch.cuda.current_device()))

    def local(self, row: Any) -> Any:
        return self.carried(row, True) if self.on_gpu(row) else dispatch.host_array(row).reshape(-1)

    def allgather(self, value: Any) -> list:
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def exchange(self, row: Any, destination: int, source: int) -> Any:
        return self.neighbours(row, [source], [destination], 0)[source]

    def sum(self, row: Any) -> Any:
        gpu = self.on_gpu(row)
        total = self.carried(row, gpu).clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        self.bytes_sent += ring_all_reduce(self.size) * total.numel() * total.element_size()
        return total if gpu else total.cpu().numpy()

    def neighbours(self, row: Any, sources: list[int], destinations: list[int], tag: int) -> dict[int, Any]:
        gpu = self.on_gpu(row)
        outgoing = self.carried(row, gpu)
        received = {j: torch.empty_like(outgoing) for j in sources}
        operations = [dist.P2POp(dist.irecv, received[j], self._global(j), self.group, tag) for j in sources]
        operations += [dist.P2POp(dist.isend, outgoing, self._global(k), self.group, tag) for k in destinations]
        if operations:
            for request in dist.batch_isend_irecv(operations):
                request.wait()
        self.bytes_sent += len(destinations) * outgoing.numel() * outgoing.element_size()
        return {j: tensor if gpu else tensor.cpu().numpy() for j, tensor in received.items()}

    def broadcast(self, row: np.ndarray, root: int) -> np.ndarray:
        value = self.carried(row, False).clone()
        dist.broadcast(value, src=self._global(root), group=self.group)
        return value.cpu().numpy().reshape(np.shape(row))


def _let_gloo_threads_finish() -> None:
    """At exit: gloo's worker threads release a finished collective's tensors a moment after the
    caller resumes, and take the GIL to do it. A process that ends within that moment (Python
    hands the GIL over every 5 ms) finalizes the interpreter under them, and a thread that then
    asks for the GIL aborts the process ("terminate called without an active exception"), even
    after ``destroy_process_group()``. Releasing the GIL for a while lets them finish first."""
    time.sleep(0.05)


def local_rank() -> int:
    """This rank's place among the ranks of its machine (torchrun's ``LOCAL_RANK``; 0 without
    it). With one rank per GPU, make that GPU current before any GPU work
    (``torch.cuda.set_device(local_rank())``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))
