"""The one place that imports Numba's CUDA support, and explains what is missing."""

from __future__ import annotations

import functools


@functools.cache
def require_cuda():
    """``numba.cuda``, once a GPU (or the simulator) is usable; a clear RuntimeError otherwise."""
    try:
        from numba import cuda
    except Exception as error:  # numba-cuda raises plain Exceptions when libcudart is missing
        raise RuntimeError(
            f"CUDA support could not be imported ({error}). Install it with "
            "`pip install 'steadystep[cuda]'`, or pass CPU arrays."
        ) from error
    if not cuda.is_available():
        raise RuntimeError(
            "no usable CUDA GPU was found (numba.cuda.is_available() is False). Pass CPU arrays, "
            "or set NUMBA_ENABLE_CUDASIM=1 before importing steadystep to run the CUDA kernels on the simulator."
        )
    return cuda


def current_device_index() -> int:
    """The CUDA device Numba launches on from this thread (the simulator has one, index 0)."""
    return getattr(require_cuda().get_current_device(), "id", 0)
