"""A parallel launch of a serial kernel: its loop cut into parts, run at once, each a call of
the kernel's machine code by its address.

Every CPU kernel but the two reductions is serial and ends in ``part, parts``: it runs part
``part`` of ``parts`` of its outer loop (`primitives.part_of`), so ``kernel(*arguments, 0, 1)``
is the whole call and any split gives the same bits (the tests check every kernel). A kernel
compiled with Numba's parallel passes instead is its whole body compiled a second time, three
times the serial compile or more; here the one parallel loop in the package, `drive`, is
compiled once, whatever the kernel and its arguments. `in_parallel`'s launch, compiled for
each kind of arguments, is small and serial: it copies the arguments to its stack and hands
`drive` their address with that of a function that unpacks them for the kernel. It calls
`drive` by address as well: a cached launch that linked it crashed when a later process
loaded the launch from the cache before `drive` itself (its object code names `drive`'s
symbol, which only a loaded `drive` defines).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["address_of", "in_parallel"]

_WORD = ir.IntType(64)


def _of_four_words(context) -> ir.FunctionType:
    """The type of `drive`'s C entry and of an unpacker, which `drive` calls with (the kernel's
    address, the arguments' address, part, parts): four integers in, nothing (Numba's none) out."""
    return ir.FunctionType(context.get_value_type(types.none), [_WORD] * 4)


@intrinsic
def _call(typingctx, function, first, second, third, fourth):
    """Call the function of four integers at ``function`` (`_of_four_words`) with the others."""

    def codegen(context, builder, signature, values):
        builder.call(builder.inttoptr(values[0], _of_four_words(context).as_pointer()), values[1:])
        return context.get_dummy_value()

    return types.none(function, first, second, third, fourth), codegen


@njit(error_model="numpy", cache=True, parallel=True)
def drive(unpacker, kernel, packed, parts):
    """``unpacker(kernel, packed, part, parts)`` for every part at once: compiled once, its
    arguments are integers (addresses and counts) whatever the kernel runs."""
    for part in prange(parts):
        _call(unpacker, kernel, packed, np.int64(part), parts)  # prange counts in uint64


@intrinsic
def _packed(typingctx, arguments):
    """``(unpacker, packed)``: the address of a copy of ``arguments`` on the caller's stack, and
    that of a function of this module that reads such a copy and calls the kernel's C entry
    (the wrapper Numba compiles beside every jitted function, which takes each argument as its
    Numba value) with it and a part; the kernel's result is dropped."""
    if not isinstance(arguments, types.BaseTuple):
        return None

    def codegen(context, builder, signature, values):
        packed_type = context.get_value_type(arguments)
        slot = cgutils.alloca_once(builder, packed_type)
        builder.store(values[0], slot)
        # internal: each module that needs an unpacker for these kinds has its own copy
        name = "steadystep_unpack_" + hashlib.sha256(str(arguments).encode()).hexdigest()[:24]
        unpacker = builder.module.globals.get(name)
        if unpacker is None:
            unpacker = ir.Function(builder.module, _of_four_words(context), name=name)
            unpacker.linkage = "internal"
            inner = ir.IRBuilder(unpacker.append_basic_block())
            kernel, packed, part, parts = unpacker.args
            copy = inner.load(inner.inttoptr(packed, packed_type.as_pointer()))
            passed = [inner.extract_value(copy, index) for index in range(len(arguments))]
            entry = ir.FunctionType(
                context.get_value_type(types.none),
                [*(context.get_value_type(argument) for argument in arguments.types), _WORD, _WORD],
            )
            inner.call(inner.inttoptr(kernel, entry.as_pointer()), [*passed, part, parts])
            inner.ret(cgutils.get_null_value(unpacker.function_type.return_type))
        return context.make_tuple(
            builder, signature.return_type, [builder.ptrtoint(unpacker, _WORD), builder.ptrtoint(slot, _WORD)]
        )

    return types.UniTuple(types.int64, 2)(arguments), codegen


@njit(error_model="numpy", cache=True)
def _launch_parts(drive_address, address, parts, *arguments):
    unpacker, packed = _packed(arguments)
    _call(drive_address, unpacker, address, packed, parts)


def in_parallel(address: int, parts: int, *arguments: Any) -> None:
    """``kernel(*arguments, part, parts)`` for every part at once, ``address`` being the
    kernel's (`address_of()`)."""
    _launch_parts(_DRIVE[0] if _DRIVE else _drive_address(), address, parts, *arguments)


_DRIVE: list = []  # drive's address, once found


def _drive_address() -> int:
    _DRIVE.append(address_of(drive, (0, 0, 0, 0), whole=False))
    return _DRIVE[0]


def address_of(kernel: Any, arguments: tuple, whole: bool = True) -> int:
    """The address of ``kernel``'s machine code for ``(*arguments, part, parts)`` (for
    ``arguments`` alone where not ``whole``), arguments of these kinds (compiled now if it has
    none): valid while the process lives, and in a process forked from it. Kept per kind:
    Numba's typeof of two arrays and the JIT's symbol lookup take tens of µs each, a call's own
    Python a few."""
    key = (kernel, whole, *map(_kind, arguments))
    address = _ADDRESSES.get(key)
    if address is None:
        signature = (*map(numba.typeof, arguments), *((types.int64, types.int64) if whole else ()))
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
