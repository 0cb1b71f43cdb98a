"""The one place that imports Numba's CUDA support, and explains what is missing."""

from __future__ import annotations

import functools

# Numba's mangled names spell each part of a qualified name with its length first: every
# function of this package carries this in the LLVM IR that NVVM compiles.
_MANGLED_PACKAGE = "10steadystep"


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


@functools.cache  # once a process
def compile_without_contraction() -> None:
    """Have NVVM compile this package's kernels with ``-fma=0``.

    NVVM fuses a multiplication and a following addition into one fused multiply-add unless
    told not to (its default is ``-fma=1``, and Numba sets the option only under fastmath).
    One rounding instead of two changes the last bit now and then, so a GPU would give other
    bits than the CPU kernels, the simulator and the NumPy references the tests compare with,
    and a run moved between a laptop and a GPU would drift apart. Only the IR of this
    package's functions (told apart by their mangled names) is compiled so; a user's own
    kernels keep NVVM's default. libdevice's functions (exp, log1p) keep their own explicit
    fused multiply-adds either way. Nothing under the simulator.
    """
    from numba import config

    if config.ENABLE_CUDASIM:
        return
    try:
        from numba.cuda.cudadrv import nvvm
    except Exception:  # noqa: BLE001 - no CUDA support: require_cuda explains it when a call needs it
        return
    compile_ir = getattr(nvvm, "compile_ir", None)
    if compile_ir is None:  # another numba-cuda: tests/test_ptx.py then finds fused multiply-adds
        return

    @functools.wraps(compile_ir)
    def compile_ir_uncontracted(llvmir, **options):
        modules = [llvmir] if isinstance(llvmir, str) else llvmir
        if not options.get("fastmath") and any(_MANGLED_PACKAGE in module for module in modules):
            options.setdefault("fma", False)
        return compile_ir(llvmir, **options)

    nvvm.compile_ir = compile_ir_uncontracted
