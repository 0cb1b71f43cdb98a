"""The typing and code generation behind ``at(x, i)`` and ``put(x, i, value)``, shared by the
CPU and CUDA targets.

Elementwise kernels take each argument either as a 1-D array (one value per output
element) or as a scalar (broadcast). Numba cannot prune an ``isinstance`` branch on the
CUDA target, so ``at`` is an intrinsic: its type is decided at compile time and the
generated code is a plain load or nothing at all.
"""

import operator

from numba.core import types
from numba.core.imputils import impl_ret_borrowed
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


def cast_like_typer(typingctx, x, reference):
    """A scalar ``x`` in ``reference``'s dtype; an array ``x`` (per-element values) as it is.

    The CPU launcher passes a step's per-call numbers as Python floats (creating a NumPy
    scalar per number cost more than the rest of a small step's Python), so a float32
    kernel rounds them to float32 here, once per call, exactly as ``np.float32(x)`` would.
    """
    if isinstance(x, types.Array):

        def borrow(context, builder, sig, args):
            return impl_ret_borrowed(context, builder, sig.return_type, args[0])  # the new reference counts

        return signature(x, x, reference), borrow

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], sig.return_type)

    return signature(reference.dtype, x, reference), codegen


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
