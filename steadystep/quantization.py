"""8-bit and 4-bit optimizer states (SPEC §9): a moment stored as one code per element and one
float32 ``absmax`` per block of elements, m = absmax·qmap[code], where ``qmap`` is an increasing
map in [−1, 1].

- 8 bits (bitsandbytes' scheme): a uint8 code per element, blocks of 256, bitsandbytes' dynamic
  map (signed for a first moment, from 0 for a second moment).
- 4 bits (Li et al. 2023, as torchao implements it): two codes a byte (the first element in the
  high nibble), blocks of 128, a 16-entry map: the 4-bit dynamic map for a first moment, the
  linear map without zero (1/16, 2/16, …, 1) for a second moment.

A state's width is its map's: 256 entries make an 8-bit state, 16 a 4-bit one.

The fused steps of [`steadystep.optim`][steadystep.optim] take a `QuantizedState` wherever they
take a state buffer that has an 8-bit form (AdamW's, Adam's, Lion's, SGD's momentum, RMSprop's
and Adagrad's): they dequantize, compute the float32 step of the float32 optimizer, and store
each new moment as its nearest code, in two passes (the new scales, then the codes).
AdamW's state then takes 2 bytes and 8/256 bytes of scales a parameter instead of 8 (4 bits:
1 byte and 8/128).

>>> import numpy as np
>>> from steadystep import optim, quantization
>>> param, grad = np.ones(8192, np.float32), np.full(8192, 0.5, np.float32)
>>> exp_avg = quantization.zeros(param.size, signed=True)
>>> exp_avg_sq = quantization.zeros(param.size, signed=False)
>>> optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, lr=0.1)
>>> round(float(param[0]), 6), float(quantization.dequantize(exp_avg)[0])
(0.899, 0.05000000074505806)

The nearest code is found by a lookup, not a search: a float32's sign, exponent and top 8
mantissa bits pick one of 16,386 buckets, each of which holds at most one of the map's
decision midpoints; the bucket's entry holds its code and the midpoint's low mantissa bits, so
one load and one comparison of the value's own bits finish it. A map whose neighbouring values
are closer than a bucket (1/256 of their value) is refused, and so is one with a midpoint
within 2⁻³² of 0 (the lowest bucket's values do not share an exponent). A 4-bit code
is the count of its map's 15 midpoints below the value: fifteen comparisons, which vectorise
(the CPU with AVX-512 searches them in four steps, held in one register).

A CPU with AVX-512 finds most 8-bit codes without the buckets: a map made of linear pieces (the
dynamic maps: one per decade, and a mirror image for negative values) has them stored after
the buckets, and a value's code is its piece's first code plus floor(a·slope + intercept).
Each piece is checked, when its map's tables are built, to give the buckets' code for every
float32 except those within 10⁻⁴ of a code spacing of a midpoint, which the buckets decide.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from steadystep import _arrays, checks, dispatch
from steadystep._primitives import (
    BUCKET_LOWEST,
    BUCKET_MANTISSA_BITS,
    BUCKETS_PER_SIGN,
    MIRRORED,
    PIECES,
    POSITIVE,
    code_buckets,
    codes_in_buckets,
)
from steadystep.kernels import QUANTIZATION_BLOCKS

__all__ = [
    "BITS",
    "BLOCK_SIZE",
    "BLOCK_SIZES",
    "CODES",
    "MIN_8BIT_SIZE",
    "QuantizedState",
    "blocks",
    "code_bytes",
    "dequantize",
    "dynamic_map",
    "element_codes",
    "linear_map",
    "packed",
    "quantize",
    "state_map",
    "unpacked",
    "zeros",
]

Array = Any
BITS = tuple(QUANTIZATION_BLOCKS)  # the code widths offered
BLOCK_SIZES = dict(QUANTIZATION_BLOCKS)  # elements per absmax: bitsandbytes' for 8 bits, torchao's for 4
BLOCK_SIZE = BLOCK_SIZES[8]
CODES = 256  # entries of an 8-bit map: one per value of a uint8 code (16 for 4 bits)
MIN_8BIT_SIZE = 4096  # the drop-ins keep float32 moments for smaller tensors (bitsandbytes' min_8bit_size)


def _checked_bits(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"bits must be 8 or 4 (the code widths offered); got {bits!r}")
    return int(bits)


def blocks(size: int, row_length: Optional[int] = None, *, bits: int = 8) -> int:
    """How many absmax values a state of ``size`` elements has: ⌈row_length/block⌉ per row of
    ``row_length`` elements (the whole state is one row by default), with blocks of 256
    elements for 8-bit codes and 128 for 4-bit ones."""
    row_length = size if row_length is None else row_length
    if size == 0:
        return 0
    return size // row_length * -(-row_length // BLOCK_SIZES[_checked_bits(bits)])


def code_bytes(size: int, row_length: Optional[int] = None, *, bits: int = 8) -> int:
    """The bytes of codes a state of ``size`` elements holds: one an element for 8 bits; for 4
    bits, ⌈row_length/2⌉ a row (a row of odd length ends in half a byte)."""
    if _checked_bits(bits) == 8 or size == 0:
        return size
    row_length = size if row_length is None else row_length
    return size // row_length * -(-row_length // 2)


@functools.cache
def _dynamic_map(signed: bool, bits: int) -> np.ndarray:
    # bitsandbytes' create_dynamic_map(signed, max_exponent_bits=bits - 1, total_bits=bits), as
    # torchao writes it for 4 bits too, computed as its torch code rounds: decade k holds 2ᵏ
    # (signed) or 2ᵏ⁺¹ values, the midpoints of a float32 linspace(0.1, 1) (torch's: float64
    # steps from float32 ends), times 10^(k + 2 − bits) in float32; then 0 and 1.
    values = [np.float32(0.0), np.float32(1.0)]
    for k in range(bits - 1):
        count = 2**k + 1 if signed else 2 ** (k + 1) + 1
        start, end = np.float32(0.1), np.float32(1.0)
        step = np.float64(end - start) / (count - 1)
        index = np.arange(count)
        ends = np.where(
            index < count // 2, np.float64(start) + step * index, np.float64(end) - step * (count - 1 - index)
        ).astype(np.float32)
        means = (ends[:-1] + ends[1:]) / np.float32(2.0)
        decade = np.float32(10.0 ** (k + 2 - bits)) * means
        values += list(decade) + (list(-decade) if signed else [])
    qmap = np.sort(np.array(values, np.float32))
    qmap.setflags(write=False)
    return qmap


def dynamic_map(signed: bool = True, *, bits: int = 8) -> np.ndarray:
    """bitsandbytes' dynamic quantization map (``create_dynamic_map``): 2^bits increasing
    float32 values, dense near 0 (for 8 bits seven decades, 1e−6 to 1; for 4 bits three, 1e−2
    to 1), with 0 and 1; ``signed`` for moments of either sign, else from 0. Read-only."""
    return _dynamic_map(bool(signed), _checked_bits(bits))


@functools.cache
def _linear_map() -> np.ndarray:
    qmap = (np.arange(1, 17) / 16).astype(np.float32)
    qmap.setflags(write=False)
    return qmap


def linear_map() -> np.ndarray:
    """The 4-bit map without zero, 1/16, 2/16, …, 1 (torchao's for a second moment: a value
    near 0 takes 1/16 of its block's absmax rather than 0, which would divide by ε). Read-only."""
    return _linear_map()


def state_map(signed: bool, bits: int = 8) -> np.ndarray:
    """The map a state of ``bits`` takes by default: the dynamic map, except a 4-bit state
    from 0 (a second moment), which takes the linear map (torchao's choices). Read-only."""
    if _checked_bits(bits) == 4 and not signed:
        return linear_map()
    return dynamic_map(signed, bits=bits)


@functools.lru_cache(maxsize=64)
def _tables(qmap_bytes: bytes) -> tuple[np.ndarray, np.ndarray]:
    qmap = np.frombuffer(qmap_bytes, np.float32)
    midpoints = np.append((qmap[:-1] + qmap[1:]) / np.float32(2.0), np.float32(np.inf)).astype(np.float32)
    key = np.arange(BUCKETS_PER_SIGN, dtype=np.int64)
    shift = 23 - BUCKET_MANTISSA_BITS
    low = ((key + BUCKET_LOWEST).astype(np.uint32) << shift).view(np.float32).copy()
    high = np.nextafter(((key + BUCKET_LOWEST + 1).astype(np.uint32) << shift).view(np.float32), np.float32(0.0))
    low[0], high[-1] = 0.0, 1.0  # the lowest bucket holds 0 and the tiniest magnitudes; the highest, 1
    lookup = np.empty(2 * BUCKETS_PER_SIGN, np.int64)
    boundaries = midpoints[:-1]
    # each bucket: the midpoints below its lowest value (every bucket's values are one float's bits apart)
    lookup[BUCKETS_PER_SIGN + key] = np.searchsorted(boundaries, low, side="left")
    lookup[BUCKETS_PER_SIGN - 1 - key] = np.searchsorted(boundaries, -high, side="left")
    above = np.empty_like(lookup)
    above[BUCKETS_PER_SIGN + key] = np.searchsorted(boundaries, high, side="left")
    above[BUCKETS_PER_SIGN - 1 - key] = np.searchsorted(boundaries, -low, side="left")
    crowded = np.flatnonzero(above - lookup > 1)
    if crowded.size:
        raise ValueError(
            "qmap has neighbouring values closer than the code lookup resolves (1/256 of their "
            f"magnitude, near {float(boundaries[lookup[crowded[0]]])!r}); use bitsandbytes' dynamic map "
            "(steadystep.quantization.dynamic_map) or one at least as coarse"
        )
    bucket = np.arange(lookup.size)
    near_zero = np.flatnonzero((np.abs(boundaries).view(np.int32) >> shift) <= BUCKET_LOWEST)
    if near_zero.size:  # the lowest buckets hold magnitudes of many exponents: no bits to compare there
        raise ValueError(
            f"qmap has a decision midpoint within 2**-32 of 0 ({float(boundaries[near_zero[0]])!r}, between "
            f"{float(qmap[near_zero[0]])!r} and {float(qmap[near_zero[0] + 1])!r}), which the code lookup cannot "
            "place; give the map a 0 between its negative and positive values, as the dynamic maps have"
        )
    # each bucket's entry (_primitives.codes_in_buckets): the code at its low end (a negative
    # bucket's above its midpoint), and the low bits from which a value passes its midpoint
    candidate = midpoints[lookup]
    inside = np.isfinite(candidate) & (code_buckets(candidate) == bucket)
    low_bits = candidate.view(np.int32).astype(np.int64) & ((1 << shift) - 1)
    positive = bucket >= BUCKETS_PER_SIGN
    first = np.where(positive, lookup, lookup + 1)
    threshold = np.where(positive, np.where(inside, low_bits + 1, 1 << shift), np.where(inside, low_bits, 0))
    lookup = np.concatenate([((first << 16) | threshold).astype(np.int32), _pieces(qmap, midpoints)])
    midpoints.setflags(write=False)
    lookup.setflags(write=False)
    return midpoints, lookup


def _pieces(qmap: np.ndarray, midpoints: np.ndarray) -> np.ndarray:
    """The lookup's linear pieces of a 256-entry map (``_primitives.PIECES``), checked to give
    every value's exact code unless it lies within the band of a midpoint; all zeros (no
    pieces: the buckets serve every value) for a map without such pieces."""
    words = np.zeros(PIECES.words, np.int32)
    zero = CODES // 2 - 1
    if qmap.size != CODES:
        return words
    if qmap[zero] == 0 and np.array_equal(qmap[: 2 * zero + 1], -qmap[2 * zero :: -1]):
        kind, first = MIRRORED, zero  # a negative value's code mirrors its magnitude's
    elif qmap[0] >= 0:
        kind, first = POSITIVE, 0
    else:
        return words
    bounds = midpoints[first : CODES - 1]  # the decision midpoints above the first code, increasing
    gaps = np.diff(bounds.astype(np.float64))
    even = np.isclose(gaps[:-1], gaps[1:], rtol=1e-3, atol=0)  # midpoints i, i + 1 and i + 2 evenly spaced
    inner = np.zeros(bounds.size, bool)
    for shift in range(3):
        inner[shift : shift + even.size] |= even
    thresholds = np.flatnonzero(~inner)  # the pieces' boundaries
    if thresholds.size >= PIECES.most:
        return words
    edges = [-1, *thresholds, bounds.size]
    slope, intercept = np.zeros(PIECES.most, np.float32), np.full(PIECES.most, 0.5, np.float32)
    offset, last = np.zeros(PIECES.most, np.int32), np.zeros(PIECES.most, np.int32)
    for piece, (lower, upper) in enumerate(zip(edges[:-1], edges[1:])):
        inside = bounds[lower + 1 : upper]  # t crosses 1, 2, … at these
        offset[piece], last[piece] = first + lower + 1, inside.size
        if inside.size == 0:
            continue
        if inside.size < 3:
            return words
        slope[piece] = np.float32((inside.size - 1) / (float(inside[-1]) - float(inside[0])))
        intercept[piece] = np.float32(1 - float(inside[0]) * float(slope[piece]))
        for y in (inside, np.nextafter(inside, np.float32(np.inf))):
            t = y.astype(np.float64) * float(slope[piece]) + float(intercept[piece])  # the kernel's fma, unrounded
            if np.any(np.abs(t - np.arange(1, inside.size + 1)) >= PIECES.band / 2):
                return words
    limits = bounds[thresholds]
    binade = np.arange(PIECES.binades)
    lowest = np.where(binade == 0, 0.0, np.ldexp(1.0, binade + PIECES.lowest_exponent - 127))
    highest = np.where(binade == PIECES.binades - 1, np.inf, np.ldexp(1.0, binade + PIECES.lowest_exponent - 126))
    below = np.searchsorted(limits, lowest, side="left")  # the thresholds below each binade
    if np.any(np.searchsorted(limits, highest, side="left") - below > 1):
        return words  # a binade holds two thresholds: one comparison would not place its values
    threshold = np.full(PIECES.most, np.inf, np.float32)
    threshold[: limits.size] = limits
    words[PIECES.kind], words[PIECES.mirror] = kind, 2 * first
    for at, column in (
        (PIECES.slope, slope.view(np.int32)),
        (PIECES.intercept, intercept.view(np.int32)),
        (PIECES.offset, offset),
        (PIECES.last, last),
        (PIECES.threshold, threshold.view(np.int32)),
        (PIECES.binade, below.astype(np.int32)),
    ):
        words[at : at + column.size] = column
    return words


def check_map(name: str, qmap: np.ndarray) -> np.ndarray:
    """``qmap`` as 256 (8-bit) or 16 (4-bit) float32 values, refused unless strictly increasing,
    within [−1, 1] and resolvable by the code lookup."""
    values = np.asarray(qmap)
    if values.dtype != np.float32 or values.shape not in ((CODES,), (16,)):
        raise ValueError(
            f"{name} must hold {CODES} (8-bit codes) or 16 (4-bit codes) float32 values (a code map); got "
            f"{values.dtype} of shape {values.shape}"
        )
    if not np.all(np.isfinite(values)) or values[0] < -1 or values[-1] > 1:
        raise ValueError(
            f"{name} must hold finite values in [-1, 1]; it holds {float(values.min())!r} to {float(values.max())!r}"
        )
    if not np.all(np.diff(values) > 0):
        at = int(np.flatnonzero(np.diff(values) <= 0)[0])
        raise ValueError(
            f"{name} must be increasing; entries {at} and {at + 1} are {values[at]!r} and {values[at + 1]!r}"
        )
    _tables(values.tobytes())
    return values


def code_tables(qmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The midpoints (255 and +inf, float32) and per-bucket lookup entries (int32) the kernels
    take for a checked host ``qmap``."""
    return _tables(np.ascontiguousarray(qmap, np.float32).tobytes())


@dataclass(eq=False)
class QuantizedState:
    """One optimizer state in 8 or 4 bits: ``codes`` (uint8: one code an element, or for 4 bits
    two a byte, the first in the high nibble), ``absmax`` (float32, one per block of each row:
    256 elements for 8 bits, 128 for 4), ``qmap`` (the values codes stand for: 256 entries for
    8 bits, 16 for 4).

    Arrays of any library steadystep steps (NumPy, torch, CuPy, Numba device arrays), all on
    the device of the parameters they serve; ``qmap`` is read on the host when the state is
    made. ``row_length`` splits the state into rows that blocks (and bytes) do not straddle
    (the N workers of a decentralized step); by default the state is one row, of one element a
    code (8 bits) or two a byte (4 bits: give ``row_length`` for a row of odd length). Checked
    when made: dtypes, lengths, a finite absmax and an increasing map.
    """

    codes: Array
    absmax: Array
    qmap: Array
    row_length: Optional[int] = None
    # None: each step stores the nearest code; a seed: one of the two codes around the value,
    # stochastically (unbiased), with bits from the seed, the count of steps that stored the
    # state (``updates``) and each element's index
    rounding_seed: Optional[int] = None
    updates: int = 0

    def __post_init__(self) -> None:
        codes = _arrays.classify("codes", self.codes)
        if codes.kind == "scalar" or _arrays.array_dtype(codes) != np.uint8:
            raise TypeError(f"codes must be a uint8 array (one code per element); got {_arrays.dtype_name(codes)}")
        self.host_map = check_map("qmap", dispatch.host_values(_arrays.classify("qmap", self.qmap)).reshape(-1))
        self.signed = bool(self.host_map[0] < 0)
        self.bits = 8 if self.host_map.size == CODES else 4
        stored = math.prod(codes.shape)
        self.size = stored if self.bits == 8 else 2 * stored
        if self.row_length is not None:
            valid = isinstance(self.row_length, int) and self.row_length >= 1
            per_row = code_bytes(self.row_length, bits=self.bits) if valid else 1
            if not valid or stored % per_row:
                raise ValueError(
                    f"row_length must be a positive int whose rows fill the state's {stored} bytes of "
                    f"{self.bits}-bit codes; got {self.row_length!r}"
                )
            self.size = stored // per_row * self.row_length
        absmax = _arrays.classify("absmax", self.absmax)
        expected = blocks(self.size, self.row_length, bits=self.bits)
        if absmax.kind == "scalar" or _arrays.array_dtype(absmax) != np.float32 or math.prod(absmax.shape) != expected:
            raise ValueError(
                f"absmax must be a float32 array of {expected} values (one per block of {BLOCK_SIZES[self.bits]} "
                f"elements of each row, for {self.bits}-bit codes); got {_arrays.dtype_name(absmax)} of shape "
                f"{absmax.shape}"
            )
        scales = dispatch.host_values(absmax)
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise ValueError("absmax must hold finite values >= 0 (each block's largest magnitude)")
        if codes.kind != absmax.kind:
            raise ValueError("codes and absmax must be on one device")
        if self.rounding_seed is not None:
            checks.count("rounding_seed", self.rounding_seed)
        checks.count("updates", self.updates)

    def kernel_arrays(self, name: str) -> dict[str, Any]:
        """What a blockwise kernel takes for this state as its buffer ``name``: the codes and
        their parts (``dispatch.QUANTIZED_PARTS``), the map's tables made once on the codes' device."""
        tables = self.__dict__.get("tables")
        if tables is None:
            tables = self.__dict__["tables"] = tuple(_like(table, self.codes) for table in code_tables(self.host_map))
        midpoints, lookup = tables
        return {
            name: self.codes,
            f"{name}_absmax": self.absmax,
            f"{name}_qmap": self.qmap,
            f"{name}_midpoints": midpoints,
            f"{name}_lookup": lookup,
        }

    def scratch(self, states: int) -> dict[str, Any]:
        """The blockwise kernels' scratch for a step of ``states`` quantized buffers, made once on
        the codes' device: each block's new absmax, and the flag of a refused step."""
        kept = self.__dict__.get("scratch_arrays")
        if kept is None or kept[0] != states:
            count = blocks(self.size, self.row_length, bits=self.bits) * states
            kept = self.__dict__["scratch_arrays"] = (
                states,
                _arrays.zeros_like(self.codes, count, np.float32),
                _arrays.zeros_like(self.codes, 1, np.float32),
            )
        return {"new_absmax": kept[1], "refused": kept[2]}

    @property
    def elements_a_row(self) -> int:
        """``row_length``, or for a state of one row its size."""
        return self.size if self.row_length is None else self.row_length

    @property
    def shape(self) -> tuple[int, ...]:
        """The codes' shape: the elements' for 8 bits, the bytes' for 4 (``size`` counts elements)."""
        return tuple(_arrays.classify("codes", self.codes).shape)

    def dequantize(self) -> np.ndarray:
        """The float32 values the state stands for, on the host (flat for 4 bits, else in
        ``codes``' shape)."""
        return dequantize(self)


def zeros(
    size: int,
    *,
    signed: bool,
    bits: int = 8,
    like: Optional[Array] = None,
    row_length: Optional[int] = None,
) -> QuantizedState:
    """A state of ``size`` zeros (absmax 0, and the code of 0 where the map has one) with the
    map of `state_map`, in ``like``'s library and device (NumPy by default)."""
    qmap = state_map(signed, bits)
    if bits == 4 and row_length is None and size % 2:
        row_length = size  # one row of odd length: its last byte holds one code
    zero = np.flatnonzero(qmap == 0)
    zero_code = int(zero[0]) if zero.size else 0
    codes = _arrays.zeros_like(like, code_bytes(size, row_length, bits=bits), np.uint8)
    if zero_code:
        codes = _full(codes, zero_code if bits == 8 else zero_code << 4 | zero_code)
    absmax = _arrays.zeros_like(like, blocks(size, row_length, bits=bits), np.float32)
    return QuantizedState(codes, absmax, _like(qmap, like), row_length)


def _full(codes: Any, value: int) -> Any:
    if _arrays.library(codes) in ("numpy", "torch", "cupy"):
        codes[...] = value
        return codes
    host = np.full(codes.shape, value, np.uint8)
    codes.copy_to_device(host)
    return codes


def _like(host: np.ndarray, like: Optional[Array]) -> Any:
    """A copy of ``host`` in ``like``'s library and device (NumPy for None)."""
    if like is None:
        return host.copy()
    out = _arrays.zeros_like(like, host.size, host.dtype)
    dispatch.copy_into(out, np.array(host))  # a writable copy: torch warns of a read-only array
    return out


def packed(codes: np.ndarray, row_length: int) -> np.ndarray:
    """4-bit ``codes`` (one a uint8, rows of ``row_length``) two a byte, the first of each pair
    in the high nibble; a row of odd length ends in a byte whose low nibble is 0."""
    rows = codes.reshape(-1, row_length).astype(np.uint8) if codes.size else codes.reshape(0, max(row_length, 1))
    if row_length % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), np.uint8)], axis=1)
    return (rows[:, 0::2] << 4 | rows[:, 1::2]).reshape(-1)


