"""A parallel launch of a serial kernel that takes a range of its loop (the elementwise and row
kernels): shares of the range at once, each a call of the kernel's machine code by its address.

A parfor kernel is its whole body compiled a second time, through Numba's parallel passes: a
row kernel took several times its serial twin's compile, an elementwise one twice.
`in_parallel` is compiled once for each kind of arguments (dtypes, layouts, writability),
whatever kernel it runs, and calls the serial kernel already compiled for the small calls.
The kernel is ``kernel(*arguments, start, stop)``: iterations ``start`` to ``stop`` of its loop
over the whole arrays, so a share does what the same iterations of one whole call do, with the
same bits for any split (tests/test_rows.py checks one thread against two).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["address_of", "in_parallel"]


@intrinsic
def _call_address(typingctx, address, arguments, start, stop):
    """Call the C-ABI function at ``address`` (an integer) with ``*arguments, start, stop``:
    the wrapper Numba compiles beside every jitted function (its ``cfunc`` entry), which takes
    each argument as its Numba value; what it returns is dropped."""
    if not isinstance(address, types.Integer) or not isinstance(arguments, types.BaseTuple):
        return None
    passed = [*arguments.types, start, stop]

    def codegen(context, builder, signature, values):
        function_type = ir.FunctionType(
            context.get_value_type(types.none), [context.get_value_type(argument) for argument in passed]
        )
        function = builder.inttoptr(values[0], function_type.as_pointer())
        builder.call(function, [*cgutils.unpack_tuple(builder, values[1]), values[2], values[3]])
        return context.get_dummy_value()

    return types.none(address, arguments, start, stop), codegen


@njit(error_model="numpy", cache=True, parallel=True)
def in_parallel(address, parts, count, *arguments):
    """``kernel(*arguments, start, stop)`` over ``parts`` shares of ``range(count)`` at once,
    ``address`` being the kernel's (`address_of()`)."""
    for part in prange(parts):
        start = count * np.int64(part) // parts  # prange counts in uint64: mixed with int64, a float
        stop = count * (np.int64(part) + 1) // parts
        _call_address(address, arguments, start, stop)


def address_of(kernel: Any, arguments: tuple) -> int:
    """The address of ``kernel``'s machine code for ``(*arguments, start, stop)``, arguments
    of these kinds (compiled now if it has none): valid while the process lives, and in a
    process forked from it. Kept per kind: Numba's typeof of two arrays and the JIT's symbol
    lookup take tens of µs each, a call's own Python a few."""
    key = (kernel, *map(_kind, arguments))
    address = _ADDRESSES.get(key)
    if address is None:
        signature = (*map(numba.typeof, arguments), types.int64, types.int64)
        compiled = kernel.overloads.get(signature)
        if compiled is None:
            kernel.compile(signature)
            compiled = kernel.overloads[signature]
        address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_cfunc_wrapper_name)
        _ADDRESSES[key] = address
    return address


_ADDRESSES: dict[tuple, int] = {}


def _kind(argument: Any) -> Any:
    """What decides an argument's Numba type: an array's dtype, dimensions and flags (all of
    them, as one integer: layout, writability and alignment among them), a number's type (the
    kernels' numbers are floats of NumPy or Python)."""
    if not isinstance(argument, np.ndarray):
        return type(argument)
    return argument.dtype, argument.ndim, argument.flags.num
