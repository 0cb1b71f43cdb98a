"""The [N, D] optimizer, DecentralizedAdamW, and the functional step: clip + AdamW + mixing over
a topology, one kernel launch over all N workers."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from steadystep import _arrays, _html, checks, dispatch, quantization
from steadystep.arena import Layout
from steadystep.compress import Compressor, identity
from steadystep.decentral import checkpoint, communication
from steadystep.decentral.communication import DiLoCo
from steadystep.decentral.consensus import check_workers
from steadystep.kernels.decentral import WORKER_STEP
from steadystep.decentral.topology import (
    TOPOLOGIES,
    Topology,
    check_is_topology,
    check_mixing,
    check_topology,
    from_matrix,
)

__all__ = [
    "DecentralizedAdamW",
    "NonFiniteGradientError",
    "step",
]

TOPOLOGY_ARRAYS_KEPT = 64  # a GPU optimizer's uploaded peers and weights: a time-varying matrix is not kept forever


class NonFiniteGradientError(FloatingPointError):
    """A worker's gradient (or loss: ``what``) holds inf or NaN; training stops with nothing written."""

    def __init__(self, workers: list[int], step: int, what: str = "gradient"):
        self.workers, self.step, self.what = workers, step, what
        super().__init__(f"non-finite {what} on worker(s) {workers} at step {step}; nothing was updated")

    def __reduce__(self) -> tuple:  # pickled across processes (MPI, multiprocessing) with its fields
        return type(self), (self.workers, self.step, self.what)


