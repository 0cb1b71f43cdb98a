"""Every entry point against hostile input: wrong dtypes (longdouble, complex, object, str, None),
mismatched and huge shapes, 0-d and empty arrays, a one-element array where a longer one is
needed, read-only, non-contiguous, partially overlapping, wrong-dtype or requires-grad
buffers, NaN/inf/out-of-range hyper-parameters and invalid step counts.

Each case takes a valid call (which is run once, to show it is valid), replaces one argument
with a bad value, and asserts: an exception of a documented type whose message names the
argument, and every array of the call (inputs, out, state) byte-identical afterwards. The
cases that would read or write out of bounds if a check were missing (other lengths, huge
and overlapping arrays) run in a subprocess, so that a crash fails the test instead of
killing the run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from steadystep import curvature, decentral, diagnostics, models, optim, registry
from steadystep.arena import Arena, Layout
from tests.conftest import TARGETS

# Bad input departs from data built for one target: the CPU where this process tests it,
# else the GPU (the simulator, or STEADYSTEP_TEST_TARGETS=cuda on a GPU machine).
TARGET = "cpu" if "cpu" in TARGETS else "cuda"
DOCUMENTED = (TypeError, ValueError, OverflowError, IndexError, FloatingPointError, MemoryError)
SIZE = 8
RISKY = {"shorter", "one element", "huge", "empty", "overlapping", "longer"}

try:
    import torch
except ImportError:  # the torch kinds are skipped
    torch = None


# -- what an argument is, and what is bad for it ----------------------------------------------


@dataclass
class Entry:
    """One entry point: ``build`` makes a valid call's arguments (fresh arrays), ``call`` runs it.

    ``roles`` says what each argument is: "read" (an array read element by element), "written"
    (a buffer written in place), "out", "broadcast" (an elementwise input: one element and 0-d
    broadcast, so they are valid), "one" (a one-element array: found_inf, grad_scale), "mask"
    (a 0/1 decay mask, any real dtype), "count" (a one-element step count), "rows" (a row
    function's input), "rate" (a number ≥ 0), "fraction" (a number in [0, 1]), "flag", "step"
    (an integer ≥ 1), "whole" (an integer ≥ 1), "betas", "callable", "estimate", "layout".
    ``names`` maps an argument to the name its messages use, where they differ.
    """

    name: str
    build: Callable[[], dict[str, Any]]
    call: Callable[[dict[str, Any]], Any]
    roles: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)
    optional: tuple[str, ...] = ()  # None is valid for these
    passes_through: tuple[type, ...] = ()  # what the caller's own code raises (a module's forward), as it raised it


def _floats(value: float = 0.5, size: int = SIZE, dtype: Any = np.float64) -> np.ndarray:
    return np.linspace(value, value + 0.25, size).astype(dtype)


def _readonly(array: np.ndarray) -> np.ndarray:
    copy = array.copy()
    copy.flags.writeable = False
    return copy


def _strided(array: np.ndarray) -> np.ndarray:
    return np.repeat(array, 2)[::2] if array.ndim == 1 else np.repeat(array, 2, axis=-1)[..., ::2]


def _tracked(array: np.ndarray) -> Any:
    return torch.from_numpy(array.copy()).requires_grad_()


ARRAY_KINDS: dict[str, Callable[[np.ndarray], Any]] = {
    # float16 and bfloat16 are storage dtypes steadystep computes on (tests/test_half_steps.py)
    "longdouble": lambda a: a.astype(np.longdouble),
    "complex": lambda a: a.astype(np.complex128),
    "object": lambda a: a.astype(object),
    "str": lambda a: "abc",
    "None": lambda a: None,
    "shorter": lambda a: a[..., :-1],
    "longer": lambda a: np.concatenate([a, a[..., :1]], axis=-1),
    "one element": lambda a: a.reshape(-1)[:1].copy(),
    "huge": lambda a: np.broadcast_to(a.reshape(-1)[:1], (2**40,)),
    "0-d": lambda a: np.array(a.reshape(-1)[0]),
    "empty": lambda a: a[..., :0],
    "number": lambda a: 0.5,
}
WRITTEN_KINDS: dict[str, Callable[[np.ndarray], Any]] = {
    "read-only": _readonly,
    "non-contiguous": _strided,
    "other float dtype": lambda a: a.astype(np.float32 if a.dtype == np.float64 else np.float64),
    "list": lambda a: a.tolist(),
    "requires grad": _tracked,
}
NUMBER_KINDS: dict[str, dict[str, Any]] = {
    "rate": {
        "nan": math.nan,
        "inf": math.inf,
        "negative": -1.0,
        "str": "0.1",
        "None": None,
        "array": np.ones(2),
        "bool": True,
        "beyond float64": 10**400,
    },
    "fraction": {"nan": math.nan, "above 1": 1.5, "negative": -0.5, "str": "0.5", "None": None, "array": np.ones(2)},
    "flag": {"str": "yes", "None": None, "two": 2, "float": 0.5},
    "step": {
        "zero": 0,
        "negative": -1,
        "fraction": 2.5,
        "bool": True,
        "beyond 2^53": 10**400,
        "nan": math.nan,
        "str": "1",
        "None": None,
    },
    "whole": {"zero": 0, "fraction": 2.5, "bool": True, "str": "3", "None": None, "nan": math.nan},
    "betas": {
        "one": 0.9,
        "nan": (0.9, math.nan),
        "above 1": (0.9, 1.5),
        "three": (0.9, 0.99, 0.1),
        "None": None,
        "str": "0.9",
    },
    "callable": {"None": None, "str": "hvp", "number": 1.0},
    "scale": {"nan": math.nan, "inf": -math.inf, "str": "0.5", "array": np.ones(2)},
    "estimate": {"None": None, "number": 0.5, "dict": {"value": 1.0}},
    "layout": {"None": None, "str": "whole", "shapes": [(8,)]},
}


def bad_values(entry: Entry, argument: str, value: Any) -> dict[str, Any]:
    """The bad kinds for one argument of ``entry`` (its valid value given), by kind name."""
    role = entry.roles[argument]
    if role in NUMBER_KINDS:
        return dict(NUMBER_KINDS[role])
    kinds = dict(ARRAY_KINDS)
    if argument in entry.optional:
        del kinds["None"]
    if role == "broadcast":  # a one-element or 0-d input broadcasts, a number is a number: valid
        for valid in ("one element", "0-d", "number"):
            del kinds[valid]
    if role == "one":  # a one-element flag or scale: the length kinds are what is bad
        for valid in ("one element", "0-d", "number", "shorter"):
            kinds.pop(valid, None)
        kinds["other float dtype"] = WRITTEN_KINDS["other float dtype"]
    if role == "mask":  # any real 0/1 mask is taken (longdouble too); values other than 0 and 1 are not
        del kinds["longdouble"]
        kinds["a half"] = lambda a: np.full_like(a, 0.5)
        kinds["nan"] = lambda a: np.where(np.arange(a.size) == 1, np.nan, a)
    if role == "count":
        for valid in ("one element", "0-d", "shorter", "empty"):
            kinds.pop(valid, None)
        kinds.update(
            {
                "negative count": lambda a: -np.ones_like(a),
                "nan count": lambda a: a * np.nan,
                "fractional count": lambda a: a + 0.5,
                "two elements": lambda a: np.repeat(a, 2),
                "read-only": _readonly,
                "other float dtype": WRITTEN_KINDS["other float dtype"],
            }
        )
    if role == "rows":
        for valid in ("one element", "shorter", "longer", "empty", "huge"):  # any row length is valid
            del kinds[valid]
    if role in ("written", "out"):
        kinds.update(WRITTEN_KINDS)
        if role == "out" and TARGET == "cpu":  # the CPU copies into a strided out, as a NumPy ufunc does
            del kinds["non-contiguous"]
    if torch is None:
        kinds.pop("requires grad", None)
    with np.errstate(all="ignore"), warnings.catch_warnings():  # casts overflow: the point
        warnings.simplefilter("ignore")
        if torch is not None and isinstance(value, torch.Tensor):  # made from NumPy, given back as tensors
            return {kind: _as_tensor(make(value.numpy())) for kind, make in kinds.items()}
        return {kind: make(value) for kind, make in kinds.items()}


def _as_tensor(value: Any) -> Any:
    if (
        isinstance(value, np.ndarray)
        and value.dtype.kind in "biufc"
        and value.dtype != np.longdouble  # torch has none: given as NumPy
        and value.flags.writeable
    ):
        return torch.from_numpy(np.ascontiguousarray(value))
    return value


# -- the entry points ----------------------------------------------------------------------------


def _public_functions() -> list[Any]:
    return [function for module in registry.MODULES for function in registry._public_functions(module).values()]


def _elementwise_entries() -> list[Entry]:
    entries = []
    for function in _public_functions():
        formula = function.formula
        if formula.kind != "elementwise":
            continue
        parameters = formula.parameters

        def build(parameters=parameters):
            return {
                **{name: _floats(0.5 + 0.1 * index) for index, name in enumerate(parameters)},
                "out": np.zeros(SIZE),
            }

        def call(args, function=function, parameters=parameters):
            return function(*(args[name] for name in parameters), out=args["out"], target=TARGET)

        roles = {name: "broadcast" for name in parameters}
        roles["out"] = "out"
        entries.append(Entry(f"{formula.module}.{formula.name}", build, call, roles, optional=("out",)))
    return entries


def _row_entries() -> list[Entry]:
    entries = []
    for function in _public_functions():
        if function.formula.kind != "row":
            continue

        # out's shape read from a call in the test, not at import: each pytest worker collecting
        # this module would compile every row kernel before any test ran
        def build(function=function):
            xs = np.linspace(-1, 1, 3 * 8).reshape(3, 8)
            return {"xs": xs, "out": np.zeros(np.shape(function(xs)))}

        entries.append(
            Entry(
                f"{function.formula.module}.{function.formula.name}",
                build,
                lambda args, function=function: function(args["xs"], out=args["out"], target=TARGET),
                {"xs": "rows", "out": "out"},
                optional=("out",),
            )
        )
    return entries


AMP = ("decay_mask", "found_inf", "grad_scale")


def _step_entry(
    name: str,
    call: Callable,
    buffers: tuple[str, ...],
    numbers: dict[str, str],
    extra: Callable[[], dict[str, Any]] = dict,
    amp: tuple[str, ...] = AMP,
    **extra_roles: str,
) -> Entry:
    """An optimizer step: its buffers, the AMP arguments it takes (``amp``), the numbers it
    checks, and ``extra()``'s further valid arguments (made afresh for each call)."""

    def build():
        args = {"param": _floats(1.0), "grad": _floats(-0.5)}
        for index, buffer in enumerate(buffers):
            args[buffer] = _floats(0.1 * (index + 1))
        args.update({"decay_mask": np.ones(SIZE), "found_inf": np.zeros(1), "grad_scale": np.ones(1)})
        args.update({key: value for key, value in VALID_NUMBERS.items() if key in numbers})
        return {**args, **extra()}

    roles = {"param": "written", "grad": "read", **{buffer: "written" for buffer in buffers}}
    roles.update(
        {
            name: role
            for name, role in {"decay_mask": "mask", "found_inf": "one", "grad_scale": "one"}.items()
            if name in amp
        }
    )
    roles.update({**numbers, **extra_roles})
    names = {"count": "step"} if "count" in extra_roles else {}  # a count array is passed as step=
    return Entry(f"optim.{name}", build, call, roles, names=names, optional=AMP)


VALID_NUMBERS = {
    "lr": 0.1,
    "momentum": 0.9,
    "dampening": 0.0,
    "weight_decay": 0.01,
    "nesterov": False,
    "maximize": False,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "amsgrad": False,
    "alpha": 0.99,
    "centered": False,
    "step": 2,
    "lr_decay": 0.01,
    "trust_coefficient": 1e-3,
    "decay": 0.9,
    "max_norm": 1.0,
}


def _amp(args):
    return {name: args[name] for name in AMP}


def _step_entries() -> list[Entry]:
    layout = Layout.whole(SIZE)
    return [
        _step_entry(
            "sgd",
            lambda a: optim.sgd(
                a["param"],
                a["grad"],
                a["momentum_buffer"],
                step=a["step"],
                lr=a["lr"],
                momentum=a["momentum"],
                dampening=a["dampening"],
                weight_decay=a["weight_decay"],
                nesterov=a["nesterov"],
                maximize=a["maximize"],
                **_amp(a),
                target=TARGET,
            ),
            ("momentum_buffer",),
            {
                "step": "step",
                "lr": "rate",
                "momentum": "rate",
                "dampening": "fraction",
                "weight_decay": "rate",
                "nesterov": "flag",
                "maximize": "flag",
            },
        ),
        _step_entry(
            "adamw",
            lambda a: optim.adamw(
                a["param"],
                a["grad"],
                a["exp_avg"],
                a["exp_avg_sq"],
                a["max_exp_avg_sq"],
                step=a["step"],
                lr=a["lr"],
                betas=a["betas"],
                eps=a["eps"],
                weight_decay=a["weight_decay"],
                amsgrad=True,
                maximize=a["maximize"],
                **_amp(a),
                target=TARGET,
            ),
            ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
            {"step": "step", "lr": "rate", "betas": "betas", "eps": "rate", "weight_decay": "rate", "maximize": "flag"},
        ),
        _step_entry(
            "adam (count array)",
            lambda a: optim.adam(
                a["param"],
                a["grad"],
                a["exp_avg"],
                a["exp_avg_sq"],
                step=a["count"],
                lr=a["lr"],
                amsgrad=a["amsgrad"],
                **_amp(a),
                target=TARGET,
            ),
            ("exp_avg", "exp_avg_sq"),
            {"lr": "rate", "amsgrad": "flag"},
            extra=lambda: {"count": np.ones(1)},  # one step taken
            count="count",
        ),
        _step_entry(
            "rmsprop",
            lambda a: optim.rmsprop(
                a["param"],
                a["grad"],
                a["square_avg"],
                a["grad_avg"],
                a["momentum_buffer"],
                lr=a["lr"],
                alpha=a["alpha"],
                eps=a["eps"],
                weight_decay=a["weight_decay"],
                momentum=a["momentum"],
                centered=True,
                maximize=a["maximize"],
                **_amp(a),
                target=TARGET,
            ),
            ("square_avg", "grad_avg", "momentum_buffer"),
            {
                "lr": "rate",
                "alpha": "fraction",
                "eps": "rate",
                "weight_decay": "rate",
                "momentum": "rate",
                "maximize": "flag",
            },
        ),
        _step_entry(
            "adagrad",
            lambda a: optim.adagrad(
                a["param"],
                a["grad"],
                a["state_sum"],
                step=a["step"],
                lr=a["lr"],
                lr_decay=a["lr_decay"],
                weight_decay=a["weight_decay"],
                eps=a["eps"],
                maximize=a["maximize"],
                **_amp(a),
                target=TARGET,
            ),
            ("state_sum",),
            {
                "step": "step",
                "lr": "rate",
                "lr_decay": "rate",
                "weight_decay": "rate",
                "eps": "rate",
                "maximize": "flag",
            },
        ),
        _lars(layout),
        _step_entry(
            "lion",
            lambda a: optim.lion(
                a["param"],
                a["grad"],
                a["exp_avg"],
                lr=a["lr"],
                betas=a["betas"],
                weight_decay=a["weight_decay"],
                maximize=a["maximize"],
                **_amp(a),
                target=TARGET,
            ),
            ("exp_avg",),
            {"lr": "rate", "betas": "betas", "weight_decay": "rate", "maximize": "flag"},
        ),
    ]


def _lars(layout: Layout) -> Entry:
    return _step_entry(
        "lars",
        lambda a: optim.lars(
            a["param"],
            a["grad"],
            a["momentum_buffer"],
            layout=a["layout"],
            lr=a["lr"],
            trust_coefficient=a["trust_coefficient"],
            momentum=a["momentum"],
            weight_decay=a["weight_decay"],
            eps=a["eps"],
            maximize=a["maximize"],
            found_inf=a["found_inf"],
            grad_scale=a["grad_scale"],
            target=TARGET,
        ),
        ("momentum_buffer",),
        {
            "lr": "rate",
            "trust_coefficient": "rate",
            "momentum": "rate",
            "weight_decay": "rate",
            "eps": "rate",
            "maximize": "flag",
            "layout": "layout",
        },
        extra=lambda: {"layout": layout},
        amp=("found_inf", "grad_scale"),  # LARS takes its mask per tensor, not this per-element one
    )


def _utility_entries() -> list[Entry]:
    return [
        Entry(
            "optim.accumulate",
            lambda: {"total": _floats(), "grad": _floats(-1.0), "scale": 0.25, "found_inf": np.zeros(1)},
            lambda a: optim.accumulate(
                a["total"], a["grad"], scale=a["scale"], found_inf=a["found_inf"], target=TARGET
            ),
            {"total": "written", "grad": "read", "scale": "scale", "found_inf": "one"},
            optional=("found_inf",),
        ),
        Entry(
            "optim.ema",
            lambda: {"average": _floats(), "param": _floats(-1.0), "decay": 0.9},
            lambda a: optim.ema(a["average"], a["param"], decay=a["decay"], target=TARGET),
            {"average": "written", "param": "read", "decay": "fraction"},
        ),
        Entry(
            "optim.clip_grad_norm",
            lambda: {"grad": _floats(3.0), "max_norm": 1.0},
            lambda a: optim.clip_grad_norm(a["grad"], a["max_norm"], target=TARGET),
            {"grad": "written", "max_norm": "rate"},
        ),
        Entry(
            "optim.found_nonfinite",
            lambda: {"grad": _floats(), "out": np.zeros(1)},
            lambda a: optim.found_nonfinite(a["grad"], out=a["out"], target=TARGET),
            {"grad": "rows", "out": "out"},
            optional=("out",),
        ),
        Entry(
            "optim.update_loss_scale",
            lambda: {
                "scale": np.array([65536.0]),
                "growth_tracker": np.zeros(1),
                "found_inf": np.zeros(1),
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 10,
            },
            lambda a: optim.update_loss_scale(
                a["scale"],
                a["growth_tracker"],
                a["found_inf"],
                growth_factor=a["growth_factor"],
                backoff_factor=a["backoff_factor"],
                growth_interval=a["growth_interval"],
                target=TARGET,
            ),
            {
                "scale": "one",
                "growth_tracker": "one",
                "found_inf": "one",
                "growth_factor": "rate",
                "backoff_factor": "fraction",
                "growth_interval": "whole",
            },
        ),
        Entry(
            "optim.sum_of_squares",
            lambda: {"x": _floats(), "layout": Layout.whole(SIZE)},
            lambda a: optim.sum_of_squares(a["x"], a["layout"], target=TARGET),
            {"x": "rows", "layout": "layout"},
        ),
    ]


def _arena_entries() -> list[Entry]:
    return [
        Entry(
            "Arena.pack",
            lambda: {"tensors": [np.ones((2, 3)), np.zeros(4)]},
            lambda a: Arena.pack(a["tensors"]),
            {"tensors": "callable"},
        ),
        Entry(
            "Layout.of", lambda: {"shapes": [(2, 3), (4,)]}, lambda a: Layout.of(a["shapes"]), {"shapes": "callable"}
        ),
        Entry(
            "Arena",
            lambda: {"buffer": np.zeros(64), "layout": Layout.of([(3,)])},
            lambda a: Arena(a["buffer"], a["layout"]),
            {"layout": "layout"},
        ),
        Entry("Layout.mask", lambda: {"rule": len}, lambda a: Layout.of([(3,)]).mask(a["rule"]), {"rule": "callable"}),
        Entry(
            "Arena.view",
            lambda: {"index": 0},
            lambda a: Arena.pack([np.ones(3)]).view(a["index"]),
            {"index": "callable"},
        ),
    ]


def _decentral_entries() -> list[Entry]:
    def build():
        return {
            "params": np.tile(_floats(), (4, 1)),
            "decay_mask": np.ones(SIZE),
            "lr": 1e-3,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 0.1,
            "max_norm": 1.0,
            "consensus": 1.0,
            "topology": decentral.ring(),
        }

    def construct(a):
        return decentral.DecentralizedAdamW(
            a["params"],
            topology=a["topology"],
            lr=a["lr"],
            betas=a["betas"],
            eps=a["eps"],
            weight_decay=a["weight_decay"],
            max_norm=a["max_norm"],
            decay_mask=a["decay_mask"],
            consensus=a["consensus"],
            target=TARGET,
        )

    def stepped(a):
        workers = construct({**build(), "params": a["params"]})
        workers.step(a["grads"], lr=a["lr"])

    return [
        Entry(
            "DecentralizedAdamW",
            build,
            construct,
            {
                "params": "written",
                "decay_mask": "mask",
                "lr": "rate",
                "betas": "betas",
                "eps": "rate",
                "weight_decay": "rate",
                "max_norm": "rate",
                "consensus": "fraction",
                "topology": "callable",
            },
            optional=("decay_mask",),
        ),
        Entry(
            "DecentralizedAdamW.step",
            lambda: {"params": np.tile(_floats(), (4, 1)), "grads": np.tile(_floats(-1.0), (4, 1)), "lr": 1e-3},
            stepped,
            {"grads": "read", "lr": "rate"},
        ),
        Entry(
            "decentral.consensus_errors",
            lambda: {"params": np.tile(_floats(), (4, 1))},
            lambda a: decentral.consensus_errors(a["params"]),
            {"params": "rows"},
        ),
    ]


def _model_entries() -> list[Entry]:
    model = models.mlp(features=3, hidden=4, classes=2)

    def build():
        rng = np.random.default_rng(0)
        params = model.init(workers=2, dtype=np.float64)
        return {
            "params": params,
            "features": rng.normal(size=(5, 3)),
            "labels": np.array([0, 1, 0, 1, 1]),
            "tangent": np.ones_like(params),
            "out": np.zeros_like(params),
        }

    return [
        Entry(
            "Model.loss_and_grad",
            build,
            lambda a: model.loss_and_grad(a["params"], a["features"], a["labels"], out=a["out"]),
            {"params": "rows", "features": "rows", "labels": "rows", "out": "out"},
            optional=("out",),
        ),
        Entry(
            "Model.hvp",
            build,
            lambda a: model.hvp(a["params"], a["tangent"], a["features"], a["labels"], out=a["out"]),
            {"tangent": "rows", "out": "out"},
            optional=("out",),
        ),
    ]


def _diagnostics_entries() -> list[Entry]:
    hvp = diagnostics.matrix_hvp(np.diag([2.0, 1.0, 0.5]))

    def build():
        return {
            "hvp": hvp,
            "mean_gradient": np.zeros(3),
            "gradients": np.eye(3),
            "dim": 3,
            "vectors": 4,
            "alignment": diagnostics.Estimate(1.0, 0.1),
            "reference": diagnostics.Estimate(0.5, 0.05),
            "params": np.eye(3),
            "hessian": np.eye(3),
            "k": 2,
            "max_steps": 3,
            "max_probes": 40,
            "probes": 2,
            "steps": 3,
        }

    return [
        Entry(
            "diagnostics.noise_alignment",
            build,
            lambda a: diagnostics.noise_alignment(a["hvp"], a["mean_gradient"], a["gradients"]),
            {"hvp": "callable", "mean_gradient": "rows", "gradients": "rows"},
        ),
        Entry(
            "diagnostics.isotropic_reference",
            build,
            lambda a: diagnostics.isotropic_reference(a["hvp"], a["dim"], vectors=a["vectors"]),
            {"hvp": "callable", "dim": "whole", "vectors": "whole"},
        ),
        Entry(
            "diagnostics.consensus_alignment",
            build,
            lambda a: diagnostics.consensus_alignment(a["hvp"], a["params"]),
            {"hvp": "callable", "params": "rows"},
            names={"hvp": "hvp_at_mean"},
        ),
        Entry(
            "diagnostics.anisotropy",
            build,
            lambda a: diagnostics.anisotropy(a["alignment"], a["reference"]),
            {"alignment": "estimate", "reference": "estimate"},
        ),
        Entry("diagnostics.matrix_hvp", build, lambda a: diagnostics.matrix_hvp(a["hessian"]), {"hessian": "rows"}),
        Entry(
            "curvature.top_eigenpairs",
            build,
            lambda a: curvature.top_eigenpairs(a["hvp"], a["dim"], k=a["k"], max_steps=a["max_steps"]),
            {"hvp": "callable", "dim": "whole", "k": "whole"},
        ),
        Entry(
            "curvature.hessian_trace",
            build,
            lambda a: curvature.hessian_trace(a["hvp"], a["dim"], max_probes=a["max_probes"]),
            {"hvp": "callable", "dim": "whole", "max_probes": "whole"},
        ),
        Entry(
            "curvature.spectral_density",
            build,
            lambda a: curvature.spectral_density(a["hvp"], a["dim"], probes=a["probes"], steps=a["steps"]),
            {"hvp": "callable", "dim": "whole", "probes": "whole", "steps": "whole"},
        ),
    ]


def _torch_entries() -> list[Entry]:
    if torch is None or TARGET != "cpu":  # torch CPU tensors run on the CPU target
        return []
    import steadystep.torch
    from steadystep.torch.decentral import DecentralizedTrainer

    def module():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))

    def build():
        return {
            "lr": 1e-3,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 0.01,
            "amsgrad": False,
            "maximize": False,
            "momentum": 0.9,
            "dampening": 0.0,
            "nesterov": False,
            "workers": 2,
            "max_norm": 1.0,
            "inputs": torch.ones(2, 5, 3),
            "targets": torch.zeros(2, 5, dtype=torch.long),
        }

    def stepped(a):
        trainer = DecentralizedTrainer(module(), 2, topology=decentral.ring(), lr=1e-3)
        trainer.step(a["inputs"], a["targets"])

    return [
        Entry(
            "steadystep.torch.AdamW",
            build,
            lambda a: steadystep.torch.AdamW(
                module().parameters(),
                lr=a["lr"],
                betas=a["betas"],
                eps=a["eps"],
                weight_decay=a["weight_decay"],
                amsgrad=a["amsgrad"],
                maximize=a["maximize"],
            ),
            {
                "lr": "rate",
                "betas": "betas",
                "eps": "rate",
                "weight_decay": "rate",
                "amsgrad": "flag",
                "maximize": "flag",
            },
        ),
        Entry(
            "steadystep.torch.SGD",
            build,
            lambda a: steadystep.torch.SGD(
                module().parameters(),
                lr=a["lr"],
                momentum=a["momentum"],
                dampening=a["dampening"],
                nesterov=a["nesterov"],
                maximize=a["maximize"],
            ),
            {"lr": "rate", "momentum": "rate", "dampening": "fraction", "nesterov": "flag", "maximize": "flag"},
        ),
        Entry(
            "DecentralizedTrainer",
            build,
            lambda a: DecentralizedTrainer(
                module(),
                a["workers"],
                topology=decentral.ring(),
                lr=a["lr"],
                betas=a["betas"],
                eps=a["eps"],
                weight_decay=a["weight_decay"],
                max_norm=a["max_norm"],
            ),
            {
                "workers": "whole",
                "lr": "rate",
                "betas": "betas",
                "eps": "rate",
                "weight_decay": "rate",
                "max_norm": "rate",
            },
        ),
        # inputs of a dtype the module cannot take fail in its forward, with torch's error, before any write
        Entry(
            "DecentralizedTrainer.step",
            build,
            stepped,
            {"inputs": "rows", "targets": "rows"},
            passes_through=(RuntimeError,),
        ),
    ]


