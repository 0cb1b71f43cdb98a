"""Decentralized training of any ``torch.nn.Module``: N workers as the rows of one [N, D] tensor.

The trainer packs the template module's trainable parameters into an [N, D] arena (each
tensor padded to 64 elements, every worker starting from the template's weights), keeps
the AdamW moments beside it, and per step

1. runs all N workers' forward and backward passes at once: ``torch.func.vmap`` over
   ``grad(functional_call(module, worker i's parameters, batch i))``;
2. writes the N gradients into one [N, D] tensor (the loss function normalises each
   worker's loss by its own valid targets: [`cross_entropy()`][steadystep.torch.decentral.cross_entropy] skips
   ``ignore_index``);
3. hands them to [`steadystep.decentral.DecentralizedAdamW`][steadystep.decentral.DecentralizedAdamW], whose kernel
clips each
   worker (c/(‖g_i‖ + 1e−6), capped at 1), mixes over the topology (AWC or ATC, consensus
   strength γ fixed or [`AdaptiveConsensus`][steadystep.decentral.AdaptiveConsensus]) and applies AdamW
   in one launch: on the CPU for CPU tensors, on the GPU for CUDA tensors, zero-copy.

>>> import torch
>>> from steadystep import decentral
>>> from steadystep.torch.decentral import DecentralizedTrainer
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
>>> trainer = DecentralizedTrainer(model, workers=4, topology=decentral.ring(), lr=1e-2, max_norm=1.0)
>>> inputs, targets = torch.randn(4, 16, 4), torch.randint(0, 3, (4, 16))   # worker i: inputs[i], targets[i]
>>> result = trainer.step(inputs, targets)                                    # cross-entropy by default
>>> result.losses.shape, trainer.t
(torch.Size([4]), 1)
>>> mean = trainer.mean_model()                  # an nn.Module holding x̄ = mean_i x_i
>>> trainer.consensus_distance() > 0
True

Buffers (BatchNorm's running statistics) are kept per worker, updated by the worker's own batches
under vmap, and never mixed;
[`mean_model()`][steadystep.torch.decentral.DecentralizedTrainer.mean_model] holds their mean
(integer buffers such as ``num_batches_tracked``: worker 0's). Frozen parameters
(``requires_grad=False``) stay outside the arena: one tensor that every worker reads, identical
across workers by construction. Where a loop over the workers computes their gradients faster
than vmap (BatchNorm, ``scaled_dot_product_attention``), the trainer measures it on the first
step and loops (``vmap="auto"``, the default). A module that vmap cannot batch (control flow
that reads tensor values, ``.item()``) is stepped one worker at a time: the same results, N
forward/backward passes.
"""

from __future__ import annotations

import copy
import functools
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from steadystep import _html, checks, decentral, dispatch
from steadystep._arrays import rounding_key
from steadystep.arena import Layout, decays_matrices
from steadystep.compress import Compressor
from steadystep.decentral import AdaptiveConsensus, NonFiniteGradientError, Topology, TokenSchedule
from steadystep.torch.curvature import ModuleHessian
from steadystep.torch._batches import map_tensors, tensors_in

__all__ = ["DecentralizedTrainer", "PreparedStep", "StepResult", "cross_entropy", "IGNORE_INDEX"]

IGNORE_INDEX = -100  # torch's default: targets equal to it are not predicted
FORMAT = "steadystep.torch.decentral/1"

Schedule = Union[float, Callable[[int], float], TokenSchedule]
DecayRule = Callable[[str, torch.Tensor], bool]


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy over one worker's valid targets: logits on the last axis of
    ``outputs``, class indices in ``targets`` (any leading shape, e.g. [B, C] tokens), those
    equal to ``ignore_index`` left out of both the sum and the count."""
    return torch.nn.functional.cross_entropy(
        outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1), ignore_index=ignore_index
    )


class PreparedStep(NamedTuple):
    """A step's gradients checked, before anything but the gradient buffers is written: what
    [`DecentralizedTrainer.apply()`][steadystep.torch.decentral.DecentralizedTrainer.apply] steps."""

    lr: float
    gamma: float
    buffers: dict[str, torch.Tensor]
    losses: torch.Tensor
    norms: np.ndarray


class StepResult(NamedTuple):
    """What one step measured: each worker's loss (on the module's device) and gradient norm
    ‖g_i‖ before clipping (float64, on the host), both of shape [N]."""

    losses: torch.Tensor
    grad_norms: torch.Tensor


@dataclass
class _Class:
    """Parameters that share an lr scale and a weight decay: one [N, D_c] tensor, one launch.
    The kernel steps it in place on both targets, so its views are made once and stay views
    of the workers."""

    names: list[str]
    layout: Layout
    lr_scale: float
    weight_decay: float
    optimizer: decentral.DecentralizedAdamW = field(repr=False)
    rows: torch.Tensor = field(repr=False)  # the optimizer's parameters, as torch sees them
    views: dict[str, torch.Tensor] = field(repr=False)  # name → [N, *shape] views of rows
    grads: torch.Tensor = field(repr=False)
    grad_views: dict[str, torch.Tensor] = field(repr=False)


def _views(buffer: torch.Tensor, names: list[str], layout: Layout, workers: int) -> dict[str, torch.Tensor]:
    return {
        name: buffer[:, offset : offset + math.prod(shape)].view(workers, *shape)
        for name, shape, offset in zip(names, layout.shapes, layout.offsets)
    }


def _worker(index: int, batch: Any) -> Any:
    """Worker ``index``'s part of a batch: each tensor's row ``index``, in the same structure."""
    return map_tensors(lambda tensor: tensor[index], batch)


def _simulated() -> bool:
    """Numba's CUDA simulator, where "device" arrays are host memory (the tests' GPU)."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _as_torch(buffer: Any) -> torch.Tensor:
    """The optimizer's buffer as a torch tensor, zero-copy: itself, a Numba device array
    through ``__cuda_array_interface__``, or the CUDA simulator's host memory."""
    if isinstance(buffer, torch.Tensor):
        return buffer
    if hasattr(buffer, "__cuda_array_interface__"):
        return torch.as_tensor(buffer, device="cuda")
    return torch.from_numpy(np.asarray(buffer))  # the simulator's device arrays are NumPy underneath


