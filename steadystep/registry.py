"""The catalog of formulas, the public wrappers built from them, and ``execute``/``catalog``."""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

import numpy as np

from steadystep import _arrays, dispatch
from steadystep.kernels import Row

__all__ = [
    "Formula",
    "PublicFunction",
    "catalog",
    "describe",
    "elementwise",
    "execute",
    "positional",
    "rowwise",
]

MODULES = ("autograd_graph", "autograd_ops", "gradient_descent", "training_stability", "numerical_stability")

ArrayLike = Union[float, np.ndarray, Any]  # Any: torch tensors, CuPy arrays, Numba device arrays


@dataclass(frozen=True)
class Formula:
    """One catalog entry: a formula source and what the catalog says about it."""

    module: str
    name: str
    parameters: tuple[str, ...]
    description: str
    formula: str
    kind: str
    source: Callable | Row

    def as_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "function": self.name,
            "parameters": list(self.parameters),
            "description": self.description,
            "formula": self.formula,
            "kind": self.kind,
            "targets": ["cpu", "cuda"],
        }


class PublicFunction(Protocol):
    """A dispatching function of the public modules, with its catalog entry."""

    formula: Formula

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def describe(source: Callable, kind: str = "elementwise") -> Formula:
    """Read a formula's catalog entry from its signature and docstring."""
    paragraphs = inspect.cleandoc(source.__doc__ or "").split("\n\n")
    return Formula(
        module=source.__module__.rsplit(".", 1)[-1],
        name=source.__name__,
        parameters=tuple(inspect.signature(source).parameters),
        description=paragraphs[0].replace("\n", " "),
        formula=paragraphs[1].replace("\n", " ") if len(paragraphs) > 1 else "",
        kind=kind,
        source=source,
    )


_USAGE = {
    "elementwise": (
        "Elementwise with NumPy broadcasting. Arguments may be Python/NumPy scalars, NumPy arrays,\n"
        "torch tensors (CPU or CUDA), CuPy arrays or Numba device arrays; the call runs where the\n"
        'arrays live (``target`` forces "cpu" or "cuda"). float32 stays float32, integers compute\n'
        "in float64. ``out`` receives the result in place. All-scalar calls return a Python float.\n"
    ),
    "row": (
        "Along the last axis of ``xs``, batched over the leading axes. ``xs`` may be a list, a NumPy\n"
        "array, a torch tensor (CPU or CUDA), a CuPy array or a Numba device array; the call runs\n"
        'where it lives (``target`` forces "cpu" or "cuda"). ``out`` receives the result in place.\n'
    ),
}


def _public(formula: Formula, signature: inspect.Signature, call: Any) -> PublicFunction:
    call.__name__ = call.__qualname__ = formula.name
    call.__module__ = f"steadystep.{formula.module}"
    call.__signature__ = signature
    call.__doc__ = f"{formula.description}\n\n    {formula.formula}\n\n{_USAGE[formula.kind]}"
    call.formula = formula
    return call


_OPTIONS = [
    inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[ArrayLike]),
    inspect.Parameter("target", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[str]),
]
_OPTION_NAMES = frozenset(option.name for option in _OPTIONS)


def rowwise(row: Row, module: str) -> PublicFunction:
    """The public, dispatching function for the row function ``row``."""
    formula = Formula(module, row.name, ("xs",), row.description, row.formula, "row", row)
    xs = inspect.Parameter("xs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ArrayLike)
    signature = inspect.Signature([xs, *_OPTIONS], return_annotation=ArrayLike)

    def function(xs: ArrayLike, *, out: Optional[ArrayLike] = None, target: Optional[str] = None) -> ArrayLike:
        operand = _arrays.classify("xs", xs)
        _arrays.check_untracked([operand], out)
        return dispatch.run_rows(module, row, operand, out, target)

    return _public(formula, signature, function)


def elementwise(source: Callable) -> PublicFunction:
    """The public, dispatching function for the elementwise formula ``source``."""
    formula = describe(source)
    positional = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ArrayLike)
        for name in formula.parameters
    ]
    signature = inspect.Signature(positional + _OPTIONS, return_annotation=ArrayLike)

    # dispatch.scalar_formula, looked up at the first call on Python numbers and kept here: a
    # functools.cache lookup instead would add a sixth to such calls
    scalar: list[Callable] = []

    def function(*args: ArrayLike, **kwargs: Any) -> ArrayLike:
        if not kwargs and len(args) == len(formula.parameters) and dispatch.python_numbers(args):
            if not scalar:
                scalar.append(dispatch.scalar_formula(formula.module, formula.name))
            return float(scalar[0](*map(float, args)))
        # The common call (operands positional, maybe out= and target=) skips bind(), which costs more than the call.
        if len(args) != len(formula.parameters) or not _OPTION_NAMES.issuperset(kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            args = tuple(bound[name] for name in formula.parameters)
            kwargs = bound
        return dispatch.call_elementwise(
            formula.module, formula.name, formula.parameters, args, kwargs.get("out"), kwargs.get("target")
        )

    return _public(formula, signature, function)


def _public_functions(module: str) -> dict[str, PublicFunction]:
    public = importlib.import_module(f"steadystep.{module}")
    return {name: getattr(public, name) for name in public.__all__}


def _lookup(module: str, function: str) -> PublicFunction:
    if module not in MODULES:
        close = difflib.get_close_matches(str(module), MODULES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; modules: {', '.join(MODULES)}"
        raise KeyError(f"unknown module {module!r}{hint}")
    functions = _public_functions(module)
    if function not in functions:
        close = difflib.get_close_matches(str(function), list(functions), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; {module} has {', '.join(functions)}"
        raise KeyError(f"unknown function {module}.{function}{hint}")
    return functions[function]


def _to_python(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def execute(module: str, function: str, args: Union[list[Any], dict[str, Any]]) -> dict[str, Any]:
    """Call ``steadystep.<module>.<function>`` by name: ``{"result": value}``.

    ``args`` lists the arguments in order, or maps their names to them. A row function takes
    its row as the list itself, as the seed document writes it, or as its one argument
    (``[[1000.0, 1000.0]]``). Lists in, lists out (``welford_mean_var`` gives
    ``[mean, variance]``); scalars in, a Python float out.

    >>> steadystep.execute("gradient_descent", "adam_update", [1.0, 0.2, 0.04, 0.1, 1e-8])
    {'result': 0.9000000049999998}
    >>> steadystep.execute("numerical_stability", "logsumexp", [1000.0, 1000.0])
    {'result': 1000.6931471805599}
    """
    callable_ = _lookup(module, function)
    if isinstance(args, (str, bytes)) or not isinstance(args, (dict, Sequence, np.ndarray)):
        raise TypeError(
            f"args must be a list of {module}.{function}'s arguments in order, or a dict of them by name; "
            f"got {type(args).__name__} {args!r}"[:300]
        )
    if isinstance(args, dict):
        return {"result": _to_python(callable_(**args))}
    return {"result": _to_python(callable_(*positional(module, function, args)))}


def positional(module: str, function: str, args: list[Any]) -> list[Any]:
    """The positional arguments ``execute`` passes for the list ``args``."""
    args = list(args)
    if _lookup(module, function).formula.kind == "row" and not (len(args) == 1 and np.ndim(args[0]) >= 1):
        return [args]  # the row itself (or [] for an empty row)
    return args


def catalog() -> list[dict[str, Any]]:
    """Every public function: module, name, parameters, description, formula, kind and targets."""
    return [callable_.formula.as_dict() for module in MODULES for callable_ in _public_functions(module).values()]
