"""Every CUDA kernel compiles to PTX with the real compiler and assembles for real hardware
(no GPU needed).

The simulator runs kernels as Python and accepts code NVVM rejects; this does not. A float32
kernel must contain no float64 instruction. NVIDIA's assembler, ptxas (the nvidia-cuda-nvcc
wheel of the dev extra), then assembles each kernel for sm_80 and sm_90, and what it reports
(registers, spills, shared memory) is checked against the launch the package uses for the
kernel (steadystep.cuda.threads.THREADS, through assembly.launch_of): the block fits an SM
with room for a second, nothing spills, and the occupancy is at least its family's floor.
"""

import importlib
import inspect
import re

import pytest

from steadystep.kernels import BLOCKWISE_FAMILIES, FORMULA_MODULES
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="PTX needs the real CUDA compiler, not the simulator")

if not SIMULATOR:
    from numba import cuda, types

    from steadystep.cuda import assembly

    KERNELS = list(assembly.kernels())
else:
    KERNELS = []

# A kernel of each family for the checks that compile it again: the one of fewest arguments
# (the first of the grid family takes 25 and seconds to compile; its smallest, 10)
ONE_EACH: dict = {}
for _kernel in sorted(KERNELS, key=lambda kernel: len(kernel.signature)):
    ONE_EACH.setdefault(_kernel.family, _kernel)


@pytest.fixture(autouse=True)
def _device_functions_compile_without_a_gpu():
    """compile_ptx, called here directly, compiles the device functions a kernel calls (linked,
    for NVVM to inline) for the current device, which this machine may lack."""
    with assembly.compiling_without_a_gpu():
        yield


F64 = re.compile(r"\b[a-z.]+\.f64\b")
# The kernels whose formulas call libdevice's exp, log, pow or cos(πx): those functions' own
# polynomials are written with fused multiply-adds, which no compiler option takes apart.
LIBDEVICE_MATH = re.compile(r"exp|log|sigmoid|softplus|softmax|pow|cosine|schedule|sample_pass")
# The least theoretical occupancy each family must reach at its launch: the streaming kernels
# hide memory latency with warps (half the SM's); the mixing kernels three blocks of eight
# warps (3/8: their float64 kernels keep each thread's loop over N workers' doubles in 68–74
# registers, and a cap of 64 spills 52–104 bytes), with N loads in flight per thread; the row
# and model kernels are few blocks of heavier threads (two blocks an SM: a quarter).
OCCUPANCY_FLOOR = {
    "elementwise": 0.5,
    "step": 0.5,
    "reduction": 0.5,
    "fill": 0.5,
    "mixing": 0.375,
    "rows": 0.25,
    "short_rows": 0.25,
    "grid": 0.25,
    "blockwise": 0.5,
    "blockwise4": 0.5,
}


FLOAT_MIN_MAX = re.compile(r"\b(?:min|max)(?:\.\w+)*\.f(?:32|64)\b")


def _assert_float32_clean(name, ptx):
    if "_f32" in name:
        assert not F64.findall(ptx), sorted(set(F64.findall(ptx)))