class DecentralizedAdamW:
    """N workers' parameters, moments and step counter, stepped together.

    ``params`` is an [N, D] float32/float64 array (NumPy, torch, CuPy or Numba device array), or
    bfloat16/float16 (computed in float32, rows and moments rounded once per step); the optimizer
    keeps it and its moments on the same device and updates them in place (views of ``params`` stay
    views of the workers). ``decay_mask`` is a length-D 0/1 array (weight decay where 1), on the
    host or the device. ``exp_avg``/``exp_avg_sq`` start the moments from the caller's buffers
    instead of zeros. On the CPU the object can be pickled or deep-copied (a copy continues bit for
    bit; a topology from a function of t needs that function to be picklable); Numba's device arrays
    cannot be, so on the GPU [`save()`][steadystep.decentral.DecentralizedAdamW.save] and
    [`load()`][steadystep.decentral.DecentralizedAdamW.load] carry the state.

    ``compression`` (a [`steadystep.compress`][steadystep.compress] compressor) gossips with
    CHOCO (SPEC §8): each worker keeps a public copy x̂_i (``public``, [N, D], starting equal to
    its row, or the caller's buffer), only compressed differences Q(x_i − x̂_i) travel, and
    ``consensus`` γ is CHOCO's consensus step size:

    - ATC: x_i' = (1 − ηλ)x_i − ηu_i;  x̂_i += Q(x_i' − x̂_i) (every i);  x_i ← x_i' + γ Σ_j W_ij (x̂_j − x̂_i)
    - AWC: x̂_i += Q(x_i − x̂_i) (every i);  x_i ← (1 − ηλ)(x_i + γ Σ_j W_ij (x̂_j − x̂_i)) − ηu_i

    Stochastic rounding draws from (``seed``, t, element). ``bytes_sent`` counts what each worker
    has sent since the optimizer was made (or saved), compressed or not
    ([`bytes_sent()`][steadystep.decentral.bytes_sent]).

    ``outer`` (a [`DiLoCo`][steadystep.decentral.DiLoCo]) takes local steps instead: every worker
    steps AdamW alone, and every H steps the pseudo-gradients y_i − x_i are mixed over the
    topology (compressed with error feedback when ``compression`` is given) for an outer Nesterov
    step. [`buffers`][steadystep.decentral.DecentralizedAdamW.buffers] has every [N, D] buffer of the state.

    ``state_bits=8`` keeps the moments as 8-bit codes with one float32 absmax per block of 256
    columns of each worker's row (SPEC §9), ``state_bits=4`` as 4-bit codes (two a byte) with
    one per block of 128: ``exp_avg``/``exp_avg_sq`` are then
    [`QuantizedState`][steadystep.quantization.QuantizedState]s, and a step is the gossip of the
    rows (before the local step for AWC, after it for ATC) and the blockwise AdamW of every
    worker, two launches. With bfloat16 rows the whole state is 4.03 bytes a parameter a worker
    with 8 bits, 3.06 with 4 (2 more with the gradients). Not with ``compression`` or ``outer``
    (their copies are float32).
    """

    def __init__(
        self,
        params: Any,
        *,
        topology: Topology,
        order: str = "awc",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_norm: Optional[float] = None,
        decay_mask: Any = None,
        consensus: float = 1.0,
        target: Optional[str] = None,
        exp_avg: Any = None,
        exp_avg_sq: Any = None,
        compression: Optional[Compressor] = None,
        seed: int = 0,
        public: Any = None,
        outer: Optional[DiLoCo] = None,
        state_bits: int = 32,
    ):
        check_mixing(topology, order, consensus)
        if state_bits not in (4, 8, 32):
            raise ValueError(
                f"state_bits must be 32 (float moments), 8 or 4 (blockwise 8- or 4-bit codes); got {state_bits!r}"
            )
        seed = checks.count("seed", seed)
        checks.betas(betas)
        checks.non_negative(
            lr=lr, eps=eps, weight_decay=weight_decay, **({} if max_norm is None else {"max_norm": max_norm})
        )
        operand = _arrays.classify("params", params)
        if getattr(operand.source if operand.source is not None else operand.value, "requires_grad", False):
            raise TypeError(
                "params is a torch tensor that requires grad; the workers' buffer is stepped in place, "
                "outside autograd: pass params.detach() (the same memory)"
            )
        check_workers(operand.shape)
        if operand.dtype not in (np.float32, np.float64) and not operand.storage:
            raise TypeError(f"params has dtype {operand.dtype}; use float32, float64, bfloat16 or float16")
        self.workers, self.width = operand.shape
        check_topology(topology, self.workers)
        communication.check_communication(topology, self.workers, compression, outer, consensus, public)
        # the rows' dtype (bfloat16 and float16 as their bits: ``storage`` says which) and the one
        # the step computes in (float32 for half precision; the mask and clip factors are kept in it)
        self.dtype, self.storage, self.computed = (
            _arrays.array_dtype(operand),
            operand.storage,
            _arrays.computed(operand),
        )
        self.where = dispatch.choose_target([operand], target)
        self._backend = dispatch.backend(self.where)
        self._backend.check_mixing(self.workers, self.computed.itemsize)
        self.topology, self.order, self.lr, self.betas, self.eps = topology, order, lr, betas, eps
        self.extra: dict = {}
        self.arrays: dict[str, np.ndarray] = {}  # what save(arrays=...) stored beside the state, once loaded
        self.weight_decay, self.max_norm, self.consensus = weight_decay, max_norm, consensus
        self.t = 0
        if self.where == "cuda" and operand.kind == "host":  # a forced GPU target: the state moves there
            params = self._to_target(np.array(_forced_copy(operand)))
        _arrays.check_writable(_arrays.classify("params", params))  # trained in place
        self._params = params
        self.state_bits = state_bits
        if state_bits != 32:
            self._moments = self._quantized_moments(exp_avg, exp_avg_sq, compression, outer)
        else:
            self._moments = [
                self._moment(name, value) for name, value in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq))
            ]
        self.compression, self.seed, self.outer = compression, seed, outer
        self.bytes_sent = np.zeros(self.workers)
        # the state beyond params and moments, [N, D] each: CHOCO's public copies; DiLoCo's outer
        # copies, outer momentum and what compression left of the pseudo-gradients
        self._state: dict[str, Any] = {}
        if (compression is not None or outer is not None) and self.storage:
            raise TypeError(
                f"compression and outer steps need float32 or float64 rows; params holds {self.storage}: train in "
                "float32 (their buffers keep the rows' dtype)"
            )
        if outer is not None:
            self._state = {name: self._zeros() for name in ("outer", "momentum_buffer", "residual")}
            rows = dispatch.host_array(params)  # every y_i starts at the workers' mean (their model, if they agree)
            dispatch.copy_into(self._state["outer"], np.tile(rows.mean(axis=0, dtype=rows.dtype), (self.workers, 1)))
            self._sent = self._zeros()  # what each worker sends in an outer step (scratch)
        elif compression is not None:
            self._state["public"] = self._moment("public", public)
            if public is None:  # every x̂_i starts equal to x_i
                dispatch.copy_into(self._state["public"], dispatch.host_array(params))
        elif public is not None:
            raise ValueError("public copies are CHOCO's: pass compression= with them, or leave public out")
        self._check_apart()
        starts = tuple(worker * self.width for worker in range(self.workers))
        self._rows = Layout(((self.width,),) * self.workers, starts, self.workers * self.width)
        self.decay = self.computed.type(1) if decay_mask is None else self._to_target(self._host_mask(decay_mask))

    # the settings both reprs show, by their constructor names
    _OPTIONS = ("order", "lr", "betas", "eps", "weight_decay", "max_norm", "consensus")

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._OPTIONS)
        masked = ", decay_mask" if np.ndim(self.decay) else ""
        if self.compression is not None:
            masked += f", compression={self.compression.name}, seed={self.seed}"
        if self.outer is not None:
            masked += f", outer={self.outer}"
        return (
            f"DecentralizedAdamW({self.workers} workers × {self.width:,} {self.storage or self.dtype} on {self.where}, "
            f"topology={self.topology.name}, t={self.t}, {options}{masked})"
        )

    def _repr_html_(self) -> str:
        rows: list[tuple[str, object]] = [
            ("workers", self.workers),
            ("parameters per worker", f"{self.width:,}"),
            ("dtype", self.storage or self.dtype),
            ("target", self.where),
            ("topology", self.topology.name),
            ("steps taken (t)", self.t),
        ]
        rows += [(name, getattr(self, name)) for name in self._OPTIONS]
        rows.append(("decay_mask", "given" if np.ndim(self.decay) else "none (every parameter decays)"))
        rows.append(("compression", "none (dense rows)" if self.compression is None else self.compression.name))
        rows.append(("outer step", "none (mixing every step)" if self.outer is None else str(self.outer)))
        rows.append(("bytes sent per worker", f"{float(np.mean(self.bytes_sent)):,.0f}"))
        return _html.table("DecentralizedAdamW", rows)

    # state ----------------------------------------------------------------------------------------

    @property
    def params(self) -> Any:
        return self._params

    @property
    def exp_avg(self) -> Any:
        return self._moments[0]

    @property
    def exp_avg_sq(self) -> Any:
        return self._moments[1]

    @property
    def public(self) -> Any:
        """The public copies x̂ ([N, D]) of compressed gossip; None without ``compression``."""
        return self._state.get("public")

    @property
    def buffers(self) -> dict[str, Any]:
        """Every [N, D] buffer of the state by name: params, exp_avg, exp_avg_sq, and CHOCO's
        ``public`` or DiLoCo's ``outer``, ``momentum_buffer`` and ``residual``. With quantized
        states the moments are their codes ([N, D] uint8 for 8 bits, [N, ⌈D/2⌉] for 4) and
        ``exp_avg_absmax``/``exp_avg_sq_absmax`` their scales ([N, ⌈D/256⌉] or [N, ⌈D/128⌉]
        float32)."""
        if self.state_bits != 32:
            shape = (self.workers, -1)
            moments = {}
            for name, state in zip(("exp_avg", "exp_avg_sq"), self._moments):
                moments[name] = state.codes.reshape(shape)
                moments[f"{name}_absmax"] = state.absmax.reshape(shape)
            return {"params": self._params, **moments}
        return {"params": self._params, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, **self._state}

    def _quantized_moments(self, exp_avg: Any, exp_avg_sq: Any, compression: Any, outer: Any) -> list:
        """The quantized moments: zeros, or the caller's QuantizedStates of these rows."""
        bits = self.state_bits
        if compression is not None or outer is not None:
            raise ValueError(
                f"{bits}-bit states take plain gossip: compression and outer steps keep float moments (state_bits=32)"
            )
        if self.computed != np.float32:
            raise TypeError(f"{bits}-bit states serve float32, bfloat16 and float16 rows; params holds {self.dtype}")
        moments = []
        for name, given, signed in (("exp_avg", exp_avg, True), ("exp_avg_sq", exp_avg_sq, False)):
            if given is None:
                given = quantization.zeros(
                    self.workers * self.width, signed=signed, bits=bits, like=self._params, row_length=self.width
                )
            elif not isinstance(given, quantization.QuantizedState) or (given.size, given.row_length, given.bits) != (
                self.workers * self.width,
                self.width,
                bits,
            ):
                raise ValueError(
                    f"{name} must be a {bits}-bit QuantizedState of the {self.workers} x {self.width} rows "
                    f"(row_length={self.width}) with state_bits={bits}"
                )
            moments.append(given)
        return moments

    def _zeros(self) -> Any:

        # of params' own dtype (torch's bfloat16 too)
        return _arrays.zeros_like(self._params, self.workers * self.width, None).reshape(self.workers, self.width)

    def _moment(self, name: str, value: Any) -> Any:
        """A moment buffer: zeros, or the caller's (same shape, dtype and device as params)."""
        if value is None:
            return self._zeros()
        operand = self._rows_operand(name, value)
        dispatch.choose_target([_arrays.classify("params", self._params), operand], self.where)
        _arrays.check_writable(operand)
        return value

    def _host_mask(self, decay_mask: Any) -> np.ndarray:
        """The length-D mask (1: decay, 0: none) as a host array of the optimizer's dtype."""
        operand = _arrays.classify("decay_mask", decay_mask)
        if operand.kind == "scalar" or math.prod(operand.shape) != self.width:
            raise ValueError(
                f"decay_mask must have one value per column of params ({self.width}); got shape {operand.shape}"
            )
        if operand.dtype is None or operand.dtype.kind not in "biuf":  # complex would lose its imaginary part
            raise TypeError(f"decay_mask has dtype {operand.dtype}; pass real 0/1 values (bool, integers or floats)")
        mask = np.asarray(dispatch.host_array(decay_mask), self.computed).reshape(self.width)
        _arrays.check_mask("decay_mask", mask)
        return mask

    def _check_apart(self, **others: _arrays.Operand) -> None:
        """Refuse buffers that share memory (a moment given as ``params``, gradients inside
        the parameters): the step would read what it had already overwritten."""
        _arrays.check_apart({**self._buffers, **others}, tuple(self._buffers))

    def _rows_operand(self, name: str, value: Any) -> _arrays.Operand:
        """``value`` classified, refused unless it is [N, D] in the optimizer's dtype."""
        operand = _arrays.classify(name, value)
        if operand.shape != (self.workers, self.width) or (operand.dtype, operand.storage) != (
            self.dtype,
            self.storage,
        ):
            raise ValueError(
                f"{name} must be {self.storage or self.dtype} of shape {(self.workers, self.width)}; "
                f"got {_arrays.dtype_name(operand)} {operand.shape}"
            )
        return operand

    def _to_target(self, host: np.ndarray) -> Any:
        return self._backend.to_target(host)

    def _topology_array(self, host: np.ndarray) -> Any:
        """A step's small read-only array (a topology's peers or weights, a dtype's zero) where
        the kernels read it: on a GPU uploaded once per content and kept, since a schedule
        cycles through a few (an upload allocates and copies, host time at every step)."""
        if self.where == "cpu":
            return host
        kept = self.__dict__.setdefault("_topology_arrays", {})
        key = (host.dtype.str, host.shape, host.tobytes())
        found = kept.get(key)
        if found is None:
            if len(kept) >= TOPOLOGY_ARRAYS_KEPT:
                kept.clear()
            found = kept[key] = self._to_target(host)
        return found

    @functools.cached_property
    def _buffers(self) -> dict[str, _arrays.Operand]:
        """The optimizer's own buffers, classified once: every step reads them, and they are
        never replaced (load copies into them)."""
        return {name: _arrays.classify(name, value) for name, value in self.buffers.items()}

    @functools.cached_property
    def _kernel_buffers(self) -> dict[str, Any]:
        """What the kernels get for each buffer, made once."""
        kernel_buffers = {name: self._backend.kernel_array(operand) for name, operand in self._buffers.items()}
        if self.outer is not None:
            kernel_buffers["sent"] = self._backend.kernel_array(_arrays.classify("sent", self._sent))
        return kernel_buffers

    def __getstate__(self) -> dict:
        # the cached views are remade after a copy: a deep copy would otherwise hold views of
        # the original's memory beside copies of its buffers
        state = self.__dict__.copy()
        made = ("_buffers", "_kernel_buffers", "_backend", "_decay_row", "_own_rows", "_clip_factors", "_flat_params")
        for name in (*made, "_last_grads", "_topology_arrays"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._backend = dispatch.backend(self.where)

    # the step ------------------------------------------------------------------------------------

    def step(self, grads: Any, lr: Optional[float] = None, *, norms: Any = None) -> None:
        """One decentralized step with the workers' gradients ``grads`` ([N, D]).

        ``norms`` clips with the given per-worker norms instead of those of ``grads``: for
        rows that are one part of each worker's gradient (a parameter group stepped apart),
        pass the norms of the whole rows, combined from
        [`gradient_norms()`][steadystep.decentral.DecentralizedAdamW.gradient_norms] of each part
        (which also refuses inf/NaN). Without it the gradients are reduced and checked here.
        """
        if norms is None:
            self._step_checked(*self._checked(grads), lr, given=grads)
            return
        given = np.asarray(norms, np.float64)
        if given.shape != (self.workers,) or not np.all(np.isfinite(given)) or np.any(given < 0):
            raise ValueError(
                f"norms must be the {self.workers} workers' gradient norms (finite, ≥ 0); got "
                f"{np.asarray(norms)!r:.120}"
            )
        checked, _ = self._checked(grads, reduce=False)
        self._step_checked(checked, given, lr, given=grads)

    def _step_checked(self, grads: Any, norms: Optional[np.ndarray], lr: Optional[float], given: Any = None) -> None:
        """The step on gradients `_checked()` returned (on the target) and their norms
        (``given``: the caller's gradients themselves, which the quantized step takes)."""
        clip = np.ones(self.workers)
        if self.max_norm is not None:
            assert norms is not None
            clip = np.minimum(1.0, self.max_norm / (norms + 1e-6))
        if lr is None:
            lr = self.lr
        else:
            checks.non_negative(lr=lr)
        cast = self.computed.type
        beta1, beta2 = self.betas
        count = self.t + 1
        scalars = [
            1.0 - lr * self.weight_decay if self.weight_decay else 1.0,
            1.0 - beta1,
            beta2,
            1.0 - beta2,
            self.eps,
            lr / (1.0 - beta1**count),
            1.0 / math.sqrt(1.0 - beta2**count),
        ]
        clip_factors = self._clip_factors
        if self.where == "cpu":
            clip_factors[...] = clip  # rounded once to the computed dtype, as astype would
        else:
            self._backend.write(clip_factors, _arrays.classify("clip", clip.astype(self.computed)))
        adam = [cast(value) for value in scalars]
        if self.state_bits != 32:
            forced = self.where == "cuda" and _arrays.classify("grads", given).kind == "host"
            self._blockwise_step(grads if forced else given, clip_factors, scalars)  # forced: the copy made there
            sent = communication.bytes_sent(self.topology, self.workers, self.t, self.width, self.dtype.itemsize)
        elif self.compression is not None and self.outer is None:
            self._compressed_gossip(grads, clip_factors, adam)
            sent = communication.bytes_sent(
                self.topology, self.workers, self.t, self.width, self.dtype.itemsize, self.compression, public=True
            )
        else:
            kind, extra = self._mixing(self.t)
            module = dispatch.kernel_module(self.where, "decentral")
            kernel = getattr(module, f"{kind}_{_arrays.suffix(self.computed)}_mix")
            buffers = self._kernel_buffers
            rest = [clip_factors, self.decay, *extra, self.order == "atc", *adam]
            arguments = [buffers["params"], grads, buffers["exp_avg"], buffers["exp_avg_sq"], *rest]
            self._backend.run_mixing(kernel, arguments, self.workers, self.width)
            sent = (
                self._outer_step()
                if self.outer is not None
                else communication.bytes_sent(self.topology, self.workers, self.t, self.width, self.dtype.itemsize)
            )
        _arrays.mark_written(*self.buffers.values())
        self.bytes_sent += sent
        self.t += 1

    def _blockwise_step(self, grads: Any, clip_factors: Any, adam: list) -> None:
        """The step with quantized (8- or 4-bit) moments: gossip, and every worker's blockwise AdamW (SPEC §9)."""
        kind, extra = self._mixing(self.t)
        mixes = not (kind == "peer" and float(extra[2]) == 0.0)  # one worker, or no peer: nothing to mix
        if mixes and self.order == "awc":
            self._gossip(kind, extra)
        names = ("decoupled_factor", "one_minus_beta1", "beta2", "one_minus_beta2", "eps", "step_size")
        scalars = dict(zip((*names, "inverse_bias_correction2_sqrt"), map(float, adam)))
        scalars[_arrays.ROUNDING] = 0
        arrays = {
            "param": self._flat_params,
            "grad": self._flat_grads(grads),
            "exp_avg": self._moments[0],
            "exp_avg_sq": self._moments[1],
            "decay": self.decay if np.ndim(self.decay) else None,  # None: the number in scalars
        }
        scalars["decay"] = 1.0
        quantization.run_step(
            "decentral", WORKER_STEP, arrays, scalars, per_row={"clip": clip_factors}, target=self.where
        )
        if mixes and self.order == "atc":
            self._gossip(kind, extra)

    def _gossip(self, kind: str, extra: list) -> None:
        """x_i ← Σ_j W_ij x_j over every worker's row, in place (one launch)."""
        kernel = getattr(dispatch.kernel_module(self.where, "decentral"), f"{kind}_f32_gossip")
        like = self._topology_array(np.zeros(1, np.float32))
        rows = self._backend.kernel_array(self._buffers["params"])
        self._backend.run_mixing(kernel, [rows, like, *extra], self.workers, self.width)

    def _outer_step(self) -> np.ndarray:
        """DiLoCo's outer step if step t ends a round (two launches: every worker's q_j must be
        written before any mixes them), and the bytes each worker sent for it."""
        assert self.outer is not None
        round_index = self.outer.round_ending(self.t)
        if round_index is None:
            return np.zeros(self.workers)
        compressor = self.compression if self.compression is not None else identity()
        buffers = self._kernel_buffers
        grid = (self.workers, compressor.blocks(self.width))
        compressing = compressor.arguments(self.width, self.computed, self.seed, round_index)
        rows = [buffers["params"], buffers["outer"]]
        self._run_grid("outer_share", grid, [*rows, buffers["residual"], buffers["sent"], *compressing])
        neighbours, weights = communication.mixing_neighbours(self.topology, self.workers, round_index)
        cast = self.computed.type
        mixing = [self._topology_array(neighbours), self._topology_array(weights.astype(self.computed))]
        outer = [cast(self.outer.lr), cast(self.outer.momentum), compressor.block_size]
        self._run_grid("outer_step", grid, [*rows, buffers["momentum_buffer"], buffers["sent"], *mixing, *outer])
        return communication.bytes_sent(
            self.topology, self.workers, round_index, self.width, self.dtype.itemsize, self.compression
        )

    def _compressed_gossip(self, grads: Any, clip_factors: Any, adam: list) -> None:
        """CHOCO's step in two launches, because every public copy must be updated before any
        worker mixes from its neighbours': (ATC) the local step and x̂ += Q(x' − x̂), or (AWC)
        x̂ += Q(x − x̂) alone; then the gossip, with AWC's local step from the mixed value."""
        assert self.compression is not None
        neighbours, weights = communication.gossip_neighbours(self.topology, self.workers, self.t, self.consensus)
        compressing = self.compression.arguments(self.width, self.computed, self.seed, self.t)
        buffers = self._kernel_buffers
        params, exp_avg, exp_avg_sq, public = (buffers[name] for name in ("params", "exp_avg", "exp_avg_sq", "public"))
        grid = (self.workers, self.compression.blocks(self.width))
        moments = [params, grads, exp_avg, exp_avg_sq, public, clip_factors, self._decay_row]
        atc = self.order == "atc"
        if atc:
            self._run_grid("choco_adapt", grid, [*moments, *adam, *compressing])
        else:
            self._run_grid("choco_share", grid, [params, public, *compressing])
        gossip = [self._topology_array(neighbours), self._topology_array(weights.astype(self.computed)), atc]
        self._run_grid("choco_mix", grid, [*moments, *gossip, *adam, self.compression.block_size])

    def _run_grid(self, name: str, grid: tuple[int, int], arguments: list) -> None:
        """The compressed-gossip or outer-step kernel ``name`` over (worker, block) pairs."""
        dispatch.run_grid(self.where, "compress", name, self.computed, grid, arguments)

    # The quantized step's launch is remembered by its arrays' identities (dispatch.run_step): the
    # same objects every step, or each step would be checked and prepared anew (on a GPU, ms).
    @functools.cached_property
    def _clip_factors(self) -> Any:
        """Each worker's clip factor, rewritten in place at every step."""
        return self._to_target(np.ones(self.workers, self.computed))

    @functools.cached_property
    def _flat_params(self) -> Any:
        return self._params.reshape(-1)

    def _flat_grads(self, grads: Any) -> Any:
        """``grads`` as one row, the same view for the same gradients as last step (the view
        keeps that one gradient array alive until the next step)."""
        last = self.__dict__.get("_last_grads")
        if last is None or last[0] is not grads:
            last = self._last_grads = (grads, grads.reshape(-1))
        return last[1]

    @functools.cached_property
    def _own_rows(self) -> Any:
        """Each worker its own peer: the peer kernel's arguments for no mixing."""
        return self._to_target(np.arange(self.workers, dtype=np.int64))

    @functools.cached_property
    def _decay_row(self) -> Any:
        """The decay mask as a length-D array on the target (the compressed step's kernels index it)."""
        if np.ndim(self.decay):
            return self.decay
        return self._to_target(np.ones(self.width, self.computed))

    def gradient_norms(self, grads: Any) -> np.ndarray:
        """Each worker's gradient norm ‖g_i‖ (host float64, [N]), computed where ``grads`` live.
        Raises what [`step()`][steadystep.decentral.DecentralizedAdamW.step] would (a wrong shape, dtype or device;
        inf/NaN), writing nothing."""
        norms = self._checked(grads)[1]
        assert norms is not None
        return norms

    def _checked(self, grads: Any, reduce: bool = True) -> tuple[Any, Optional[np.ndarray]]:
        """``grads`` as the mixing kernel reads them, and their norms (None when not ``reduce``).
        The gradients are classified here, once; everything after takes that operand."""
        operand = self._rows_operand("grads", grads)
        if operand.kind == "host" and self.where == "cuda":  # a forced GPU target: copied over
            operand = _arrays.classify("grads", self._to_target(np.ascontiguousarray(_forced_copy(operand))))
        else:
            dispatch.choose_target([self._buffers["params"], operand], self.where)
            own = {"params": self._params, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "grads": grads}
            dispatch.check_once("decentral grads", own, lambda: self._check_apart(grads=operand))
        return self._backend.kernel_array(operand), self._norms(operand) if reduce else None

    def _norms(self, grads: _arrays.Operand) -> np.ndarray:
        """Each worker's gradient norm in float64; NonFiniteGradientError if any is inf/NaN."""
        norms = np.sqrt(self._backend.to_host(self._backend.sum_squares(grads, self._rows, 1.0)).astype(np.float64))
        overflowed = np.flatnonzero(~np.isfinite(norms))
        if overflowed.size:
            # A sum of squares in the gradient's dtype also overflows for finite gradients
            # (|g| > 1.8e19 in float32): look at those rows on the host, and give finite ones
            # their norm computed with a scale (rare, so a copy is fine).
            rows = dispatch.host_values(grads)[overflowed].astype(np.float64)
            bad = overflowed[~np.isfinite(rows).all(axis=1)]
            if bad.size:
                raise NonFiniteGradientError(bad.tolist(), self.t)
            scale = np.abs(rows).max(axis=1)
            norms[overflowed] = scale * np.sqrt(np.sum((rows / scale[:, None]) ** 2, axis=1))
        return norms

    def _mixing(self, t: int) -> tuple[str, list]:
        """The kernel kind and its topology arguments for step t, with consensus strength γ."""
        cast, gamma = self.computed.type, self.consensus
        if self.outer is not None:  # the inner steps: every worker alone (exactly AdamW's update)
            return "peer", [self._own_rows, cast(1.0), cast(0.0)]
        if self.topology.kind == "complete":
            return "complete", [cast(gamma), cast(1.0 - gamma), cast(1.0 / self.workers)]
        if self.topology.kind == "peer":
            peers = np.asarray(self.topology.peers(self.workers, t), np.int64)
            if np.all(peers == np.arange(self.workers)):  # N = 1: exactly plain AdamW
                return "peer", [self._topology_array(peers), cast(1.0), cast(0.0)]
            return "peer", [self._topology_array(peers), cast(1.0 - gamma / 2), cast(gamma / 2)]
        weights = gamma * self.topology.matrix(self.workers, t) + (1.0 - gamma) * np.eye(self.workers)
        return "dense", [self._topology_array(weights.astype(self.computed))]

    # save and resume -----------------------------------------------------------------------------

    def save(
        self, path: Union[str, Path], extra: Optional[dict] = None, arrays: Optional[dict[str, Any]] = None
    ) -> None:
        """Write the whole state (buffers, t, topology, hyper-parameters, ``extra`` such as an
        RNG state) to one file, with a checksum;
        [`load()`][steadystep.decentral.DecentralizedAdamW.load] continues bit for bit. A user
        matrix that changes with t is saved by name only: pass it again to load(). ``extra``
        is stored as JSON: NumPy and torch numbers and arrays in it come back as Python numbers
        and lists. ``arrays`` (name → array, any device) are stored as they are, under the
        checksum too, and come back as NumPy arrays in the loaded optimizer's ``arrays``."""
        state = dict(self.buffers)
        if np.ndim(self.decay):
            state["decay_mask"] = self.decay
        for name, value in (arrays or {}).items():
            if not isinstance(name, str):
                raise TypeError(f"arrays must be keyed by strings (names to load them by); got key {name!r}")
            state[checkpoint.ARRAY_PREFIX + name] = value
        host = {name: dispatch.host_array(value) for name, value in state.items()}
        meta = {
            "format": checkpoint.FORMAT,
            "t": self.t,
            "order": self.order,
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "max_norm": self.max_norm,
            "consensus": self.consensus,
            "topology": self.topology.name,
            "topology_kind": self.topology.kind,
            "extra": extra or {},
            "bytes_sent": self.bytes_sent.tolist(),
        }
        if self.compression is not None:
            meta["compression"] = dataclasses.asdict(self.compression)
        if self.outer is not None:
            meta["outer"] = dataclasses.asdict(self.outer)
        if self.compression is not None or self.outer is not None:
            meta["seed"] = self.seed
        if self.state_bits != 32:
            meta["state_bits"] = self.state_bits
        if self.storage:  # the buffers are written as the float32 numbers they hold (exactly)
            meta["storage"] = self.storage
        if self.topology.kind == "dense" and self.topology.static:
            meta["matrix"] = self.topology.matrix(self.workers, 0).tolist()
        checkpoint.write(path, meta, host)

    @classmethod
    def load(
        cls,
        path: Union[str, Path],
        *,
        like: Any = None,
        topology: Optional[Topology] = None,
        target: Optional[str] = None,
    ) -> DecentralizedAdamW:
        """Rebuild a saved optimizer. ``like`` (an array) chooses the device/library of the
        buffers (NumPy by default); a damaged or foreign file raises ValueError, a missing one
        FileNotFoundError."""
        if like is not None and not (
            isinstance(like, np.ndarray)
            or hasattr(like, "__dlpack__")
            or hasattr(like, "__cuda_array_interface__")
            or hasattr(like, "copy_to_host")
        ):
            raise TypeError(
                f"like must be an array whose library and device the buffers take (a NumPy array, torch "
                f"tensor, CuPy or Numba device array), or None for NumPy; got {like!r}"
            )
        meta, host = checkpoint.read(path)
        if meta.get("format") != checkpoint.FORMAT:
            raise ValueError(f"{path} has format {meta.get('format')!r}; expected {checkpoint.FORMAT!r}")
        if topology is None:
            if meta["topology_kind"] == "dense":
                if "matrix" not in meta:
                    raise ValueError(
                        f"{path} used a topology that changes with t ({meta['topology']!r}); pass it as topology="
                    )
                topology = from_matrix(np.asarray(meta["matrix"]), meta["topology"])
            else:
                topology = TOPOLOGIES[meta["topology"]]()
        else:
            check_is_topology(topology)
            if topology.name != meta["topology"]:
                raise ValueError(f"{path} was saved with topology {meta['topology']!r}, not {topology.name!r}")
        params = dispatch.as_like(host["params"], like, meta.get("storage"))
        optimizer = cls(
            params,
            topology=topology,
            order=meta["order"],
            lr=meta["lr"],
            betas=tuple(meta["betas"]),
            eps=meta["eps"],
            weight_decay=meta["weight_decay"],
            max_norm=meta["max_norm"],
            decay_mask=host.get("decay_mask", meta.get("decay")),
            consensus=meta["consensus"],
            target=target,
            compression=Compressor(**meta["compression"]) if "compression" in meta else None,
            seed=meta.get("seed", 0),
            outer=DiLoCo(**meta["outer"]) if "outer" in meta else None,
            state_bits=meta.get("state_bits", 32),
        )

        for name, buffer in optimizer.buffers.items():
            if name != "params":  # the rows the optimizer was made from
                dispatch.copy_into(buffer, host[name])
        optimizer.bytes_sent = np.asarray(meta.get("bytes_sent", optimizer.bytes_sent), np.float64)
        optimizer.t = meta["t"]
        optimizer.extra = meta["extra"]
        optimizer.arrays = {
            name[len(checkpoint.ARRAY_PREFIX) :]: value
            for name, value in host.items()
            if name.startswith(checkpoint.ARRAY_PREFIX)
        }
        return optimizer


def _forced_copy(operand: _arrays.Operand) -> np.ndarray:
    """A host operand's rows to copy to a forced GPU target, in a dtype the GPU array keeps:
    float16 as float16; bfloat16, which a Numba array cannot hold, refused."""
    if operand.storage == "bfloat16":
        raise TypeError(
            "params is a bfloat16 host array and the target is the GPU: Numba's device arrays have no "
            "bfloat16, so pass a torch CUDA tensor (the rows then stay where they are)"
        )
    return operand.value.view(np.float16) if operand.storage else operand.value


def step(
    params: Any,
    grads: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    *,
    t: int,
    topology: Topology,
    order: str = "awc",
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_norm: Optional[float] = None,
    decay_mask: Any = None,
    consensus: float = 1.0,
    target: Optional[str] = None,
) -> None:
    """One decentralized step (zero-based ``t``) on caller-owned [N, D] buffers, in place."""
    checks.counts(" (the zero-based step; bias corrections use t + 1)", t=(t, 0))
    for name, moments in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if moments is None:  # DecentralizedAdamW would start its own, and the step could not hand them back
            raise TypeError(
                f"{name} must be the [N, D] moments this step updates in place (zeros before the first step); got None"
            )
    workers = DecentralizedAdamW(
        params,
        topology=topology,
        order=order,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        max_norm=max_norm,
        decay_mask=decay_mask,
        consensus=consensus,
        target=target,
        exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq,
    )
    if workers.params is not params:
        raise TypeError("step() updates its buffers in place, so they must live on the target; use DecentralizedAdamW")
    workers.t = t
    workers.step(grads)
