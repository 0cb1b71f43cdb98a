"""Compressors for communication-efficient gossip (SPEC §8): what a worker sends instead of a
dense row, and what it costs in bytes.

Each compressor works on blocks of ``block_size`` consecutive elements of a row (256 by default):

- ``int8()`` / ``int4()``: per block s = max|v|, codes c = round(v/s·L) with L = 127 or 7,
  Q(v) = s·c/L; rounding is stochastic (P(up) = the fraction, unbiased; counter-based random
  bits keyed by (seed, step, element), so every target draws the same) or to nearest (ties up).
  Payload: ⌈D·bits/8⌉ + 4·⌈D/B⌉ bytes (codes and one float32 scale per block; float64 rows
  send float64 scales, 8 bytes, so that every copy is the sender's bit for bit).
- ``top_k(fraction)``: per block the ⌈fraction·b⌉ entries of largest |v| (ties: the lower
  index), the rest 0. Payload: kept·(value bytes + 1), each value with its 1-byte offset.
- ``random_k(fraction)``: the same count per block at positions drawn from (seed, step, column),
  the same for every worker, so no offsets travel; values as they are, or scaled by b/kept when
  ``unbiased`` (E[Q(v)] = v). Payload: kept·(value bytes).
- ``identity()``: Q(v) = v. Payload: D·(value bytes).

[`compress()`][steadystep.compress.compress] applies one to rows on the CPU or the GPU;
[`DecentralizedAdamW(compression=...)`][steadystep.decentral.DecentralizedAdamW] gossips with it.
[`encode()`][steadystep.compress.encode] and [`decode()`][steadystep.compress.decode] are the two
ends of a wire: the payload's bytes, and the public copy every receiver rebuilds from them, bit
for bit the sender's (what the ranks of MPI and torch.distributed send).

>>> import numpy as np
>>> from steadystep import compress
>>> compress.compress(np.array([0.5, -1.0, 0.25, 0.0]), compress.int8(rounding="nearest")).tolist()
[0.5039370078740157, -1.0, 0.25196850393700787, 0.0]
>>> compress.int8().payload_bytes(1000, itemsize=4)
1016
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from steadystep import _arrays, checks, dispatch
from steadystep.kernels.compress import KINDS

__all__ = [
    "BLOCK_SIZE",
    "ROUNDINGS",
    "Compressor",
    "check_compressor",
    "compress",
    "decode",
    "encode",
    "identity",
    "int4",
    "int8",
    "random_k",
    "top_k",
]

BLOCK_SIZE = 256
ROUNDINGS = ("stochastic", "nearest")


@dataclass(frozen=True)
class Compressor:
    """A compressor: its ``kind`` ("identity", "quantize", "top_k" or "random_k") and settings.
    Make one with [`int8()`][steadystep.compress.int8], [`int4()`][steadystep.compress.int4],
    [`top_k()`][steadystep.compress.top_k], [`random_k()`][steadystep.compress.random_k] or
    [`identity()`][steadystep.compress.identity]."""

    kind: str
    bits: int = 0
    rounding: str = "stochastic"
    fraction: float = 1.0
    unbiased: bool = False
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        checks.counts(" (elements per block)", block_size=(self.block_size, 1))
        if self.kind == "quantize" and self.bits not in (4, 8):
            raise ValueError(f"bits must be 8 or 4 (int8, int4); got {self.bits!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be 'stochastic' or 'nearest'; got {self.rounding!r}")
        if self.kind in ("top_k", "random_k"):
            checks.in_range("fraction", self.fraction, 0.0, 1.0, low_open=True, why=" (the share of each block kept)")
        if self.kind == "top_k" and self.block_size > 256:
            raise ValueError(
                "block_size must be at most 256 for top_k (each kept value's offset is one byte); "
                f"got {self.block_size}"
            )

    @property
    def name(self) -> str:
        """A short label: "int8", "int4 nearest", "top_k 1%", "random_k 10% unbiased", "identity"."""
        if self.kind == "quantize":
            return f"int{self.bits}" + (" nearest" if self.rounding == "nearest" else "")
        if self.kind in ("top_k", "random_k"):
            return f"{self.kind} {100 * self.fraction:.4g}%" + (" unbiased" if self.unbiased else "")
        return "identity"

    @property
    def levels(self) -> int:
        """L, the largest code (127 for int8, 7 for int4; 0 for the others)."""
        return (1 << (self.bits - 1)) - 1 if self.kind == "quantize" else 0

    def kept_in_block(self, length: int) -> int:
        """How many of a block of ``length`` elements a sparsifier keeps: ⌈fraction·length⌉."""
        return min(length, math.ceil(self.fraction * length - 1e-12)) if self.kind in ("top_k", "random_k") else length

    def kept(self, width: int) -> int:
        """The elements of a row of ``width`` that carry a value (all but for the sparsifiers)."""
        whole, last = divmod(width, self.block_size)
        return whole * self.kept_in_block(self.block_size) + (self.kept_in_block(last) if last else 0)

    def payload_bytes(self, width: int, itemsize: int) -> int:
        """The bytes one compressed row of ``width`` values of ``itemsize`` bytes takes on the wire
        (what [`encode()`][steadystep.compress.encode] returns)."""
        if self.kind == "quantize":  # the scales travel as float32 (4 bytes), or float64 for float64 rows
            return math.ceil(width * self.bits / 8) + max(4, itemsize) * self.blocks(width)
        if self.kind == "top_k":
            return self.kept(width) * (itemsize + 1)
        return self.kept(width) * itemsize

    def arguments(self, width: int, dtype: Any, seed: int, step: int) -> list:
        """What the compressing kernels take after their buffers (kernels/compress.py): the kind's
        number, L, nearest, the kept counts and factors of a whole and of the last block, the
        step's random key, the block size; numbers in ``dtype``."""
        cast = np.dtype(dtype).type
        last = width % self.block_size or self.block_size
        kept_full, kept_last = self.kept_in_block(self.block_size), self.kept_in_block(last)

        def factor(length: int, kept: int) -> float:
            return length / kept if self.kind == "random_k" and self.unbiased else 1.0

        return [
            KINDS.index(self.kind),
            cast(self.levels),
            self.rounding == "nearest",
            cast(kept_full),
            cast(kept_last),
            cast(factor(self.block_size, kept_full)),
            cast(factor(last, kept_last)),
            _arrays.rounding_key(seed, step),
            self.block_size,
        ]

    def blocks(self, width: int) -> int:
        """The blocks of a row of ``width``."""
        return -(-width // self.block_size)


def identity() -> Compressor:
    """Q(v) = v: the dense row (CHOCO with it is plain gossip)."""
    return Compressor("identity")


def int8(rounding: str = "stochastic", block_size: int = BLOCK_SIZE) -> Compressor:
    """8-bit codes with a float32 scale per block: Q(v) = s·round(v/s·127)/127, s = max|v|."""
    return Compressor("quantize", bits=8, rounding=rounding, block_size=block_size)


def int4(rounding: str = "stochastic", block_size: int = BLOCK_SIZE) -> Compressor:
    """4-bit codes with a float32 scale per block: Q(v) = s·round(v/s·7)/7, s = max|v|."""
    return Compressor("quantize", bits=4, rounding=rounding, block_size=block_size)


def top_k(fraction: float, block_size: int = BLOCK_SIZE) -> Compressor:
    """The ⌈fraction·b⌉ largest |v| of each block of b, with their offsets; the rest 0."""
    return Compressor("top_k", fraction=fraction, block_size=block_size)


def random_k(fraction: float, unbiased: bool = False, block_size: int = BLOCK_SIZE) -> Compressor:
    """⌈fraction·b⌉ values per block at positions every worker draws alike from (seed, step),
    scaled by b/kept when ``unbiased``."""
    checks.flag("unbiased", unbiased)
    return Compressor("random_k", fraction=fraction, unbiased=unbiased, block_size=block_size)


def check_compressor(compression: Any) -> None:
    """Refuse anything but a Compressor, saying how to make one."""
    if not isinstance(compression, Compressor):
        raise TypeError(
            f"compression must be a steadystep.compress compressor (compress.int8(), int4(), top_k(f), "
            f"random_k(f), identity()) or None; got {compression!r}"
        )


def compress(values: Any, compressor: Compressor, *, seed: int = 0, step: int = 0, target: Optional[str] = None) -> Any:
    """Q(values) for each row of ``values`` ([D] or [N, D], float32 or float64, any library or
    device), as a new array beside them: the dense values a receiver reconstructs. Row i's
    stochastic rounding draws from (``seed``, ``step``, i·D + column), as worker i's does in the
    decentralized step."""
    check_compressor(compressor)
    checks.counts("", seed=(seed, 0), step=(step, 0))
    operand = _arrays.classify("values", values)
    if operand.kind == "scalar" or len(operand.shape) not in (1, 2):
        raise ValueError(f"values must be a row [D] or rows [N, D]; got shape {operand.shape}")
    if operand.storage or operand.dtype not in (np.float32, np.float64):
        raise TypeError(f"values has dtype {_arrays.dtype_name(operand)}; use float32 or float64")
    where = dispatch.choose_target([operand], target)
    backend = dispatch.backend(where)
    rows, width = (1, *operand.shape) if len(operand.shape) == 1 else operand.shape
    forced = where == "cuda" and operand.kind == "host"  # a forced GPU target: the result comes back
    out = (
        backend.to_target(np.zeros(rows * width, operand.dtype))
        if forced
        else _arrays.zeros_like(values, rows * width, None)
    )
    source = backend.kernel_array(operand)
    public = backend.kernel_array(_arrays.classify("out", out))
    arguments = [source.reshape(rows, width), public.reshape(rows, width)]
    arguments += compressor.arguments(width, operand.dtype, seed, step)
    dispatch.run_grid(where, "compress", "choco_share", operand.dtype, (rows, compressor.blocks(width)), arguments)
    if forced:
        return backend.to_host(out).reshape(operand.shape)
    return out.reshape(operand.shape)


def encode(
    values: Any, public: Any, compressor: Compressor, *, seed: int = 0, step: int = 0, worker: int = 0
) -> np.ndarray:
    """CHOCO's sending end for one row ([D], float32 or float64, on the CPU or the GPU):
    q = Q(values − public), ``public`` += q in place, and q as the bytes that travel (a host
    uint8 array of ``compressor.payload_bytes(D, itemsize)``): codes then scales (int8/int4;
    int4 two codes a byte, the first in the low half), values then their offsets in the block
    (top-k), values (random-k: the receiver draws the positions), or the values (identity).
    Stochastic rounding draws as ``worker`` of the decentralized step does (seed, step and
    element worker·D + column).

    >>> import numpy as np
    >>> x, mine, theirs = np.array([0.5, -1.0, 0.25, 0.0]), np.zeros(4), np.zeros(4)
    >>> payload = encode(x, mine, int8(rounding="nearest"))
    >>> payload.nbytes, decode(theirs, payload, int8(rounding="nearest")), bool((theirs == mine).all())
    (12, None, True)
    """
    check_compressor(compressor)
    checks.counts("", seed=(seed, 0), step=(step, 0), worker=(worker, 0))
    operands = [_row("values", values), _row("public", public)]
    if operands[0].shape != operands[1].shape or operands[0].dtype != operands[1].dtype:
        raise ValueError(
            f"values and public must be rows of one length and dtype; got {operands[0].shape} "
            f"{operands[0].dtype} and {operands[1].shape} {operands[1].dtype}"
        )
    _arrays.check_writable(operands[1])
    width, dtype = operands[0].shape[0], np.dtype(operands[0].dtype)
    where = dispatch.choose_target(operands, None)
    backend = dispatch.backend(where)
    message, selected, scales = _scratch(backend, compressor, width, dtype)
    rows = [backend.kernel_array(operand).reshape(1, width) for operand in operands]
    arguments = [*rows, message, selected, scales, *compressor.arguments(width, dtype, seed, step), worker * width]
    dispatch.run_grid(where, "compress", "choco_encode", dtype, (1, compressor.blocks(width)), arguments)
    _arrays.mark_written(public)
    host = [backend.to_host(array)[0] for array in (message, selected, scales)]
    return _pack(compressor, host[0], host[1], host[2], dtype)


def decode(public: Any, payload: Any, compressor: Compressor, *, seed: int = 0, step: int = 0) -> None:
    """The receiving end: ``public`` (the sender's public copy, [D]) += q from the ``payload`` the
    sender's [`encode()`][steadystep.compress.encode] returned with the same compressor, seed and
    step; the same additions, so ``public`` stays equal to the sender's own bit for bit."""
    check_compressor(compressor)
    checks.counts("", seed=(seed, 0), step=(step, 0))
    operand = _row("public", public)
    _arrays.check_writable(operand)
    width, dtype = operand.shape[0], np.dtype(operand.dtype)
    data = np.ascontiguousarray(dispatch.host_array(payload)).reshape(-1)
    expected = compressor.payload_bytes(width, dtype.itemsize)
    if data.dtype != np.uint8 or data.size != expected:
        raise ValueError(
            f"payload must be the {expected} bytes (uint8) encode() makes of a {width}-value {dtype} row with "
            f"{compressor.name}; got {data.size} {data.dtype}"
        )
    where = dispatch.choose_target([operand], None)
    backend = dispatch.backend(where)
    positions = _positions(compressor, width, dtype, seed, step) if compressor.kind == "random_k" else None
    unpacked = _unpack(compressor, data, width, dtype, positions)
    message, selected, scales = (backend.to_target(array[None]) for array in unpacked)
    row = backend.kernel_array(operand).reshape(1, width)
    arguments = compressor.arguments(width, dtype, seed, step)
    kind, levels, factors = arguments[0], arguments[1], arguments[5:7]
    arguments = [row, message, selected, scales, kind, levels, *factors, compressor.block_size]
    dispatch.run_grid(where, "compress", "choco_decode", dtype, (1, compressor.blocks(width)), arguments)
    _arrays.mark_written(public)


def _row(name: str, value: Any) -> _arrays.Operand:
    operand = _arrays.classify(name, value)
    if len(operand.shape) != 1:
        raise ValueError(f"{name} must be one row [D]; got shape {operand.shape}")
    if operand.storage or operand.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} has dtype {_arrays.dtype_name(operand)}; use float32 or float64")
    return operand