def _assert_instructions(kernel, ptx):
    """What each family's kernels must (not) contain, whatever the architecture."""
    assert ".entry" in ptx
    _assert_float32_clean(kernel.name, ptx)
    if not LIBDEVICE_MATH.search(kernel.name):  # -fma=0 (cuda/runtime.py): the CPU's and the simulator's bits
        assert "fma." not in ptx
        # a formula's min and max keep a NaN as the CPU's do (primitives.python_min), not fmin/fmax;
        # Welford's largest magnitudes are never NaN (|x| of finite x, or 0), and LLVM, proving it,
        # may then take max.f32, which gives the same
        if "welford" not in kernel.name:
            assert not FLOAT_MIN_MAX.search(ptx), FLOAT_MIN_MAX.search(ptx)
    if kernel.family in ("rows", "short_rows"):  # a block-wide reduction, or one thread per row folding its own
        assert ("bar.sync" in ptx) == (kernel.family == "rows")
    if kernel.family == "mixing":  # in place: each thread mixes from its column's scratch, with no barrier
        assert "ld.shared" in ptx and "st.shared" in ptx and "bar.sync" not in ptx
    if kernel.family in BLOCKWISE_FAMILIES:  # maxima meet in a shared-memory tree; codes wait for absmax
        assert "bar.sync" in ptx
    if kernel.family == "reduction":  # atomics would sum in whatever order blocks finish: norms would vary
        assert "atom." not in ptx and "red." not in ptx


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.name)
def test_kernel_compiles_and_fits_its_launch_on_sm80_and_sm90(kernel):
    assembler = assembly.ptxas()
    assert assembler, "ptxas not found: pip install nvidia-cuda-nvcc (in the dev extra)"
    threads, dynamic_shared = assembly.launch_of(kernel)
    for architecture in assembly.ARCHITECTURES:
        ptx = assembly.ptx(kernel, architecture)
        _assert_instructions(kernel, ptx)
        found = assembly.assemble(kernel, architecture)
        context = f"{kernel.name} on sm_{architecture[0]}{architecture[1]}: {found}, {threads} threads"
        hardware = assembly.HARDWARE[architecture]
        assert found.spills == 0, context
        assert found.registers * threads <= hardware.registers // 2, context  # a second block fits beside it
        blocks = assembly.blocks_per_sm(found, threads, dynamic_shared, architecture)
        assert blocks >= 2, context
        occupancy = assembly.occupancy(found, threads, dynamic_shared, architecture)
        assert occupancy >= OCCUPANCY_FLOOR[kernel.family], f"{context}: occupancy {occupancy:.0%}"


@pytest.mark.parametrize(
    "kernel",
    [kernel for kernel in KERNELS if kernel.family == "elementwise" and "_f32" in kernel.name],
    ids=lambda kernel: kernel.name,
)
def test_elementwise_kernels_with_scalar_operands_compile_without_float64_in_float32(kernel):
    """Numbers reach a kernel as scalars, not arrays: a second specialisation of each."""
    float_type = types.float32 if "_f32" in kernel.name else types.float64
    signature = (kernel.signature[0],) + tuple(
        float_type if index % 2 else argument for index, argument in enumerate(kernel.signature[1:])
    )
    ptx, _ = cuda.compile_ptx(kernel.function, signature, cc=assembly.ARCHITECTURES[-1])
    assert ".entry" in ptx
    _assert_float32_clean(kernel.name, ptx)


def _canonical(ptx: str) -> str:
    """PTX without what differs from one compile of the same kernel to the next: the mangled
    symbols (a compile counter and a hash in them) and the shared arrays' counters (numbered
    in order of first appearance instead)."""
    ptx = re.sub(r"_ZN[0-9A-Za-z_]+", "_ZN", ptx)
    numbers: dict[str, str] = {}
    return re.sub(r"_cudapy_smem_\d+", lambda found: numbers.setdefault(found[0], f"smem{len(numbers)}"), ptx)


def test_the_ptx_is_what_compile_ptx_gives_for_each_architecture():
    """assembly.ptx compiles Numba's front end once for both architectures (NVVM alone runs per
    architecture): the same PTX as the public compile_ptx, for a kernel of each family."""
    for kernel in ONE_EACH.values():
        for architecture in assembly.ARCHITECTURES:
            expected = cuda.compile_ptx(kernel.function, kernel.signature, cc=architecture)[0]
            got = assembly.ptx(kernel, architecture)
            assert got != assembly.ptx(kernel, [a for a in assembly.ARCHITECTURES if a != architecture][0])
            assert _canonical(got) == _canonical(expected), (kernel.name, architecture)


def test_every_family_of_kernels_is_checked():
    families = {kernel.family for kernel in KERNELS}
    assert families == set(OCCUPANCY_FLOOR) and len(KERNELS) > 150


def test_the_occupancy_model_matches_cudas_calculator():
    """Worked cases of CUDA's occupancy calculator (sm_80): 32 registers and 256 threads fill the
    SM; 64 registers halve it; 255 registers leave one block of 256; 48 KiB of shared memory a
    block allow three."""

    def occupancy(registers, threads, shared=0):
        return assembly.occupancy(assembly.Resources(registers, 0, 0, 0, 0), threads, shared, (8, 0))

    assert occupancy(32, 256) == 1.0
    assert occupancy(64, 256) == 0.5
    assert occupancy(255, 256) == 0.125
    assert occupancy(32, 256, 48 * 1024) == 3 * 8 / 64