class DecentralizedTrainer:
    """N workers of ``module`` trained with decentralized AdamW (see the module docstring).

    ``module`` is the template: every worker starts from its weights, and it is never
    changed (read the trained model from
    [`mean_model()`][steadystep.torch.decentral.DecentralizedTrainer.mean_model] or
    [`worker_model()`][steadystep.torch.decentral.DecentralizedTrainer.worker_model]).
    Which parameters train (``requires_grad``) and their groups are fixed when the trainer
    is built.

    ``lr`` is a number, a function of the zero-based step, or a
    [`TokenSchedule`][steadystep.decentral.TokenSchedule] (``functools.partial(decentral.token_lr,
    ...)`` is taken as one). ``consensus`` is γ in [0, 1] (W replaced by γW + (1 − γ)I) or an
    [`AdaptiveConsensus`][steadystep.decentral.AdaptiveConsensus], which needs the run's length:
    ``total_steps``, or a schedule that knows it. Weight decay applies where ``decay(name,
    parameter)`` is true: by default to tensors with ndim ≥ 2 (not biases or norm weights).
    ``groups`` are torch-style parameter groups, ``[{"params": [...], "weight_decay": 0.0,
    "lr_scale": 0.1}, ...]``: parameters listed there take their group's weight decay (on
    every tensor of the group) and learning rate × ``lr_scale``; the rest use the defaults.
    Groups that differ only by weight decay 0 share a launch; each other combination of lr
    scale and weight decay is a [N, D_c] tensor and a launch of its own.

    ``compression`` (a [`steadystep.compress`][steadystep.compress] compressor) gossips with
    CHOCO as [`DecentralizedAdamW`][steadystep.decentral.DecentralizedAdamW] does, each class of
    parameters with its own public copies; ``seed`` keys its stochastic rounding, and
    [`bytes_sent`][steadystep.torch.decentral.DecentralizedTrainer.bytes_sent] counts what each
    worker sent. ``outer`` (a [`decentral.DiLoCo`][steadystep.decentral.DiLoCo]) takes local steps
    and mixes the workers only in its outer step, every H steps. ``state_bits=8`` keeps every
    class's moments as 8-bit codes with a float32 absmax per 256 columns of each worker's row,
    ``state_bits=4`` as 4-bit codes with one per 128 (as
    [`DecentralizedAdamW`][steadystep.decentral.DecentralizedAdamW] does).

    ``vmap``: how the N forward and backward passes run. ``"auto"`` (the default) times both
    ways on the first step's batch (each twice, the first warming up; nothing they compute is
    kept, the random number generators are restored) and keeps the faster:
    ``torch.func.vmap`` over the workers, or a loop over them (faster where torch batches a
    layer badly: BatchNorm, ``scaled_dot_product_attention``); a loop must be 10 % faster to be
    chosen. [`gradients_by`][steadystep.torch.decentral.DecentralizedTrainer.gradients_by] says
    which, and why; a checkpoint keeps the choice, so a resumed run continues as it ran. The two
    ways differ by rounding only (a batched matmul sums in its own order). ``True`` or ``False``
    fixes the way, for runs that must be bit-identical across machines. A module that vmap
    cannot batch is stepped in a loop either way. ``target`` forces where the kernels run (the
    tests run the CUDA kernels on Numba's simulator this way); by default it follows the
    module's device.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        workers: int,
        *,
        topology: Topology,
        order: str = "awc",
        lr: Schedule = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_norm: Optional[float] = None,
        consensus: Union[float, AdaptiveConsensus] = 1.0,
        total_steps: Optional[int] = None,
        decay: DecayRule = lambda name, parameter: decays_matrices(tuple(parameter.shape)),
        groups: Optional[Sequence[Mapping[str, Any]]] = None,
        vmap: Union[bool, str] = "auto",
        target: Optional[str] = None,
        compression: Optional[Compressor] = None,
        seed: int = 0,
        outer: Optional[decentral.DiLoCo] = None,
        state_bits: int = 32,
    ):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"module must be a torch.nn.Module (the template every worker starts from); got {type(module).__name__}"
            )
        checks.counts(workers=(workers, 1))
        checks.non_negative(weight_decay=weight_decay)
        if isinstance(lr, functools.partial) and lr.func is decentral.token_lr:
            lr = TokenSchedule(**lr.keywords)
        if not callable(lr):
            checks.non_negative(lr=lr)
        if total_steps is not None:
            checks.counts(total_steps=(total_steps, 1))
        if isinstance(consensus, AdaptiveConsensus) and total_steps is None and not isinstance(lr, TokenSchedule):
            raise ValueError(
                "consensus=AdaptiveConsensus(...) follows lr_t / lr_max over the run: pass total_steps "
                "(or lr as a decentral.TokenSchedule, which knows the run's length)"
            )
        self.module, self.workers, self.lr, self.consensus = module, int(workers), lr, consensus
        self.total_steps = total_steps if total_steps is not None else getattr(lr, "total_steps", None)
        if vmap not in (True, False, "auto"):
            raise ValueError(f"vmap must be True, False or 'auto'; got {vmap!r}")
        # True/False once chosen; the seconds each way took on the first batch, when timed
        self.vmap: Optional[bool] = None if vmap == "auto" else bool(vmap)
        self._timings: Optional[dict[str, float]] = None
        self._why = "" if vmap == "auto" else "fixed by the vmap argument"
        trainable, self._frozen = _split_parameters(module)
        self.dtype, self.device = _one_device_and_dtype(trainable)
        settings = _group_settings(module, trainable, groups, weight_decay, decay)
        options = dict(
            topology=topology,
            order=order,
            betas=betas,
            eps=eps,
            max_norm=max_norm,
            consensus=1.0 if isinstance(consensus, AdaptiveConsensus) else consensus,
            target=target,
            compression=compression,
            outer=outer,
            state_bits=state_bits,
        )
        # each class of parameters draws its own stream of stochastic rounding (seed, class)
        self.compression, self.seed, self.outer = compression, checks.count("seed", seed), outer
        self._classes = [
            self._pack(names, trainable, scale, rate, decayed, {**options, "seed": rounding_key(seed, index)})
            for index, ((scale, rate), (names, decayed)) in enumerate(_classes(settings).items())
        ]
        self.topology, self.order = topology, order
        self._buffers = {
            name: buffer.detach().unsqueeze(0).repeat(self.workers, *([1] * buffer.dim()))
            for name, buffer in module.named_buffers()
        }
        where = self._classes[0].optimizer.where
        if where == "cpu" and self.device.type != "cpu":
            raise ValueError(
                f"the module is on {self.device}, and target='cpu' would copy its workers to the host "
                "every step; move the module with .cpu() instead"
            )
        if where == "cuda" and self.device.type == "cpu" and not _simulated():
            raise ValueError(
                "target='cuda' with the module on the CPU would copy the workers to the GPU every step; "
                "move the module with .cuda() instead"
            )
        self._peak: Optional[float] = None

    def _pack(
        self,
        names: list[str],
        trainable: dict[str, torch.nn.Parameter],
        lr_scale: float,
        weight_decay: float,
        decayed: list[bool],
        options: dict[str, Any],
    ) -> _Class:
        layout = Layout.of([tuple(trainable[name].shape) for name in names])
        params = torch.zeros(self.workers, layout.size, dtype=self.dtype, device=self.device)
        mask = np.zeros(layout.size, np.float64 if self.dtype == torch.float64 else np.float32)  # computed in
        with torch.no_grad():
            for view, name, on, (start, stop) in zip(
                _views(params, names, layout, self.workers).values(),
                names,
                decayed,
                map(layout.extent, range(layout.segments)),
            ):
                view.copy_(trainable[name].detach().unsqueeze(0).expand_as(view))
                mask[start:stop] = on
        optimizer = decentral.DecentralizedAdamW(
            params, lr=0.0, weight_decay=weight_decay, decay_mask=mask if weight_decay else None, **options
        )
        rows = _as_torch(optimizer.params)  # params itself, unless a forced target moved it
        grads = torch.zeros_like(params)
        return _Class(
            names,
            layout,
            lr_scale,
            weight_decay,
            optimizer,
            rows,
            _views(rows, names, layout, self.workers),
            grads,
            _views(grads, names, layout, self.workers),
        )

    def __repr__(self) -> str:
        tensors, count = self._size()
        return (
            f"DecentralizedTrainer({type(self.module).__name__}: {self.workers} workers × {count:,} parameters in "
            f"{tensors} tensors, {self.dtype} on {self.device}, topology={self.topology.name}, order={self.order!r}, "
            f"t={self.t})"
        )

    def _repr_html_(self) -> str:
        tensors, count = self._size()
        rows: list[tuple[str, object]] = [
            ("module", type(self.module).__name__),
            ("workers", self.workers),
            ("parameters per worker", f"{count:,} in {tensors} tensors"),
            ("dtype", self.dtype),
            ("device", self.device),
            ("topology", self.topology.name),
            ("order", self.order),
            ("forward/backward", self.gradients_by["way"] or "chosen at the first step"),
            ("steps taken (t)", self.t),
        ]
        return _html.table("DecentralizedTrainer", rows)

    def _size(self) -> tuple[int, int]:
        """The trained tensors and their elements, per worker."""
        tensors = sum(len(c.names) for c in self._classes)
        return tensors, sum(sum(math.prod(shape) for shape in c.layout.shapes) for c in self._classes)

    # state -----------------------------------------------------------------------------------------

    @property
    def t(self) -> int:
        """Steps taken (the zero-based index of the next one)."""
        return self._classes[0].optimizer.t

    @property
    def optimizers(self) -> tuple[decentral.DecentralizedAdamW, ...]:
        """The [N, D_c] optimizer of each class of parameters (one launch each)."""
        return tuple(c.optimizer for c in self._classes)

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """The module's buffers (BatchNorm's statistics, ...), each [N, ...]: every worker's own."""
        return self._buffers

    @property
    def frozen(self) -> dict[str, torch.Tensor]:
        """The module's parameters that do not train (requires_grad False), shared by the workers."""
        return self._frozen

    @frozen.setter
    def frozen(self, values: dict[str, torch.Tensor]) -> None:
        self._frozen = values

    @property
    def rows(self) -> tuple[torch.Tensor, ...]:
        """The workers' parameters: one [N, D_c] tensor per class of hyper-parameters (one
        without ``groups``), live: the kernel steps them in place."""
        return tuple(c.rows for c in self._classes)

    @property
    def params(self) -> torch.Tensor:
        """All workers' parameters as one [N, D] tensor:
        [`rows`][steadystep.torch.decentral.DecentralizedTrainer.rows] itself when there is one
        class, their concatenation (a copy) otherwise."""
        rows = self.rows
        return rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)

    @property
    def grads(self) -> tuple[torch.Tensor, ...]:
        """The last step's [N, D_c] gradients, before clipping (what the kernel read)."""
        return tuple(c.grads for c in self._classes)

    @property
    def parameter_indices(self) -> np.ndarray:
        """The columns of [`params`][steadystep.torch.decentral.DecentralizedTrainer.params] that hold parameters
        (the rest is padding)."""
        indices, start = [], 0
        for c in self._classes:
            for shape, offset in zip(c.layout.shapes, c.layout.offsets):
                indices.append(np.arange(start + offset, start + offset + math.prod(shape)))
            start += c.layout.size
        return np.concatenate(indices)

    def stacked_parameters(self) -> dict[str, torch.Tensor]:
        """name → [N, *shape] views of every worker's copy of each trainable parameter."""
        return {name: view for c in self._classes for name, view in c.views.items()}

    def learning_rate(self, step: Optional[int] = None) -> float:
        """The learning rate of ``step`` (default: the next one)."""
        step = self.t if step is None else step
        value = self.lr(step) if callable(self.lr) else self.lr
        checks.non_negative(**{f"lr({step})": value})
        return float(value)

    def consensus_strength(self, step: Optional[int] = None) -> float:
        """γ of ``step`` (default: the next one)."""
        step = self.t if step is None else step
        if not isinstance(self.consensus, AdaptiveConsensus):
            return float(self.consensus)
        assert self.total_steps is not None
        if self._peak is None:
            schedule = self.lr
            self._peak = (
                schedule.peak
                if isinstance(schedule, TokenSchedule)
                else max(self.learning_rate(s) for s in range(self.total_steps + 1))
            )
        return self.consensus(step=step, total_steps=self.total_steps, lr=self.learning_rate(step), peak_lr=self._peak)

    # the step ----------------------------------------------------------------------------------------

    def step(
        self, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy
    ) -> StepResult:
        """One step of every worker: worker i runs ``loss_fn(module(*inputs[i]), targets[i])``
        (``inputs`` a tensor or a tuple of them, ``targets`` a tensor or any structure of them,
        each with a leading axis of N), then the mixed AdamW step. Raises
        [`NonFiniteGradientError`][steadystep.decentral.NonFiniteGradientError] naming the workers whose loss or
        gradient is not finite, with parameters, moments, buffers and the step count as they
        were."""
        return self.apply(self.prepare(inputs, targets, loss_fn))

    def prepare(
        self, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy
    ) -> PreparedStep:
        """The first half of [`step()`][steadystep.torch.decentral.DecentralizedTrainer.step]:
        everything of it that can fail (the checks, the forward and backward passes, the
        gradient norms), writing nothing but the gradient buffers; for a caller that acts
        between the two halves (the ranks of a DistributedTrainer mix there)."""
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        self._check_batch("inputs", inputs)
        self._check_batch("targets", targets)
        if (
            loss_fn is cross_entropy
            and isinstance(targets, torch.Tensor)
            and (targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool)
        ):
            raise TypeError(
                f"targets has dtype {targets.dtype}; cross_entropy takes integer class indices (targets.long())"
            )
        lr, gamma = self.learning_rate(), self.consensus_strength()
        buffers = {name: buffer.clone() for name, buffer in self._buffers.items()}  # kept only if the step is
        grads, losses = self._gradients(buffers, inputs, targets, loss_fn)
        host_losses = losses.detach().to("cpu", torch.float64).numpy()
        bad = np.flatnonzero(~np.isfinite(host_losses))
        if bad.size:
            raise NonFiniteGradientError(bad.tolist(), self.t, "loss")
        return PreparedStep(lr, gamma, buffers, losses.detach(), self._write_gradients(grads))

    def apply(self, prepared: PreparedStep) -> StepResult:
        """The second half of [`step()`][steadystep.torch.decentral.DecentralizedTrainer.step]:
        the mixed AdamW step of every class, with the norms of the whole model."""
        for c in self._classes:
            c.optimizer.consensus = prepared.gamma
            c.optimizer.step(c.grads, lr=prepared.lr * c.lr_scale, norms=prepared.norms)
        self._buffers = prepared.buffers
        return StepResult(prepared.losses, torch.from_numpy(prepared.norms))

    def _check_batch(self, name: str, batch: Any) -> None:
        tensors = tensors_in(batch)
        if not tensors:
            raise TypeError(
                f"{name} must hold tensors with a leading axis of {self.workers} workers; got {type(batch).__name__}"
            )
        for tensor in tensors:
            if tensor.dim() == 0 or tensor.shape[0] != self.workers:
                raise ValueError(
                    f"{name} must have a leading axis of {self.workers} (one batch per worker, stacked); "
                    f"got a tensor of shape {tuple(tensor.shape)}"
                )
            if tensor.device != self.device:
                raise ValueError(f"{name} is on {tensor.device} but the workers are on {self.device}; move it there")

    @property
    def gradients_by(self) -> dict[str, Any]:
        """How the workers' forward and backward passes run: ``{"way": "vmap" | "loop" | None
        (not chosen before the first step), "seconds": {"vmap": s, "loop": s} or None (when not
        timed here), "why": ...}``."""
        way = None if self.vmap is None else ("vmap" if self.vmap else "loop")
        return {"way": way, "seconds": self._timings, "why": self._why}

    def _gradients(
        self, buffers: dict[str, torch.Tensor], inputs: tuple, targets: Any, loss_fn: Callable
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Every worker's gradients (name → [N, *shape]) and losses ([N]), the way chosen."""
        batch = (self.stacked_parameters(), buffers, inputs, targets)
        worker = grad(functools.partial(self._worker_loss, loss_fn), has_aux=True)
        if self.vmap is None:
            self._choose(worker, loss_fn, batch)
        if self.vmap:
            try:
                return self._vmapped(worker, batch)
            except RuntimeError as error:
                if not _unbatchable(error):
                    raise
                warnings.warn(
                    f"{type(self.module).__name__} cannot be vmapped ({str(error).splitlines()[0][:160]}); "
                    f"stepping its {self.workers} workers one at a time (the same results, "
                    f"{self.workers} forward/backward passes per step)",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.vmap, self._why = False, f"vmap cannot batch it: {str(error).splitlines()[0][:160]}"
                for name, buffer in self._buffers.items():  # the failed attempt may have written some
                    buffers[name].copy_(buffer)
        return self._looped(loss_fn, batch)

    def _vmapped(self, worker: Callable, batch: tuple) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return vmap(worker, randomness="different")(*batch)

    def _looped(self, loss_fn: Callable, batch: tuple) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One worker after another, by plain autograd on its row of each parameter (a loop of
        torch.func.grad costs up to twice as much: its transforms wrap every operation)."""
        params, buffers, inputs, targets = batch
        grads: dict[str, list[torch.Tensor]] = {name: [] for name in params}
        losses = []
        for i in range(self.workers):
            own = {name: stacked[i].detach().requires_grad_() for name, stacked in params.items()}
            with torch.enable_grad():
                loss, value = self._worker_loss(loss_fn, own, *_worker(i, (buffers, inputs, targets)))
                found = torch.autograd.grad(loss, list(own.values()), allow_unused=True)
            for (name, row), gradient in zip(own.items(), found):
                grads[name].append(torch.zeros_like(row) if gradient is None else gradient)
            losses.append(value)
        return {name: torch.stack(rows) for name, rows in grads.items()}, torch.stack(losses)

    def _choose(self, worker: Callable, loss_fn: Callable, batch: tuple) -> None:
        """vmap or a loop, whichever computes this batch's gradients faster, timed on copies of
        the buffers with the random generators restored afterwards: the step itself then runs
        as if the chosen way had been fixed from the start."""
        params, buffers, inputs, targets = batch
        seconds: dict[str, float] = {}
        with _generators_kept(self.device):
            for way in ("vmap", "loop", "vmap", "loop"):  # the first of each warms up
                trial = (params, {name: b.clone() for name, b in buffers.items()}, inputs, targets)
                started = time.perf_counter()
                try:
                    if way == "vmap":
                        self._vmapped(worker, trial)
                    else:
                        self._looped(loss_fn, trial)
                except RuntimeError as error:
                    if way != "vmap" or not _unbatchable(error):
                        raise
                    self.vmap, self._why = False, f"vmap cannot batch it: {str(error).splitlines()[0][:160]}"
                    return
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                seconds[way] = time.perf_counter() - started
        self._timings = seconds
        self.vmap = seconds["loop"] >= LOOP_MARGIN * seconds["vmap"]
        faster, slower = ("vmap", "loop") if self.vmap else ("loop", "vmap")
        self._why = (
            f"timed on the first batch: {faster} {seconds[faster] * 1e3:.3g} ms, "
            f"{slower} {seconds[slower] * 1e3:.3g} ms"
        )

    def _worker_loss(self, loss_fn: Callable, params: dict, buffers: dict, inputs: tuple, targets: Any) -> tuple:
        outputs = functional_call(self.module, (params, buffers, self._frozen), inputs)
        loss = loss_fn(outputs, targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(
                f"loss_fn must return one scalar tensor per worker (reduce over the worker's batch, "
                f"e.g. a mean over its valid targets); got {shape}"
            )
        return loss, loss.detach()

    def _write_gradients(self, grads: dict[str, torch.Tensor]) -> np.ndarray:
        """Gradients into the [N, D_c] tensors, then each worker's norm over all of them;
        NonFiniteGradientError (all bad workers named) before anything is stepped."""
        squares = np.zeros(self.workers)
        bad: set[int] = set()
        for c in self._classes:
            for name, view in c.grad_views.items():
                view.copy_(grads[name])
            try:
                squares += c.optimizer.gradient_norms(c.grads) ** 2
            except NonFiniteGradientError as error:
                bad.update(error.workers)
        if bad:
            raise NonFiniteGradientError(sorted(bad), self.t)
        return np.sqrt(squares)

    # evaluation ---------------------------------------------------------------------------------------

    def mean_model(self, into: Optional[torch.nn.Module] = None) -> torch.nn.Module:
        """A module holding x̄ = mean_i x_i (what packed validation evaluates; averaged in
        float64), with the workers' mean floating buffers: a copy of the template, or
        ``into`` (a module like it, e.g. the previous result) loaded in place."""
        return self.load_into(into, lambda rows: rows.mean(dim=0, dtype=torch.float64), _mean_buffer)

    def worker_model(self, worker: int, into: Optional[torch.nn.Module] = None) -> torch.nn.Module:
        """A module holding worker ``worker``'s parameters and buffers (a copy)."""
        checks.counts(worker=(worker, 0))
        if worker >= self.workers:
            raise ValueError(f"worker must be below {self.workers}, got {worker}")
        return self.load_into(into, lambda rows: rows[worker], lambda stacked: stacked[worker])

    def load_into(
        self,
        into: Optional[torch.nn.Module],
        pick_row: Callable[[torch.Tensor], torch.Tensor],
        pick_buffer: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.nn.Module:
        """A module (a copy of the template, or ``into``) holding ``pick_row`` of each class's
        [N, D_c] rows and ``pick_buffer`` of each [N, ...] buffer (a worker's, or a mean)."""
        model = copy.deepcopy(self.module) if into is None else into
        with torch.no_grad():
            for c in self._classes:
                row = pick_row(c.rows)
                for name, shape, offset in zip(c.names, c.layout.shapes, c.layout.offsets):
                    model.get_parameter(name).copy_(row[offset : offset + math.prod(shape)].view(shape))
            for name, stacked in self._buffers.items():
                model.get_buffer(name).copy_(pick_buffer(stacked))
        return model

    @property
    def bytes_sent(self) -> np.ndarray:
        """The bytes each worker has sent so far, all classes of parameters together ([N])."""
        return np.sum([c.optimizer.bytes_sent for c in self._classes], axis=0)

    def consensus_errors(self) -> torch.Tensor:
        """e_i = x_i − x̄ for every worker, [N, D] float64 on the workers' device (rows sum to 0)."""
        rows = self.params.to(torch.float64)
        return rows - rows.mean(dim=0)

    def consensus_distance(self) -> float:
        """mean_i ‖x_i − x̄‖² over all trainable parameters, in float64: each worker's sum of
        squares alone, then the workers' in order (as a DistributedTrainer sums its ranks', so
        the two agree bit for bit)."""
        means = [rows.mean(dim=0, dtype=torch.float64) for rows in self.rows]
        return (
            math.fsum(
                sum(float(((rows[i].to(torch.float64) - mean) ** 2).sum()) for rows, mean in zip(self.rows, means))
                for i in range(self.workers)
            )
            / self.workers
        )

    # save and resume ----------------------------------------------------------------------------------

    def save(self, path: Union[str, Path], extra: Optional[dict] = None) -> None:
        """Write the whole state to one file: a [`steadystep.decentral`][steadystep.decentral] checkpoint of the
        first class of parameters (``DecentralizedAdamW.load`` reads it), carrying the
        parameter names and shapes, the buffers and any other classes, under its checksum.
        [`load()`][steadystep.torch.decentral.DecentralizedTrainer.load] continues bit for bit. ``extra`` (JSON)
        comes back from [`load()`][steadystep.torch.decentral.DecentralizedTrainer.load]."""
        self.save_with_run(path, extra)

    def save_with_run(
        self,
        path: Union[str, Path],
        extra: Optional[dict],
        run: Optional[dict] = None,
        arrays: Optional[dict[str, Any]] = None,
    ) -> None:
        """[`save()`][steadystep.torch.decentral.DecentralizedTrainer.save], with ``run`` (a rank's
        place in a run of many, as a DistributedTrainer writes it) beside the description, and
        the rank's own ``arrays`` (name → array, under ``rank/``)."""
        arrays = {f"rank/{name}": value for name, value in (arrays or {}).items()}
        arrays |= {f"buffer/{name}": stacked for name, stacked in self._buffers.items()}
        for index, c in enumerate(self._classes[1:], start=1):
            arrays |= {f"class{index}/{name}": buffer for name, buffer in c.optimizer.buffers.items()}
            arrays[f"class{index}/bytes_sent"] = c.optimizer.bytes_sent
        meta = {"format": FORMAT, "trainer": self.description(), "extra": extra or {}, "vmap": self.vmap}
        self._classes[0].optimizer.save(path, extra=meta if run is None else {**meta, "run": run}, arrays=arrays)

    def description(self) -> dict:
        """What a checkpoint must match to load here: workers, buffers, each class's parameters."""
        return {
            "workers": self.workers,
            "buffers": {name: list(b.shape[1:]) for name, b in self._buffers.items()},
            "classes": [
                {
                    "names": c.names,
                    "shapes": [list(shape) for shape in c.layout.shapes],
                    "lr_scale": c.lr_scale,
                    "weight_decay": c.weight_decay,
                }
                for c in self._classes
            ],
        }

    def load(self, path: Union[str, Path]) -> dict:
        """Continue from a file [`save()`][steadystep.torch.decentral.DecentralizedTrainer.save] wrote for a
        trainer of the same module, workers and groups (a ValueError says what differs, and
        nothing is changed); returns its ``extra``."""
        saved = self.read_checkpoint(path)
        self.restore(saved)
        return saved.extra["extra"]

    def read_checkpoint(self, path: Union[str, Path], rank_file: bool = False) -> decentral.DecentralizedAdamW:
        """The checkpoint at ``path``, checked against this trainer (one rank's file of a
        torch.distributed run with ``rank_file``), before anything is changed: the first half
        of [`load()`][steadystep.torch.decentral.DecentralizedTrainer.load]."""
        first = self._classes[0].optimizer
        saved = decentral.DecentralizedAdamW.load(path, topology=first.topology, target="cpu")
        if saved.extra.get("format") != FORMAT:
            raise ValueError(f"{path} is a steadystep.decentral checkpoint, not one of a DecentralizedTrainer")
        run = saved.extra.get("run")
        if run is not None and not rank_file:
            raise ValueError(
                f"{path} is rank {run['rank']}'s file of a run of {run['world_size']} ranks: join the ranks' files "
                "into one with steadystep.torch.distributed.join_trainer_checkpoint, and load that"
            )
        if run is None and rank_file:
            raise ValueError(
                f"{path} is the checkpoint of an in-process trainer of {saved.workers} workers: split it into "
                "files per rank with steadystep.torch.distributed.split_trainer_checkpoint, and load those"
            )
        if saved.extra["trainer"] != self.description():
            raise ValueError(
                f"{path} was saved by a trainer of other parameters, workers or groups:\n"
                f"  saved: {saved.extra['trainer']}\n  here:  {self.description()}"
            )
        settings = ("betas", "eps", "max_norm", "compression", "outer", "state_bits")
        for setting in settings + (() if rank_file else ("order",)):
            mine, theirs = getattr(first, setting), getattr(saved, setting)
            if (list(mine) if isinstance(mine, tuple) else mine) != (
                list(theirs) if isinstance(theirs, tuple) else theirs
            ):
                raise ValueError(f"{path} was saved with {setting}={theirs!r}; this trainer has {mine!r}")
        return saved

    def restore(self, saved: decentral.DecentralizedAdamW) -> None:
        """The state of a checkpoint
        [`read_checkpoint()`][steadystep.torch.decentral.DecentralizedTrainer.read_checkpoint] checked,
        into this trainer: the second half of [`load()`][steadystep.torch.decentral.DecentralizedTrainer.load]."""
        for index, c in enumerate(self._classes):
            prefix = f"class{index}/"
            for name, buffer in c.optimizer.buffers.items():
                dispatch.copy_into(buffer, saved.buffers[name] if index == 0 else saved.arrays[prefix + name])
            c.optimizer.t = saved.t
            counted = saved.bytes_sent if index == 0 else saved.arrays.get(prefix + "bytes_sent")  # None: an older file
            c.optimizer.bytes_sent = np.zeros(self.workers) if counted is None else np.array(counted, np.float64)
        for name, stacked in self._buffers.items():
            stacked.copy_(torch.from_numpy(saved.arrays[f"buffer/{name}"]))
        way = saved.extra.get("vmap", True)  # a file of an earlier release: it always vmapped
        if self.vmap is None and way is not None:  # continue as the run went
            self.vmap, self._why = way, "as the run that saved the checkpoint chose"

    # curvature -------------------------------------------------------------------------------------------

    def hessian(
        self,
        batches: Iterable[Any],
        loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy,
        at: Optional[torch.Tensor] = None,
        dtype: Optional[torch.dtype] = None,
        chunk: Optional[int] = None,
    ) -> ModuleHessian:
        """The full-data mean loss over ``batches`` (pairs of inputs and targets, no worker
        axis) at ``at`` (a packed [D] row; default x̄), as a
        [`ModuleHessian`][steadystep.torch.curvature.ModuleHessian] in the packed layout: H·v for
        [K, D] vectors (padding columns have no curvature), ḡ, per-batch gradients and the
        loss, weighted by valid targets, in ``dtype`` (default the parameters')."""
        buffers = {name: _mean_buffer(stacked) for name, stacked in self._buffers.items()}
        starts = np.cumsum([0] + [c.layout.size for c in self._classes])
        layout = [
            (name, int(start + offset), tuple(shape))
            for c, start in zip(self._classes, starts)
            for name, shape, offset in zip(c.names, c.layout.shapes, c.layout.offsets)
        ]
        constants = [*buffers.items(), *self._frozen.items()]
        return ModuleHessian.packed(
            self.module,
            loss_fn,
            batches,
            layout,
            self.params.shape[1],
            constants,
            self._point(at),
            self.dtype if dtype is None else dtype,
            chunk,
        )

    def hvp(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy,
        at: Optional[torch.Tensor] = None,
        chunk: int = 1,
    ) -> Callable[[np.ndarray], np.ndarray]:
        """H·v of the loss of one batch (no worker axis) at ``at`` (a packed [D] row; default
        x̄), for [`steadystep.diagnostics`][steadystep.diagnostics]: [K, D] vectors in the packed layout (padding
        columns have no curvature) → [K, D] float64, by forward-over-reverse (jvp of grad),
        vmapped over ``chunk`` vectors at a time (each holds its own tangent activations).
        [`hessian()`][steadystep.torch.decentral.DecentralizedTrainer.hessian] streams over many batches."""
        checks.counts(chunk=(chunk, 1))
        return self.hessian([(inputs, targets)], loss_fn, at, chunk=chunk)

    def gradient(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor] = cross_entropy,
        at: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The gradient of one batch's loss (no worker axis) at ``at`` (default x̄), as a
        packed [D] row."""
        gradient = self.hessian([(inputs, targets)], loss_fn, at).gradient()
        return torch.as_tensor(gradient, dtype=self.dtype, device=self.device)

    def _point(self, at: Optional[torch.Tensor]) -> torch.Tensor:
        """``at``, or x̄ (averaged in float64) as a packed row of the parameters' dtype."""
        return (self.params.mean(dim=0, dtype=torch.float64).to(self.dtype) if at is None else at).detach()


def _mean_buffer(stacked: torch.Tensor) -> torch.Tensor:
    """x̄'s value of a buffer stacked over the workers: the mean (in float64, back to the
    buffer's dtype) of floating buffers, worker 0's of the others (num_batches_tracked)."""
    if not stacked.is_floating_point():
        return stacked[0]
    return stacked.mean(dim=0, dtype=torch.float64).to(stacked.dtype)


# -- building the classes ------------------------------------------------------------------------------


# A loop is chosen over vmap only when it takes under this share of vmap's time: timings of a
# few milliseconds vary by several percent, and vmap is the way most modules run fastest.
LOOP_MARGIN = 0.9


def _unbatchable(error: RuntimeError) -> bool:
    """Whether vmap refused the module (a batching rule it lacks, control flow on values)."""
    message = str(error).lower()
    return message.startswith("vmap") or "batching rule" in message


class _generators_kept:
    """Within the block, torch's random number generators (the CPU's, and ``device``'s) may
    advance: on leaving they are as they were."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    def __exit__(self, *_: Any) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def _split_parameters(module: torch.nn.Module) -> tuple[dict[str, torch.nn.Parameter], dict[str, torch.Tensor]]:
    trainable: dict[str, torch.nn.Parameter] = {}
    frozen: dict[str, torch.nn.Parameter] = {}
    for name, parameter in module.named_parameters():
        if torch.nn.parameter.is_lazy(parameter):
            raise ValueError(
                f"parameter {name!r} is lazy (not materialised yet): run one forward pass of the module "
                "before building the trainer"
            )
        (trainable if parameter.requires_grad else frozen)[name] = parameter
    if not trainable:
        raise ValueError("module has no trainable parameters (requires_grad=True); there is nothing to train")
    return trainable, {name: parameter.detach() for name, parameter in frozen.items()}


def _one_device_and_dtype(trainable: dict[str, torch.nn.Parameter]) -> tuple[torch.dtype, torch.device]:
    (first, parameter), *rest = trainable.items()
    for name, other in rest:
        if other.device != parameter.device or other.dtype != parameter.dtype:
            raise ValueError(
                f"module's parameters must share one device and dtype (the rows of one [N, D] tensor): "
                f"{first!r} is {parameter.dtype} on {parameter.device}, {name!r} is {other.dtype} on "
                f"{other.device}"
            )
    if parameter.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(
            f"module's parameters are {parameter.dtype}; the decentralized step runs on float32, float64, "
            "bfloat16 or float16 parameters (module.float(), say)"
        )
    return parameter.dtype, parameter.device


def _group_settings(
    module: torch.nn.Module,
    trainable: dict[str, torch.nn.Parameter],
    groups: Optional[Sequence[Mapping[str, Any]]],
    weight_decay: float,
    decay: DecayRule,
) -> dict[str, tuple[float, float]]:
    """name → (lr scale, weight decay) for every trainable parameter, in the module's order."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    chosen: dict[str, tuple[float, float]] = {}
    for index, group in enumerate(groups or ()):
        if not isinstance(group, Mapping) or "params" not in group:
            raise TypeError(
                f"groups[{index}] must be a dict with 'params' (and 'weight_decay', 'lr_scale'); got {group!r:.80}"
            )
        unknown = set(group) - {"params", "weight_decay", "lr_scale"}
        if unknown:
            raise ValueError(
                f"groups[{index}] has unknown keys {sorted(unknown)}; a group takes params, weight_decay and lr_scale"
            )
        rate, scale = group.get("weight_decay", weight_decay), group.get("lr_scale", 1.0)
        checks.non_negative(**{f"groups[{index}]['weight_decay']": rate, f"groups[{index}]['lr_scale']": scale})
        params = group["params"]
        for parameter in [params] if isinstance(params, torch.Tensor) else list(params):
            name = names.get(id(parameter))
            if name is None:
                raise ValueError(
                    f"groups[{index}] lists a tensor of shape {tuple(parameter.shape)} that is not a "
                    "parameter of module"
                )
            if name in chosen:
                raise ValueError(f"parameter {name!r} is in two groups; list each parameter once")
            if name in trainable:
                chosen[name] = (float(scale), float(rate))
    return {
        name: chosen.get(name, (1.0, float(weight_decay) if decay(name, parameter) else 0.0))
        for name, parameter in trainable.items()
    }


def _classes(settings: dict[str, tuple[float, float]]) -> dict[tuple[float, float], tuple[list[str], list[bool]]]:
    """(lr scale, weight decay) → (names, decayed): parameters without weight decay join a
    class of the same lr scale that has one (its mask leaves them undecayed)."""
    rates: dict[float, float] = {}
    for scale, rate in settings.values():
        if rate:
            rates.setdefault(scale, rate)
    classes: dict[tuple[float, float], tuple[list[str], list[bool]]] = {}
    for name, (scale, rate) in settings.items():
        key = (scale, rate if rate else rates.get(scale, 0.0))
        names, decayed = classes.setdefault(key, ([], []))
        names.append(name)
        decayed.append(bool(rate))
    return classes
