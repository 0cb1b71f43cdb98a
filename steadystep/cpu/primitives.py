"""Device primitives the generated CPU kernels import (see steadystep/_primitives.py).

``log1p_f32``/``log1p_f64`` replace the formula helper ``log1p`` on the CPU. glibc's
``log1pf`` takes ~3.5× as long as its ``logf`` (4.6 against 0.86 ms for 1M float32 on two
cores), and softplus, log_sigmoid and log_add_exp spend most of their time in it. float32
therefore takes log(u) − ((u − 1) − x)/u with u = 1 + x: the correction is the rounding of
1 + x, carried to first order (Goldberg). Within 1 ulp of the correctly rounded result for
every float32 in [0, 1] and on samples of (−1, 0) and (1, 3.4e38), as log1pf is. float64
keeps libm's log1p, whose bits the worked examples pin.
"""

import math

from numba import float32, njit
from numba.extending import intrinsic

from steadystep._primitives import at_typer, cast_like_typer, put_typer

at = intrinsic(at_typer)
cast_like = intrinsic(cast_like_typer)
put = intrinsic(put_typer)


@njit(error_model="numpy", cache=True)
def log1p_f32(x):
    u = float32(1.0) + x
    if u == float32(1.0):  # |x| < 2⁻²⁴: log1p(x) rounds to x itself (and −0 stays −0)
        return x
    correction = ((u - float32(1.0)) - x) / u
    if correction != correction:  # u = 0 (x = −1), ±inf or NaN: log(u) alone is the answer
        correction = float32(0.0)
    return math.log(u) - correction


@njit(error_model="numpy", cache=True)
def log1p_f64(x):
    return math.log1p(x)