ENTRIES = [
    *_elementwise_entries(),
    *_row_entries(),
    *_step_entries(),
    *_utility_entries(),
    *_arena_entries(),
    *_decentral_entries(),
    *_model_entries(),
    *_diagnostics_entries(),
    *_torch_entries(),
]
BY_NAME = {entry.name: entry for entry in ENTRIES}

# What an argument takes by design although it is on the list of bad kinds (each said in the
# closing note): host data that the diagnostics and models convert (float16 features, say), a
# flag or norm of any length, and the documented meanings of None and inf.
VALID_FOR = {
    ("diagnostics.noise_alignment", "mean_gradient"): {"longdouble"},
    ("diagnostics.noise_alignment", "gradients"): {"longdouble", "one element", "number", "0-d"},
    ("diagnostics.consensus_alignment", "params"): {"longdouble"},
    ("diagnostics.matrix_hvp", "hessian"): {"longdouble"},
    ("Model.loss_and_grad", "features"): {"longdouble"},
    ("decentral.consensus_errors", "params"): {"longdouble", "other float dtype"},
    ("optim.found_nonfinite", "grad"): {"0-d", "longdouble"},
    ("optim.sum_of_squares", "x"): {"0-d"},
    ("optim.sum_of_squares", "layout"): {"None"},  # the whole buffer as one tensor
    ("optim.clip_grad_norm", "grad"): {"other float dtype", "0-d", "shorter", "longer", "one element", "empty"},
    ("optim.found_nonfinite", "out"): {"one element"},  # the flag is one element
    ("optim.clip_grad_norm", "max_norm"): {"inf"},  # torch's idiom for no clipping
    ("DecentralizedAdamW", "params"): {"other float dtype"},  # params decide the dtype
    ("DecentralizedAdamW", "max_norm"): {"inf", "None"},  # no clipping
    ("DecentralizedAdamW.step", "lr"): {"None"},  # the optimizer's own lr
    ("DecentralizedTrainer", "max_norm"): {"inf", "None"},  # no clipping
}
if TARGET == "cuda":  # host data on a forced GPU target: copied there (and results back into a host out)
    VALID_FOR[("optim.found_nonfinite", "out")] |= {"non-contiguous"}
    VALID_FOR[("DecentralizedAdamW", "params")] |= {"read-only", "non-contiguous", "list"}


