"""Hessian-vector products, gradients and losses of a torch module's full-data mean loss.

[`ModuleHessian`][steadystep.torch.curvature.ModuleHessian] is an H·v source for
[`steadystep.curvature`][steadystep.curvature] and
[`steadystep.diagnostics`][steadystep.diagnostics]: H·v by forward-over-reverse differentiation
(``torch.func.jvp`` of ``torch.func.grad``), a [K, D] batch of vectors in one vectorised pass
(``torch.func.vmap``), streamed over an iterable of batches so that memory stays O(D·K)
whatever the data set's size.

The loss is the mean over every valid target of the whole data set (the token mean of a
language model), L = Σ_b w_b·L_b / Σ_b w_b, where L_b is ``criterion(module(inputs), targets)``
on batch b (a mean over its targets) and w_b its number of valid targets: integer targets
not equal to the criterion's ``ignore_index`` (torch's −100 by default), or every entry of
floating-point targets; pass ``weight`` for another count. Then ḡ = Σ_b w_b·∇L_b / Σ_b w_b and
H·v = Σ_b w_b·∇²L_b·v / Σ_b w_b: batches of any sizes give the loss of their concatenation.

>>> import torch
>>> from steadystep import curvature
>>> from steadystep.torch.curvature import ModuleHessian
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
>>> batches = [(torch.randn(8, 3), torch.randint(0, 2, (8,))) for _ in range(3)]
>>> hessian = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64)
>>> hessian.dim, round(hessian.loss(), 6), hessian.targets  # D, the mean loss, its 24 targets
(26, 0.713515, 24.0)
>>> pairs = curvature.top_eigenpairs(hessian, hessian.dim, k=2)
>>> pairs.converged
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Optional

import numpy as np
import torch

from steadystep import checks
from steadystep import _estimates

__all__ = ["ModuleHessian"]


class ModuleHessian:
    """H·v (``hessian(vectors)``), ḡ ([`gradient()`][steadystep.torch.curvature.ModuleHessian.gradient]), per-batch
    gradients and the loss of
    ``module``'s mean loss over ``batches``, at its parameters when constructed (or ``point``).

    ``batches`` is re-iterated by every call (a list, a ``DataLoader`` without shuffling);
    each batch is ``(inputs, targets)``, ``inputs`` one tensor or a tuple of the module's
    positional arguments, moved to the parameters' device. The D coordinates are the trainable
    parameters (``requires_grad``) in ``module.named_parameters()`` order, each flattened (a
    tied weight once). ``dtype=torch.float64`` computes in double precision (parameters,
    buffers and floating-point inputs converted; the module is left as it is), as curvature
    studies usually do. The module runs in evaluation mode (dropout off, batch norm on its
    running statistics: a deterministic loss) and is put back in its mode afterwards.
    ``vectorize=False`` loops over the vectors instead of ``vmap`` (for modules vmap cannot
    batch); results agree to rounding. ``chunk`` bounds the vectors one vmapped pass takes
    (each holds its own tangent activations; default all of a call's).

    Vectors and results are float64 NumPy arrays (the diagnostics work in NumPy). A loss,
    gradient or product that is not finite raises ``FloatingPointError`` naming the batch.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        criterion: Callable[[Any, Any], torch.Tensor],
        batches: Iterable[Any],
        *,
        dtype: Optional[torch.dtype] = None,
        weight: Optional[Callable[[Any], Any]] = None,
        point: Any = None,
        vectorize: bool = True,
        chunk: Optional[int] = None,
    ):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("module has no trainable parameters (requires_grad): there is no Hessian to take")
        layout, offset = [], 0
        for name, parameter in named:
            layout.append((name, offset, parameter.shape))
            offset += parameter.numel()
        dtype = named[0][1].dtype if dtype is None else dtype
        trainable = {name for name, _ in named}
        constants: list[tuple[str, torch.Tensor]] = [
            *((name, p) for name, p in module.named_parameters() if name not in trainable),
            *module.named_buffers(),
        ]
        self._setup(module, criterion, batches, layout, offset, constants, dtype, weight, vectorize, chunk)
        if point is None:
            self.point = torch.cat([p.detach().reshape(-1).to(self.dtype) for _, p in named])
        else:
            values = _estimates.finite(_estimates.host_values(point, "point"), "point")
            if values.shape != (self.dim,):
                raise ValueError(
                    f"point must have shape ({self.dim},), the module's trainable parameters; got {values.shape}"
                )
            self.point = torch.as_tensor(values, dtype=self.dtype, device=self.device)

    @classmethod
    def packed(
        cls,
        module: torch.nn.Module,
        criterion: Callable[[Any, Any], torch.Tensor],
        batches: Iterable[Any],
        layout: list[tuple[str, int, tuple[int, ...]]],
        dim: int,
        constants: list[tuple[str, torch.Tensor]],
        point: torch.Tensor,
        dtype: torch.dtype,
        chunk: Optional[int],
    ) -> ModuleHessian:
        """A Hessian whose coordinates are a packed row of ``dim`` (``layout``: each trainable
        parameter's name, offset and shape; the rest is padding, of no curvature), at ``point``:
        the torch-module trainer's."""
        source = cls.__new__(cls)
        source._setup(module, criterion, batches, layout, dim, constants, dtype, None, True, chunk)
        source.point = point.detach().to(source.dtype)
        return source

    def _setup(
        self,
        module: torch.nn.Module,
        criterion: Callable[[Any, Any], torch.Tensor],
        batches: Iterable[Any],
        layout: list[tuple[str, int, Any]],
        dim: int,
        constants: list[tuple[str, torch.Tensor]],
        dtype: Any,
        weight: Optional[Callable[[Any], Any]],
        vectorize: Any,
        chunk: Optional[int],
    ) -> None:
        """What both constructors check and keep (everything but the point)."""
        if not callable(criterion):
            raise TypeError(f"criterion must be a loss function of (outputs, targets); got {criterion!r}")
        if getattr(criterion, "reduction", "mean") != "mean":
            raise ValueError(
                f"criterion has reduction={criterion.reduction!r}; it must average over its targets "  # type: ignore[attr-defined]
                "(reduction='mean'), as the full-data mean loss weights each batch by its count"
            )
        if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
            raise TypeError(f"batches must be an iterable of (inputs, targets) batches; got {type(batches).__name__}")
        if iter(batches) is batches:
            raise TypeError(
                "batches is an iterator, which can be read once; every H·v reads the whole data set again: "
                "pass a list of batches or a DataLoader"
            )
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype (torch.float64, say); got {dtype!r}")
        if weight is not None and not callable(weight):
            raise TypeError(f"weight must be a function of a batch giving its count of targets; got {weight!r}")
        self.weight = weight
        self.vectorize = checks.flag("vectorize", vectorize)
        self.chunk = None if chunk is None else checks.count("chunk", chunk, 1)
        self.module, self.criterion, self.batches = module, criterion, batches
        self.layout, self.dim, self.dtype = layout, dim, dtype
        self.device = next(module.parameters()).device
        self.constants = {  # frozen parameters and buffers, in the computing dtype too
            name: value.detach().to(dtype) if value.is_floating_point() else value for name, value in constants
        }
        self.targets = 0.0  # Σ_b w_b of the last pass over the batches

    # -- the full-data sums ------------------------------------------------------------------------

    def __call__(self, vectors: Any) -> np.ndarray:
        """H·v of the full-data mean loss for each row of a [K, D] array (float64 NumPy)."""
        rows = np.atleast_2d(_estimates.finite(_estimates.host_values(vectors, "vectors"), "vectors"))
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"vectors must be a [K, {self.dim}] array for this module, got shape {np.shape(vectors)}")
        tangents = torch.as_tensor(rows, dtype=self.dtype, device=self.device)

        def product(inputs: tuple, targets: Any) -> torch.Tensor:
            gradient = torch.func.grad(lambda flat: self._loss(flat, inputs, targets))

            def one(tangent: torch.Tensor) -> torch.Tensor:
                return torch.func.jvp(gradient, (self.point,), (tangent,))[1]

            if not self.vectorize:
                return torch.stack([one(tangent) for tangent in tangents])
            return torch.cat([torch.func.vmap(one)(part) for part in tangents.split(self.chunk or len(tangents))])

        return self._mean(product, "Hessian-vector product")

    def gradient(self) -> np.ndarray:
        """ḡ, the gradient of the full-data mean loss at the point ([D] float64)."""
        return self._mean(lambda inputs, targets: torch.func.grad(self._loss)(self.point, inputs, targets), "gradient")

    def loss(self) -> float:
        """The full-data mean loss at the point."""
        return float(self._mean(lambda inputs, targets: self._loss(self.point, inputs, targets), "loss"))

    def batch_gradients(self, batches: Optional[Iterable[Any]] = None) -> np.ndarray:
        """Each batch's own gradient (its mean loss's), one row per batch ([S, D] float64): the
        sampled g_k of [`steadystep.diagnostics.noise_alignment()`][steadystep.diagnostics.noise_alignment]
        (``batches``: these instead of the full data's)."""
        rows = []
        with _EvaluationMode(self.module):
            for index, (batch, inputs, targets) in enumerate(self._batches(batches)):
                if self._weight(index, batch, targets) == 0.0:
                    raise ValueError(f"batch {index} has no valid targets; its mean loss (and gradient) is undefined")
                row = torch.func.grad(self._loss)(self.point, inputs, targets)
                rows.append(self._checked(row, f"the gradient of batch {index}"))
        if not rows:
            raise ValueError("batches yielded no batch")
        return torch.stack(rows).cpu().numpy()

    # -- helpers -------------------------------------------------------------------------------------

    def _loss(self, flat: torch.Tensor, inputs: tuple, targets: Any) -> torch.Tensor:
        parameters = {name: flat[offset : offset + math.prod(shape)].view(shape) for name, offset, shape in self.layout}
        outputs = torch.func.functional_call(self.module, (parameters, self.constants), inputs)
        return self.criterion(outputs, targets)

    def _mean(self, compute: Callable[[tuple, Any], torch.Tensor], what: str) -> np.ndarray:
        """Σ_b w_b·compute(batch b) / Σ_b w_b over one pass through the batches (float64 sums
        of the values computed in the computing dtype); the pass's Σ_b w_b is kept as ``targets``."""
        total: Any = 0.0
        value: Any = None
        count, summed = 0.0, 0
        with _EvaluationMode(self.module):
            for index, (batch, inputs, targets) in enumerate(self._batches()):
                weight = self._weight(index, batch, targets)
                if weight == 0.0:  # no valid target: the batch adds nothing (its own mean is NaN)
                    continue
                value = self._checked(compute(inputs, targets), f"the {what} of batch {index}")
                total = total + weight * value  # in float64 where the module lives: one copy at the end
                count, summed = count + weight, summed + 1
        if not summed:
            raise ValueError(
                "batches hold no valid targets (none, or every one equal to ignore_index): the mean loss is undefined"
            )
        self.targets = count
        # one batch: its own value, without the rounding of w·v/w
        return (value if summed == 1 else total / count).cpu().numpy()

    def _checked(self, value: torch.Tensor, name: str) -> torch.Tensor:
        """``value`` in float64 where it is, or a FloatingPointError naming it (and its first
        row that is not finite)."""
        value = value.detach().to(torch.float64)
        if not bool(torch.isfinite(value).all()):
            _estimates.finite(value.cpu().numpy(), name)
        return value

    def _batches(self, batches: Optional[Iterable[Any]] = None) -> Iterable[tuple[Any, tuple, Any]]:
        """Each batch as given, its inputs (a tuple) and its targets, on the device."""
        for index, batch in enumerate(self.batches if batches is None else batches):
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise TypeError(f"batch {index} must be a pair (inputs, targets); got {type(batch).__name__}")
            inputs, targets = batch
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            yield batch, tuple(self._moved(value) for value in inputs), self._moved(targets)

    def _moved(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        value = value.to(self.device)
        return value.to(self.dtype) if value.is_floating_point() else value

    def _weight(self, index: int, batch: Any, targets: Any) -> float:
        if self.weight is not None:
            count = checks.number(f"the weight of batch {index}", self.weight(batch))
        elif isinstance(targets, torch.Tensor) and not targets.is_floating_point():
            ignored = getattr(self.criterion, "ignore_index", -100)
            count = float((targets != ignored).sum())
        else:
            count = float(targets.numel()) if isinstance(targets, torch.Tensor) else float(len(targets))
        if not count >= 0.0 or count == float("inf"):
            raise ValueError(f"the weight of batch {index} must be a finite count ≥ 0; got {count}")
        return count


class _EvaluationMode:
    """``module.eval()`` for a block, then each submodule's own mode back."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.module.modules()]
        self.module.eval()

    def __exit__(self, *exc: Any) -> None:
        for module, training in self.modes:
            module.training = training
