"""Half-precision storage at the kernels' boundary: ``at`` reads a bfloat16 element (uint16
bits) or a float16 one (int16 bits) as the float32 it stands for, ``put`` rounds a float32 or
float64 value to the nearest (ties to even, NaN kept NaN), ``cast_like`` gives a half array's
numbers as float32. Every bfloat16 and float16 bit pattern, and float32 values of every kind,
on the CPU target and on the CUDA target (the simulator in its own run), against torch's and
NumPy's conversions; and the CUDA kernel in PTX, without float64. A CPU with the x86
conversion instructions (F16C, AVX512-BF16) converts by them; elsewhere, and on the GPU, integer
operations (and one float32 addition) do, and both forms give the same bits for every float32."""

import numpy as np
import pytest

from numba import cuda

from steadystep._half import BFLOAT16_BITS, FLOAT16_BITS, narrowed, widened
from tests.conftest import SIMULATOR

torch = pytest.importorskip("torch")

# the simulator runs the kernel's NaN × 1 in NumPy scalars, which warn about it (a GPU does not)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

from steadystep.cuda.primitives import at as cuda_at  # noqa: E402
from steadystep.cuda.primitives import cast_like as cuda_cast_like  # noqa: E402
from steadystep.cuda.primitives import put as cuda_put  # noqa: E402


@cuda.jit
def cuda_copy(source, out):
    i = cuda.grid(1)
    if i < source.shape[0]:
        cuda_put(out, i, cuda_at(source, i) * cuda_cast_like(1.0, source))