def cases(risky: bool) -> list[tuple[str, str, str]]:
    found = []
    for entry in ENTRIES:
        args = entry.build()
        for argument in entry.roles:
            for kind in bad_values(entry, argument, args[argument]):
                if (kind in RISKY) == risky:
                    found.append((entry.name, argument, kind))
    return found


def _snapshot(args: dict[str, Any]) -> dict[str, bytes]:
    def bytes_of(value):
        if isinstance(value, np.ndarray) and value.dtype != object and value.flags.writeable:  # not a huge view
            return value.tobytes()
        if torch is not None and isinstance(value, torch.Tensor):
            return value.detach().numpy().tobytes()
        return None

    return {name: bytes_of(value) for name, value in args.items() if bytes_of(value) is not None}


def run_case(entry_name: str, argument: str, kind: str) -> str | None:
    """None when the case behaves, else what went wrong."""
    entry = BY_NAME[entry_name]
    args = entry.build()
    bad = bad_values(entry, argument, args[argument])[kind]
    if kind == "overlapping":  # this buffer and the next array argument, views of one buffer one element apart
        others = [
            name
            for name, role in entry.roles.items()
            if name != argument
            and role in ("written", "read")
            and isinstance(args[name], np.ndarray)
            and args[name].shape == args[argument].shape
        ]
        if not others:
            return None
        base = np.concatenate([args[argument].reshape(-1), args[argument].reshape(-1)[:1]])
        args[others[0]], bad = base[1:].reshape(args[argument].shape), base[:-1].reshape(args[argument].shape)
    args[argument] = bad
    before = _snapshot(args)
    try:
        entry.call(args)
    except DOCUMENTED as error:
        name = entry.names.get(argument, argument)
        shared = kind == "overlapping" and "share memory" in str(error)
        if name not in str(error) and not shared:
            return f"{type(error).__name__} does not name {name}: {error}"
    except Exception as error:  # noqa: BLE001 - what the test is about
        if not isinstance(error, entry.passes_through):
            return f"undocumented {type(error).__name__}: {error}"
    else:
        if kind not in VALID_FOR.get((entry_name, argument), set()):
            return "accepted"
        return None
    if _snapshot(args) != before:
        changed = [name for name, data in _snapshot(args).items() if before.get(name) != data]
        return f"wrote {', '.join(changed)} though the call failed"
    return None


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.name)
def test_the_valid_call_of_each_entry_runs(entry, target):
    """The base every bad case departs from is itself valid (on the target this process tests)."""
    if target != TARGET:
        pytest.skip(f"this process builds bad input for {TARGET}")
    entry.call(entry.build())


