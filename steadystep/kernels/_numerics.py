"""Scalar helpers shared by the formulas (compiled alongside them, never public)."""

import math


def sign(x):
    """-1, 0 or +1 with the sign of x; NaN stays NaN."""
    if x > 0.0:
        return 1.0
    if x < 0.0:
        return -1.0
    if x == 0.0:
        return 0.0
    return x


def is_integer(x):
    """True when x is a finite whole number."""
    return x % 1.0 == 0.0


def cospi(x):
    """cos(π·x); on CUDA, libdevice's exactly reduced cospi."""
    return math.cos(math.pi * x)