def copy_on(target: str):
    """``copy(source, out)``: out[i] = source[i] through at, cast_like and put, on ``target``."""
    if target == "cpu":
        from numba import njit

        from steadystep.cpu.primitives import at, cast_like, put

        @njit(error_model="numpy")
        def copy(source, out):
            for i in range(source.shape[0]):
                put(out, i, at(source, i) * cast_like(1.0, source))

        return copy

    def launch(source: np.ndarray, out: np.ndarray) -> None:
        result = cuda.to_device(out)
        cuda_copy[(source.shape[0] + 255) // 256, 256](cuda.to_device(source), result)
        out[...] = result.copy_to_host()

    return launch


# Every bit pattern; the simulator runs each GPU thread in Python, so it takes every 16th
# (and every pattern of the edges: zeros, subnormals, infinities and NaNs of both signs).
ALL_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
if SIMULATOR:
    ALL_BITS = np.union1d(ALL_BITS[::16], np.r_[0:64, 0x7BC0:0x7C40, 0x7F70:0x8040, 0xFBC0:0xFC40, 0xFF70:0x10000])
    ALL_BITS = ALL_BITS.astype(np.uint16)


def float32_cases(dtype=np.float32) -> np.ndarray:
    """Random float32 bit patterns (every exponent), ties of both parities for both half
    formats, the edges of their ranges, zeros, infinities, NaNs with payloads, subnormals."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 1 << 32, 3_000 if SIMULATOR else 400_000, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF,
         0x00000001, 0x807FFFFF, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7F8000, 0x7F7FFFFF,
         0x477FEFFF, 0x477FF000, 0x38800000, 0x337FFFFF, 0x33800000, 0x33800001],
        np.uint32,
    )  # fmt: skip
    ties = (rng.integers(0, 1 << 16, 500 if SIMULATOR else 2000, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    values = np.concatenate([words, special, ties]).view(np.float32)
    with np.errstate(invalid="ignore"):  # the NaNs' payloads
        return values.astype(dtype) if dtype is np.float64 else values


def same(ours: np.ndarray, reference: np.ndarray, values_of) -> None:
    """Equal bits, except that a NaN need only be a NaN (torch makes every NaN one canonical
    one); ``values_of`` gives the float values the bits stand for."""
    nan = np.isnan(values_of(ours))
    assert np.array_equal(nan, np.isnan(values_of(reference)))
    assert np.array_equal(ours[~nan], reference[~nan])


def bfloat16(bits: np.ndarray) -> np.ndarray:
    return widened(bits, BFLOAT16_BITS)


def float16(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16)


def float32(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float32)


def test_every_bfloat16_and_float16_widens_exactly(target):
    copy = copy_on(target)
    for bits, dtype, reference in (
        (ALL_BITS, BFLOAT16_BITS, torch.from_numpy(ALL_BITS.view(np.int16)).view(torch.bfloat16).float().numpy()),
        (ALL_BITS.view(np.int16), FLOAT16_BITS, ALL_BITS.view(np.float16).astype(np.float32)),
    ):
        out = np.empty(bits.shape, np.float32)
        copy(bits, out)
        same(out.view(np.uint32), reference.view(np.uint32), float32)
        same(widened(bits, dtype).view(np.uint32), reference.view(np.uint32), float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bfloat16_narrows_as_torch_rounds(dtype, target):
    copy = copy_on(target)
    values = float32_cases(dtype)
    reference = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    out = np.empty(values.shape, np.uint16)
    copy(values, out)
    same(out, reference, bfloat16)
    same(narrowed(values, BFLOAT16_BITS), reference, bfloat16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float16_narrows_as_torch_rounds(dtype, target):
    """float64 values are rounded to float32 first, as torch does (NumPy rounds them once: the
    two differ where the float32 rounding makes a tie)."""
    copy = copy_on(target)
    values = float32_cases(dtype)
    reference = torch.from_numpy(values).to(torch.float16).view(torch.int16).numpy()
    if dtype is np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            assert np.array_equal(
                reference[~np.isnan(values)], values.astype(np.float16).view(np.int16)[~np.isnan(values)]
            )
    out = np.empty(values.shape, np.int16)
    copy(values, out)
    same(out, reference, float16)
    same(narrowed(values, FLOAT16_BITS), reference, float16)


def test_a_nan_narrows_to_a_quiet_nan_of_its_sign(target):
    """A signalling NaN whose payload lies in the bits that go must not become infinity."""
    copy = copy_on(target)
    values = np.array([0x7F800001, 0xFF800001, 0x7FC00000], np.uint32).view(np.float32)
    out = np.empty(3, np.uint16)
    copy(values, out)
    assert out.tolist() == [0x7FC0, 0xFFC0, 0x7FC0]


@pytest.mark.skipif(SIMULATOR, reason="PTX needs the real CUDA compiler")
@pytest.mark.parametrize(
    ("source", "out"),
    [("uint16", "float32"), ("float32", "uint16"), ("int16", "float32"), ("float32", "int16")],
)
def test_the_cuda_conversions_compile_to_ptx_without_float64(source, out):
    from numba import types

    signature = (getattr(types, source)[::1], getattr(types, out)[::1])
    ptx, _ = cuda.compile_ptx(cuda_copy.py_func, signature, cc=(8, 0))
    assert ".f64" not in ptx


def test_a_float16_nan_keeps_its_sign_and_upper_payload_made_quiet(target):
    """As x86's vcvtps2ph and vcvtph2ps do, on every target and in the host's conversions."""
    copy = copy_on(target)
    words = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7FBFFFFF, 0xFFFFE000], np.uint32)
    expected = np.array([0x7E00, 0xFE00, 0x7E00, 0x7FFF, 0xFFFF], np.uint16).view(np.int16)
    out = np.empty(words.shape, np.int16)
    copy(words.view(np.float32), out)
    assert out.tolist() == expected.tolist()
    assert narrowed(words.view(np.float32), FLOAT16_BITS).tolist() == expected.tolist()
    halves = np.array([0x7C01, 0xFD55, 0x7E00, 0x7C00], np.uint16).view(np.int16)
    expected_words = [0x7FC02000, 0xFFEAA000, 0x7FC00000, 0x7F800000]
    wide = np.empty(halves.shape, np.float32)
    copy(halves, wide)
    assert wide.view(np.uint32).tolist() == expected_words
    assert widened(halves, FLOAT16_BITS).view(np.uint32).tolist() == expected_words


def _conversion_pair(dtype, widening: bool):
    """A kernel counting, over a range of float32 words (or of half bits, ``widening``), where
    the CPU's conversion instruction and the integer operations give different bits."""
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.extending import intrinsic

    from steadystep import _primitives

    half = _primitives.BFLOAT16_BITS if dtype == "bfloat16" else _primitives.FLOAT16_BITS

    @intrinsic
    def differ(typingctx, word):
        def codegen(context, builder, sig, args):
            if widening:
                bits = builder.trunc(args[0], ir.IntType(16))
                forms = [
                    builder.bitcast(_primitives.widened(builder, bits, half, hardware), ir.IntType(32))
                    for hardware in (True, False)
                ]
            else:
                value = builder.bitcast(args[0], ir.FloatType())
                forms = [
                    builder.zext(_primitives.narrowed(builder, value, half, hardware), ir.IntType(32))
                    for hardware in (True, False)
                ]
            return builder.zext(builder.icmp_unsigned("!=", *forms), ir.IntType(32))

        return types.uint32(types.uint32), codegen

    @njit(parallel=True, error_model="numpy")
    def count(start, length):
        total = 0
        for k in prange(length):
            total += differ(np.uint32(start + k))
        return total

    return count


@pytest.mark.skipif(SIMULATOR, reason="the CPU's conversion instructions")
@pytest.mark.parametrize(("dtype", "feature"), [("bfloat16", "+avx512bf16"), ("float16", "+f16c")])
def test_the_cpus_conversion_instructions_give_the_integer_operations_bits_for_every_float32(dtype, feature):
    """Where Numba compiles for a CPU with them, put and at convert by instruction (bfloat16:
    with a fix for float32 subnormals, which vcvtneps2bf16 reads as zero); the integer
    operations serve the GPU and other CPUs. Both, on every float32 word and every half."""
    from steadystep import _primitives

    if feature not in _primitives.cpu_features():
        pytest.skip(f"this CPU lacks {feature}")
    if dtype == "bfloat16" and not _primitives.BFLOAT16_FPTRUNC:
        pytest.skip("this LLVM cannot lower bfloat16's fptrunc (LLVM 14 aborts)")
    narrowing = _conversion_pair(dtype, widening=False)
    assert sum(narrowing(start, 1 << 28) for start in range(0, 1 << 32, 1 << 28)) == 0
    assert _conversion_pair(dtype, widening=True)(0, 1 << 16) == 0