def test_the_model_kernels_leave_room_on_the_sm():
    """The parameter gradient was one kernel of 255 registers a thread that spilled (one block of
    256 threads an SM, and a launch that fails if the compiler needs one more): now three. The
    test above assembles each and holds it to a second block beside it, which at the grid
    launch allows at most 128 registers a thread (so this reads that bound, not the kernels again)."""
    grid = [kernel for kernel in KERNELS if kernel.family == "grid"]
    assert grid
    for kernel in grid:
        threads, _ = assembly.launch_of(kernel)
        for architecture in assembly.ARCHITECTURES:
            assert assembly.HARDWARE[architecture].registers // 2 // threads <= 128, kernel.name


def test_only_the_package_s_kernels_are_compiled_without_contraction():
    """The fma check above can fail: NVVM contracts a multiply and an add by default, as it still
    does in a kernel of the user's, and did in the package's kernels (a GPU then stored other
    8-bit scales than the CPU: 1,139 of 4,096 momenta a float32 ulp apart)."""

    def user_kernel(x, y):
        i = cuda.grid(1)
        x[i] = x[i] * y[i] + 1.0

    assert "fma.rn.f32" in cuda.compile_ptx(user_kernel, "void(float32[:], float32[:])", cc=(9, 0))[0]
    momentum = next(kernel for kernel in KERNELS if kernel.name == "gradient_descent.sgd_momentum_update_f32_kernel")
    ptx = cuda.compile_ptx(momentum.function, momentum.signature, cc=(9, 0))[0]
    assert "fma." not in ptx and "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    # and a launch links that PTX: nvJitLink, given LTO-IR (numba-cuda's default where it is
    # installed), contracted them again on an H200
    from numba.cuda.dispatcher import CUDADispatcher

    from steadystep.cuda import primitives, reductions

    modules = [importlib.import_module(f"steadystep.cuda._generated.{name}") for name in FORMULA_MODULES]
    launched = [
        value
        for module in (*modules, primitives, reductions)
        for value in vars(module).values()
        if isinstance(value, CUDADispatcher) and not value.targetoptions["device"]
    ]
    assert len(launched) > 200 and {kernel.targetoptions["lto"] for kernel in launched} == {False}


def test_the_occupancy_warning_the_gpu_backend_silences_is_the_one_numba_cuda_raises():
    """numba-cuda 0.30 warns with a class of its own (numba.cuda.core.errors), not numba.core's:
    silencing numba.core's left every small launch's warning printed on an H200."""
    from numba.cuda import dispatcher
    from numba.cuda.core import errors

    assert dispatcher.errors is errors and "NumbaPerformanceWarning" in inspect.getsource(dispatcher)


def test_float64_kernels_do_use_float64():
    """The f64 check above can fail: the same scan finds f64 in a float64 kernel."""
    kernel = next(kernel for kernel in KERNELS if kernel.name == "gradient_descent.adam_update_f64_kernel")
    assert F64.findall(assembly.ptx(kernel, assembly.ARCHITECTURES[-1]))


def test_the_resource_table_prints_every_family_and_the_step_floors(capsys, monkeypatch):
    """python -m benchmarks.kernel_resources, on one kernel of each family (the heaviest search
    assembles them all, which the test above already does)."""
    from benchmarks import kernel_resources

    monkeypatch.setattr(kernel_resources, "heaviest", lambda kernels: list(ONE_EACH.values()))
    assert kernel_resources.main([]) == 0
    printed = capsys.readouterr().out
    assert all(f" {family} " in printed for family in OCCUPANCY_FLOOR)
    floors = {row[0]: (row[1], row[2]) for row in kernel_resources.step_floor_rows()}
    assert floors["optim.adamw"] == (7, "58")  # 10M × 4 B × 7 streams / 4.8 TB/s
    assert floors["optim.sgd"] == (5, "42")
