"""Half-precision values as the bits kernels store them (bfloat16 as uint16, float16 as int16),
on the host: what the CUDA simulator's ``at``/``put`` use, and the references the kernels'
conversions are tested against. Widening is exact; narrowing rounds to nearest, ties to even;
either keeps a NaN a NaN (its sign and upper payload, made quiet), as x86's conversion
instructions do."""

import numpy as np

BFLOAT16_BITS = np.dtype(np.uint16)
FLOAT16_BITS = np.dtype(np.int16)


def widened(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The float32 values that half ``bits`` (of ``dtype``: uint16 for bfloat16, int16 for float16) stand for."""
    bits = np.asarray(bits, dtype)
    if dtype == BFLOAT16_BITS:
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    with np.errstate(invalid="ignore"):
        words = bits.view(np.float16).astype(np.float32).view(np.uint32)
    nan = (words & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, words | np.uint32(0x400000), words).view(np.float32)  # made quiet, as vcvtph2ps does


def narrowed(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The bits (``dtype``) of the half values nearest ``values`` (float64 values are rounded to
    float32 first, as torch's conversions do)."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond the range: inf; a NaN: a NaN
        single = np.asarray(values, np.float32)
        word = single.view(np.uint32)
        if dtype == FLOAT16_BITS:  # a NaN's upper payload kept, made quiet, as vcvtps2ph does
            nan = (
                ((word >> np.uint32(16)) & np.uint32(0x8000))
                | np.uint32(0x7E00)
                | ((word >> np.uint32(13)) & np.uint32(0x1FF))
            )
            return (
                np.where(np.isnan(single), nan, single.astype(np.float16).view(np.uint16))
                .astype(np.uint16)
                .view(np.int16)
            )
        upper = word >> np.uint32(16)
        rounded = (word + (np.uint32(0x7FFF) + (upper & np.uint32(1)))) >> np.uint32(16)  # a NaN's may wrap: unused
    return np.where(np.isnan(single), upper | np.uint32(0x40), rounded).astype(np.uint16)


def random_bits(index: np.ndarray, key: int) -> np.ndarray:
    """The 32 random bits of elements ``index`` under ``key`` (steadystep._primitives.random_bits)."""
    index = np.asarray(index, np.uint64)
    key_bits = np.uint64(key & 0xFFFFFFFFFFFFFFFF)
    folded = index ^ (index >> np.uint64(32))
    word = ((folded ^ key_bits) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return word * np.uint32(0x9E3779B1) + np.uint32(int(key_bits) >> 32)


LARGEST_BFLOAT16_WORD = 0x7F7F0000


def stochastic_bfloat16(values: np.ndarray, index: np.ndarray, key: int) -> np.ndarray:
    """The bfloat16 bits of ``values`` rounded stochastically under ``key`` (round to nearest
    where ``key`` is 0, where a value is not finite or beyond the largest finite bfloat16)."""
    single = np.asarray(values, np.float32)
    nearest = narrowed(single, BFLOAT16_BITS)
    if key == 0:
        return nearest
    word = single.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = ((word + (random_bits(index, key) >> np.uint32(16))) >> np.uint32(16)).astype(np.uint16)
    return np.where((word & np.uint32(0x7FFFFFFF)) < LARGEST_BFLOAT16_WORD, rounded, nearest)
