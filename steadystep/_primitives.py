"""The typing and code generation behind ``at(x, i)`` and ``put(x, i, value)``, shared by the
CPU and CUDA targets.

Elementwise kernels take each argument either as a 1-D array (one value per output
element) or as a scalar (broadcast). Numba cannot prune an ``isinstance`` branch on the
CUDA target, so ``at`` is an intrinsic: its type is decided at compile time and the
generated code is a plain load or nothing at all.
"""

import operator

from numba.core import types
from numba.core.typing import signature


def at_typer(typingctx, x, i):
    if isinstance(x, types.Array):
        # An unsigned index skips the negative-index wraparound check, which keeps the
        # CPU loops vectorizable.
        load = signature(x.dtype, x, types.uintp)

        def codegen(context, builder, sig, args):
            index = context.cast(builder, args[1], sig.args[1], types.uintp)
            getitem = context.get_function(operator.getitem, load)
            return getitem(builder, (args[0], index))

        return signature(x.dtype, x, i), codegen

    def passthrough(context, builder, sig, args):
        return args[0]

    return signature(x, x, i), passthrough


def put_typer(typingctx, x, i, value):
    """``x[i] = value`` for an array; nothing for a scalar (an unused optional buffer)."""
    if isinstance(x, types.Array):
        store = signature(types.none, x, types.uintp, x.dtype)

        def codegen(context, builder, sig, args):
            index = context.cast(builder, args[1], sig.args[1], types.uintp)
            converted = context.cast(builder, args[2], sig.args[2], x.dtype)
            setitem = context.get_function(operator.setitem, store)
            setitem(builder, (args[0], index, converted))
            return context.get_dummy_value()

        return signature(types.none, x, i, value), codegen

    def nothing(context, builder, sig, args):
        return context.get_dummy_value()

    return signature(types.none, x, i, value), nothing
