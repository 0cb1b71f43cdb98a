"""Checks of hyper-parameters and flags, written once and used by every entry point.

Each check raises before anything is written, naming the argument as the caller wrote it and
saying what is expected: a ``TypeError`` for the wrong kind of value (a string, None, an
array where a number belongs), a ``ValueError`` for a value of the right kind outside its
range (NaN and ±inf included, wherever they would silently turn parameters into NaN).
Arrays are checked by `steadystep.dispatch`, which classifies them.

>>> from steadystep import checks
>>> checks.in_range("decay", 0.9, 0.0, 1.0)
0.9
>>> checks.non_negative(lr=float("nan"))
Traceback (most recent call last):
...
ValueError: lr must be a finite number ≥ 0 (torch.optim refuses negatives too); got nan
>>> checks.flag("maximize", "yes")
Traceback (most recent call last):
...
TypeError: maximize must be True or False; got 'yes'
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = [
    "betas",
    "count",
    "counts",
    "flag",
    "in_range",
    "is_number",
    "non_negative",
    "number",
    "sgd_options",
    "step",
    "LARGEST_STEP",
]

LARGEST_STEP = 2**53  # the largest count float64 holds exactly (a bias correction computes with it)
_UNBOUNDED = ("max_norm",)  # inf is torch's idiom for a norm with no clipping


def number(name: str, value: Any) -> float:
    """``value`` as a float: a Python or NumPy real number, or a 0-d array or tensor holding one.
    A bool, a string, None or an array of several numbers is a TypeError naming ``name``."""
    if type(value) is float:  # the usual case first
        return value
    if isinstance(value, (bool, np.bool_)) or not is_number(value):
        raise TypeError(f"{name} must be a real number; got {_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is an integer beyond float64's range; got {_shown(value)}") from None


def in_range(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
    why: str = "",
) -> float:
    """``number(name, value)`` that lies in [low, high] (an end excluded if open; NaN never lies
    anywhere; ±inf only with ``finite=False``), or a ValueError naming the range."""
    if (
        type(value) is float
        and math.isfinite(value)
        and (low < value or (value == low and not low_open))
        and (value < high or (value == high and not high_open))
    ):  # the usual case, without the calls
        return value
    result = number(name, value)
    above = result > low if low_open else result >= low
    below = result < high if high_open else result <= high
    if not (above and below and (math.isfinite(result) or not finite)):
        interval = f"{'(' if low_open else '['}{_end(low)}, {_end(high)}{')' if high_open else ']'}"
        kind = "a finite number" if finite else "a number"
        if high == math.inf and low > -math.inf:
            requirement = f"{kind} {'>' if low_open else '≥'} {_end(low)}"
        elif low == -math.inf and high == math.inf:
            requirement = kind
        else:
            requirement = f"{kind} in {interval}"
        raise ValueError(f"{name} must be {requirement}{why}; got {_shown(value)}")
    return result


def non_negative(**values: Any) -> None:
    """Each a finite number ≥ 0 (``max_norm`` may be inf): NaN or inf would silently turn every
    parameter into NaN or ±inf, where torch.optim refuses negatives only."""
    for name, value in values.items():
        if type(value) is float and 0.0 <= value < math.inf:  # the usual case, without the calls
            continue
        in_range(name, value, 0.0, math.inf, finite=name not in _UNBOUNDED, why=" (torch.optim refuses negatives too)")


def flag(name: str, value: Any) -> bool:
    """A switch: True or False (NumPy's bools and the integers 0 and 1 too). A string such as
    'yes' or None is a TypeError: read as truthy or falsy it would silently decide for the caller."""
    if value is True or value is False:
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False; got {_shown(value)}")


def count(name: str, value: Any, least: int = 0, most: int | None = None, why: str = "") -> int:
    """A whole number in [least, most] (a count: workers, probes, a step), or a ValueError naming
    it (``why``, if given, follows the bound); a float or a bool is not a count."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be a whole number ≥ {least}{why}, got {_shown(value)}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be a whole number ≤ {most}{why}, got {_shown(value)}")
    return int(value)


def counts(why: str = "", /, **values: tuple[Any, int]) -> None:
    """[`count()`][steadystep.checks.count] for each ``name=(value, least)``."""
    for name, (value, least) in values.items():
        count(name, value, least, why=why)


def step(value: Any) -> int:
    """An optimizer's step count, from 1 as in torch.optim."""
    if type(value) is int and 1 <= value <= LARGEST_STEP:
        return value
    return count("step", value, 1, LARGEST_STEP, " (the count of this step, as in torch.optim)")


def sgd_options(momentum: float, dampening: float, nesterov: Any) -> bool:
    """SGD's options beyond the rates (torch's checks, plus NaN and a dampening outside [0, 1]);
    returns nesterov as a bool."""
    in_range("dampening", dampening, 0.0, 1.0)
    nesterov = flag("nesterov", nesterov)
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ValueError("nesterov needs momentum > 0 and dampening = 0 (as in torch.optim.SGD)")
    return nesterov


def betas(value: Any) -> tuple[float, float]:
    """A pair of numbers in [0, 1)."""
    if (
        type(value) is tuple
        and len(value) == 2
        and type(value[0]) is float
        and type(value[1]) is float
        and (0.0 <= value[0] < 1.0 and 0.0 <= value[1] < 1.0)
    ):
        return value
    try:
        beta1, beta2 = value
        pair = (
            in_range("betas[0]", beta1, 0.0, 1.0, high_open=True),
            in_range("betas[1]", beta2, 0.0, 1.0, high_open=True),
        )
    except (TypeError, ValueError):  # not a pair, or not numbers in range
        raise ValueError(f"betas must be a pair of numbers in [0, 1); got {_shown(value)}") from None
    return pair


def is_number(value: Any) -> bool:
    """A real number, or a 0-d array or tensor of one (a learning rate kept as a tensor)."""
    if isinstance(value, numbers.Real):
        return True
    dtype = str(getattr(value, "dtype", ""))
    return getattr(value, "ndim", None) == 0 and ("float" in dtype or "int" in dtype)


def _end(bound: float) -> str:
    return {math.inf: "∞", -math.inf: "-∞"}.get(bound, f"{bound:g}")


def _shown(value: Any) -> str:
    """``repr`` cut short: an array or a long string would swamp the message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
