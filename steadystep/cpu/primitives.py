"""Device primitives the generated CPU kernels import (see steadystep/_primitives.py)."""

from numba.extending import intrinsic

from steadystep._primitives import at_typer, cast_like_typer, put_typer

at = intrinsic(at_typer)
cast_like = intrinsic(cast_like_typer)
put = intrinsic(put_typer)