def _scratch(backend: Any, compressor: Compressor, width: int, dtype: np.dtype) -> list:
    """The message, selection and scales an encoding writes, on the target."""
    shapes = [(1, width), (1, width), (1, compressor.blocks(width))]
    return [backend.to_target(np.zeros(shape, dtype)) for shape in shapes]


@functools.lru_cache(maxsize=4)
def _positions(compressor: Compressor, width: int, dtype: np.dtype, seed: int, step: int) -> np.ndarray:
    """Where random-k keeps values at (seed, step): the same for every sender (drawn from the
    columns alone), so a receiver finds them by encoding a row of zeros (on the host)."""
    zeros = np.zeros(width, dtype)
    backend = dispatch.backend("cpu")
    message, selected, scales = _scratch(backend, compressor, width, dtype)
    arguments = [zeros[None], zeros.copy()[None], message, selected, scales]
    arguments += [*compressor.arguments(width, dtype, seed, step), 0]
    dispatch.run_grid("cpu", "compress", "choco_encode", dtype, (1, compressor.blocks(width)), arguments)
    kept = selected[0] != 0.0
    kept.setflags(write=False)
    return kept


def _pack(
    compressor: Compressor, message: np.ndarray, selected: np.ndarray, scales: np.ndarray, dtype: Any
) -> np.ndarray:
    """The payload's bytes of what `choco_encode` wrote for one row."""
    if compressor.kind == "quantize":
        codes = message.astype(np.int8)
        if compressor.bits == 4:  # c + 8 in 0..15, two a byte
            nibbles = np.append(codes + 8, 0 if codes.size % 2 else []).astype(np.uint8)
            packed = nibbles[0::2] | (nibbles[1::2] << 4)
        else:
            packed = codes.view(np.uint8)
        return np.concatenate([packed, scales.astype(dtype).view(np.uint8)])
    if compressor.kind == "identity":
        return np.ascontiguousarray(message.astype(dtype)).view(np.uint8)
    columns = np.flatnonzero(selected)
    values = message[columns].astype(dtype).view(np.uint8)
    if compressor.kind == "random_k":
        return values
    return np.concatenate([values, (columns % compressor.block_size).astype(np.uint8)])