def unpacked(codes: np.ndarray, row_length: int) -> np.ndarray:
    """The 4-bit codes of ``packed`` bytes, one a uint8, rows of ``row_length``."""
    per_row = -(-row_length // 2)
    rows = np.asarray(codes, np.uint8).reshape(-1, per_row) if codes.size else np.zeros((0, per_row), np.uint8)
    pairs = np.stack([rows >> 4, rows & 15], axis=2).reshape(rows.shape[0], 2 * per_row)
    return pairs[:, :row_length].reshape(-1)


def quantize(
    values: Array,
    *,
    signed: Optional[bool] = None,
    bits: Optional[int] = None,
    qmap: Optional[np.ndarray] = None,
    row_length: Optional[int] = None,
    like: Optional[Array] = None,
) -> QuantizedState:
    """``values`` (any real array; read on the host) as a state: per block, absmax = max |x|
    and each code the nearest entry of the map to x/absmax (``qmap``, or `state_map`, signed
    unless every value is ≥ 0 when ``signed`` is None). ``bits`` (8 by default, or the width
    of ``qmap``) picks the codes and blocks. On ``like``'s device; 8-bit codes keep ``values``'
    shape, 4-bit ones are flat."""
    host = np.asarray(dispatch.host_values(_arrays.classify("values", values)), np.float32).reshape(-1)
    if not np.all(np.isfinite(host)):
        raise ValueError("values must be finite: a quantized state holds no inf or NaN")
    if qmap is None:
        qmap = state_map(bool(np.any(host < 0)) if signed is None else signed, 8 if bits is None else bits)
    qmap = check_map("qmap", np.asarray(qmap))
    width = 8 if qmap.size == CODES else 4
    if bits is not None and _checked_bits(bits) != width:
        raise ValueError(f"qmap holds {qmap.size} values, a map of {width}-bit codes, but bits is {bits}")
    block_size = BLOCK_SIZES[width]
    row_length = host.size if row_length is None else row_length
    scales = np.zeros(blocks(host.size, row_length, bits=width), np.float32)
    codes = np.empty(host.size, np.uint8)
    _, lookup = code_tables(qmap)
    per_row = blocks(row_length, row_length, bits=width) if host.size else 0
    for block in range(scales.size):
        row, column = divmod(block, per_row)
        start = row * row_length + column * block_size
        stop = min(start + block_size, (row + 1) * row_length)
        piece = host[start:stop]
        scales[block] = np.max(np.abs(piece))
        scaled = piece / scales[block] if scales[block] > 0 else np.zeros_like(piece)
        codes[start:stop] = nearest_codes(scaled, lookup)
    shape = _arrays.classify("values", values).shape
    if width == 4:
        codes, shape = packed(codes, row_length), (-1,)
    kept_row = None if row_length == host.size and (width == 8 or host.size % 2 == 0) else row_length
    return QuantizedState(
        _like(codes, like).reshape(shape) if like is not None else codes.reshape(shape),
        _like(scales, like),
        _like(qmap, like),
        kept_row,
    )


def nearest_codes(scaled: np.ndarray, lookup: np.ndarray) -> np.ndarray:
    """The kernels' nearest code (``kernels._numerics.nearest_code``) of float32 values in NumPy."""
    scaled = np.asarray(scaled, np.float32)
    return codes_in_buckets(scaled, lookup[code_buckets(scaled)]).astype(np.uint8)


def element_codes(state: QuantizedState) -> np.ndarray:
    """One code an element of ``state`` (uint8, flat, on the host): its codes, unpacked for 4 bits."""
    codes = dispatch.host_values(_arrays.classify("codes", state.codes)).reshape(-1)
    if state.bits == 8:
        return codes
    return unpacked(codes, state.elements_a_row)


def dequantize(state: QuantizedState) -> np.ndarray:
    """absmax·qmap[code] for every element of ``state``, float32, on the host, in codes' shape
    (flat for 4 bits)."""
    codes = element_codes(state)
    scales = dispatch.host_values(_arrays.classify("absmax", state.absmax)).reshape(-1)
    row_length = state.elements_a_row
    shape = state.shape if state.bits == 8 else (codes.size,)
    if codes.size == 0:
        return np.zeros(shape, np.float32)
    column = np.arange(codes.size) % row_length
    block_size = BLOCK_SIZES[state.bits]
    block = np.arange(codes.size) // row_length * -(-row_length // block_size) + column // block_size
    return (state.host_map[codes] * scales[block]).astype(np.float32).reshape(shape)


def run_step(
    module: str,
    step: Any,
    arrays: dict[str, Any],
    scalars: dict[str, Any],
    *,
    skip_step: Any = None,
    grad_scale: Any = None,
    target: Optional[str] = None,
    per_row: Optional[dict[str, Any]] = None,
) -> None:
    """Run ``step`` (a Step of formula module ``module``) with its quantized form: ``arrays`` as
    for ``dispatch.run_step``, the quantized buffers as `QuantizedState`s of one width, all of
    them or none; the first one's ``rounding_seed`` says how they round."""
    blockwise = {entry.name: entry for entry in _blockwise_steps(module)}.get(step.name)
    given = {name: value for name, value in arrays.items() if isinstance(value, QuantizedState)}
    if blockwise is None:
        raise TypeError(f"{', '.join(given)} is quantized, but this step has no 8-bit form; pass float arrays")
    plain = [name for name in blockwise.quantized if name not in given and arrays.get(name) is not None]
    width = next(iter(given.values())).bits
    if plain:
        names = ", ".join(_caller(step, name) for name in plain)
        raise TypeError(
            f"{names} is a float array but {', '.join(_caller(step, name) for name in given)} is {width}-bit; "
            "give every state of one step in one form"
        )
    missing = [name for name in blockwise.quantized if name not in given]
    if missing:
        raise TypeError(
            f"{', '.join(_caller(step, name) for name in missing)} must be given ({width}-bit, as the others)"
        )
    if any(state.bits != width for state in given.values()):
        widths = ", ".join(f"{_caller(step, name)} {state.bits}-bit" for name, state in given.items())
        raise ValueError(f"every quantized state of a step must have one width; got {widths}")
    lengths = {state.elements_a_row for state in given.values()}
    sizes = {state.size for state in given.values()}
    if len(lengths) > 1 or len(sizes) > 1:
        raise ValueError(f"every {width}-bit state of a step must have one size and one row_length")
    row_length = lengths.pop()
    param = step.updates[0]
    shape = getattr(arrays.get(param), "shape", None)  # an array of any library (what else it is: checked later)
    if shape is not None and math.prod(shape) != next(iter(sizes)):
        raise ValueError(
            f"the {width}-bit states hold {next(iter(sizes))} elements but {_caller(step, param)} has "
            f"{math.prod(shape)}; make them for this parameter"
        )
    for name, signed in zip(blockwise.quantized, blockwise.signed):
        if signed and not given[name].signed:
            raise ValueError(
                f"{_caller(step, name)} holds values of either sign but its qmap starts at 0; use a signed map "
                f"(quantization.state_map(signed=True, bits={width}))"
            )
    mask = arrays.get(step.mask)
    if (
        mask is not None
        and not checks.is_number(mask)
        and math.prod(_arrays.classify(step.mask, mask).shape) != row_length
    ):
        raise ValueError(f"decay_mask must have one value per element of a row ({row_length})")
    for name, value in (per_row or {}).items():
        rows = next(iter(sizes)) // row_length
        if math.prod(_arrays.classify(name, value).shape) != rows:
            raise ValueError(f"{name} must have one value per row ({rows})")
    first = given[blockwise.quantized[0]]
    for name in blockwise.quantized:
        arrays.update(given[name].kernel_arrays(name))
    arrays.update(first.scratch(len(blockwise.quantized)), **(per_row or {}))
    seed = first.rounding_seed
    key = 0 if seed is None else _arrays.rounding_key(seed, first.updates + 1)
    scalars.update(row_length=row_length, state_rounding=key)
    dispatch.run_blockwise(
        module, blockwise, arrays, scalars, skip_step=skip_step, grad_scale=grad_scale, target=target, bits=width
    )
    for state in given.values():
        state.updates += 1


def _caller(step: Any, name: str) -> str:
    return dict(step.names).get(name, name)


@functools.cache
def _blockwise_steps(module: str) -> tuple:
    import importlib

    return getattr(importlib.import_module(f"steadystep.kernels.{module}"), "BLOCKWISE", ())