def test_at_least_twelve_kinds_of_bad_input_reach_every_entry():
    kinds = {kind for _, _, kind in cases(False) + cases(True)}
    assert len(kinds) >= 12 and len(ENTRIES) >= 80
    assert {entry.name.split(".")[0] for entry in ENTRIES} >= {
        "optim",
        "Arena",
        "Layout",
        "DecentralizedAdamW",
        "Model",
        "diagnostics",
        "numerical_stability",
    }


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.name)
def test_bad_input_is_refused_by_name_with_nothing_written(entry, target):
    assert target == TARGET
    failures = []
    for name, argument, kind in cases(False):
        if name == entry.name:
            problem = run_case(name, argument, kind)
            if problem:
                failures.append(f"{argument} ({kind}): {problem}")
    assert not failures, "\n".join(failures)


def run_risky_cases() -> None:
    """In a subprocess: each risky case, announced before it runs (a crash then names it)."""
    results = {}
    for case in cases(True):
        print("start", json.dumps(case), flush=True)
        results[" / ".join(case)] = run_case(*case)
    print("results", json.dumps(results), flush=True)


@pytest.mark.slow  # starts processes of its own
def test_cases_that_could_read_or_write_out_of_bounds_are_refused_in_a_subprocess(target):
    """Other lengths, huge and overlapping arrays: run apart, so that a segfault (the loss-scale
    step read past a short found_inf) fails this test instead of ending the run."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    finished = subprocess.run(
        [sys.executable, "-c", "from tests.test_bad_input import run_risky_cases; run_risky_cases()"],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        env=environment,
        timeout=1200,
    )
    lines = finished.stdout.splitlines()
    if finished.returncode != 0:
        started = [line for line in lines if line.startswith("start ")]
        pytest.fail(
            f"the subprocess ended with {finished.returncode} during {started[-1] if started else 'import'}:\n"
            f"{finished.stderr[-3000:]}"
        )
    results = json.loads(next(line for line in lines if line.startswith("results "))[len("results ") :])
    failures = [f"{case}: {problem}" for case, problem in results.items() if problem]
    assert len(results) >= 100 and not failures, "\n".join(failures)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- five inputs that once failed without saying what was wrong ----------------------------------


@pytest.mark.parametrize("scale", [np.float16(2), np.int8(2), np.float32(2), np.bool_(True)], ids=repr)
def test_a_numpy_number_of_any_real_type_is_a_grad_scale(scale, target):
    """It was an AttributeError nine frames down for float16: now the float it stands for."""

    def step(grad_scale):
        param, grad = np.linspace(-1, 1, SIZE), np.linspace(0.5, -0.25, SIZE)
        exp_avg, exp_avg_sq = np.zeros(SIZE), np.zeros(SIZE)
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, lr=0.1, grad_scale=grad_scale, target=target)
        return param, exp_avg, exp_avg_sq

    for ours, expected in zip(step(scale), step(float(scale)), strict=True):
        np.testing.assert_array_equal(ours, expected)
    if float(scale) != 1.0:  # the scale is used, not dropped
        assert not np.array_equal(step(scale)[1], step(1.0)[1])


def test_a_complex_grad_scale_is_refused_by_name():
    param = np.ones(SIZE)
    with pytest.raises(TypeError, match="grad_scale is complex"):
        optim.adamw(param, np.ones(SIZE), np.zeros(SIZE), np.zeros(SIZE), step=1, grad_scale=np.complex64(2))
    np.testing.assert_array_equal(param, np.ones(SIZE))


def test_load_with_a_topology_name_says_which_function_builds_it(tmp_path):
    decentral.DecentralizedAdamW(np.zeros((4, 3)), topology=decentral.ring()).save(tmp_path / "run.npz")
    with pytest.raises(TypeError, match=r"got the name 'ring': pass decentral.ring\(\)"):
        decentral.DecentralizedAdamW.load(tmp_path / "run.npz", topology="ring")
    with pytest.raises(TypeError, match="topology must be a Topology, such as decentral.ring()"):
        decentral.DecentralizedAdamW.load(tmp_path / "run.npz", topology=3)
    # the constructor alike
    with pytest.raises(TypeError, match=r"got the name 'complete': pass decentral.complete\(\)"):
        decentral.DecentralizedAdamW(np.zeros((4, 3)), topology="complete")
    assert decentral.DecentralizedAdamW.load(tmp_path / "run.npz", topology=decentral.ring()).topology.name == "ring"


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("params", [None, 5, "weights", {"params": []}], ids=repr)
def test_a_drop_in_without_an_iterable_of_parameters_says_what_params_must_be(params):
    import steadystep.torch

    with pytest.raises(TypeError, match=r"params must be an iterable of tensors or of dicts .*model.parameters\(\)"):
        steadystep.torch.SGD(params, lr=0.1)
    with pytest.raises(TypeError, match="params must be an iterable"):
        steadystep.torch.AdamW(torch.zeros(3, requires_grad=True))


def test_strings_as_hessian_vector_points_or_vectors_are_refused_by_name():
    model = models.mlp(4, 3, 2)
    features, labels = np.linspace(0, 1, 20).reshape(5, 4), np.array([0, 1, 0, 1, 1])
    point = np.linspace(-0.5, 0.5, model.dim)
    with pytest.raises(TypeError, match="point has unsupported dtype <U"):
        model.hvp_at("0.5", features, labels)
    product = model.hvp_at(point, features, labels)
    with pytest.raises(TypeError, match="vectors has unsupported dtype <U"):
        product([["1"] * model.dim])
    assert product(np.ones(model.dim)).shape == (1, model.dim)  # numbers still work, as a list too
    assert product([1.0] * model.dim).shape == (1, model.dim)
    with pytest.raises(TypeError, match="point has unsupported dtype <U"):
        diagnostics.finite_difference_hvp(lambda x: 2 * x, ["a", "b"])
    product = diagnostics.finite_difference_hvp(lambda x: 2 * x, np.ones(2))
    with pytest.raises(TypeError, match="vectors has unsupported dtype <U"):
        product("ab")
    np.testing.assert_allclose(product([[1.0, 0.0]]), [[2.0, 0.0]])


def test_a_broadcast_row_too_large_for_memory_says_its_size():
    """2^60 float32 elements (a broadcast view of one number): the row functions copy it to
    one contiguous array first, and that copy is refused with its size, not NumPy's words."""
    from steadystep import numerical_stability

    huge = np.broadcast_to(np.float32(1), (2**60,))
    for function in (numerical_stability.softmax, numerical_stability.logsumexp, numerical_stability.kahan_sum):
        with pytest.raises(MemoryError, match=r"xs of shape \(1152921504606846976,\), .* needs 4.29e\+09 GiB"):
            function(huge)