def _unpack(
    compressor: Compressor, data: np.ndarray, width: int, dtype: np.dtype, positions: Optional[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `choco_decode` reads (message, selection, scales) from a payload's bytes."""
    message, selected = np.zeros(width, dtype), np.zeros(width, dtype)
    scales = np.zeros(compressor.blocks(width), dtype)
    if compressor.kind == "quantize":
        length = math.ceil(width * compressor.bits / 8)
        if compressor.bits == 4:
            nibbles = np.stack([data[:length] & 15, data[:length] >> 4], axis=1).reshape(-1)[:width]
            message[:] = nibbles.astype(np.int8) - 8
        else:
            message[:] = data[:length].view(np.int8)
        scales[:] = data[length:].view(dtype)
        return message, selected, scales
    if compressor.kind == "identity":
        message[:] = data.view(dtype)
        return message, selected, scales
    kept = compressor.kept(width)
    values = data[: kept * dtype.itemsize].view(dtype)
    if compressor.kind == "random_k":
        assert positions is not None
        columns = np.flatnonzero(positions)
    else:  # each block's kept count, in block order: the offsets say where in the block
        whole, last = divmod(width, compressor.block_size)
        counts = [compressor.kept_in_block(compressor.block_size)] * whole + (
            [compressor.kept_in_block(last)] if last else []
        )
        starts = np.repeat(np.arange(len(counts)) * compressor.block_size, counts)
        columns = starts + data[kept * dtype.itemsize :].astype(np.int64)
    message[columns] = values
    selected[columns] = 1.0
    return message, selected, scales
