"""What each CUDA kernel asks of real hardware, read without a GPU.

Every kernel the package launches is compiled to PTX for an architecture and assembled by
NVIDIA's ``ptxas`` (the ``nvidia-cuda-nvcc`` wheel ships it, in the dev extra), whose ``-v``
report gives its registers per thread, spills, stack and static shared memory. With the
launch the package really uses for that kernel (`steadystep.cuda.threads.THREADS`)
they give the block's share of an SM's register file and shared memory, and the theoretical
occupancy: what fails a launch ("too many resources requested") or makes it crawl, which
neither the simulator nor the PTX test can see.

Used by the test suite (``tests/test_ptx.py``) and ``python -m benchmarks.kernel_resources``;
nothing here runs in a training loop.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from numba import cuda, types

from steadystep.cuda.threads import mixing_threads, threads_for
from steadystep.kernels import (
    BLOCKWISE_FAMILIES,
    BLOCKWISE_INTEGERS,
    BLOCKWISE_SCRATCH,
    FORMULA_MODULES,
    QUANTIZED_PARTS,
)

ARCHITECTURES = ((8, 0), (9, 0))  # A100, H100/H200: the data-centre GPUs the package is built for


@dataclass(frozen=True)
class Hardware:
    """The per-SM limits of one architecture (CUDA's occupancy calculator's table)."""

    registers: int = 65536
    max_registers_per_thread: int = 255
    register_unit: int = 256  # registers are allocated per warp in units of this many
    max_warps: int = 64
    max_blocks: int = 32
    shared_bytes: int = 167936  # per SM (sm_80: 164 KiB; sm_90: 228 KiB)
    shared_unit: int = 128
    shared_reserved: int = 1024  # per block, for the system (sm_80 on)


HARDWARE = {(8, 0): Hardware(), (9, 0): Hardware(shared_bytes=233472)}


@dataclass(frozen=True)
class Kernel:
    """One kernel as the package launches it."""

    name: str  # module.function
    family: str  # elementwise, step, rows, short_rows, mixing, grid, blockwise, blockwise4, reduction, fill
    function: Any  # the Python function Numba compiles
    signature: tuple


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel on one architecture."""

    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame per thread
    shared: int  # bytes of static shared memory per block

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def kernels() -> Iterator[Kernel]:
    """Every generated kernel with the argument types its launcher passes, then the hand-written ones."""
    for module in FORMULA_MODULES:
        generated = importlib.import_module(f"steadystep.cuda._generated.{module}")
        for name in sorted(vars(generated)):
            function = getattr(getattr(generated, name), "py_func", None)
            family = _family(name)
            if function is None or family is None:
                continue
            float_type = types.float32 if "_f32_" in name else types.float64
            yield Kernel(f"{module}.{name}", family, function, _signature(module, name, family, function, float_type))
            if family in ("step", "mixing", *BLOCKWISE_FAMILIES) and float_type == types.float32:
                # half-precision buffers, in float32: bfloat16 for every such kernel, float16 (the
                # same at/put with another narrowing) for those of FLOAT16_CHECKED
                halves = 2 if name in FLOAT16_CHECKED else 1
                for storage, bits in (("bfloat16", types.uint16), ("float16", types.int16))[:halves]:
                    signature = _signature(module, name, family, function, float_type, bits)
                    yield Kernel(f"{module}.{name}[{storage}]", family, function, signature)
    from steadystep.cuda.primitives import broadcast_fill, convert
    from steadystep.cuda.reductions import chunk_sums, segment_sums

    index = types.int64[::1]
    for float_type, suffix in ((types.float32, "f32"), (types.float64, "f64")):
        vector = float_type[::1]
        yield Kernel(
            f"reductions.chunk_sums_{suffix}",
            "reduction",
            chunk_sums.py_func,
            (vector, vector, vector, index, index, float_type, float_type),
        )
        yield Kernel(
            f"reductions.segment_sums_{suffix}", "reduction", segment_sums.py_func, (vector, vector, index, float_type)
        )
        yield Kernel(f"primitives.broadcast_fill_{suffix}", "fill", broadcast_fill.py_func, (vector, vector))
    for storage, bits in (("bfloat16", types.uint16[::1]), ("float16", types.int16[::1])):
        wide = types.float32[::1]
        yield Kernel(f"primitives.convert_f32[widen {storage}]", "fill", convert.py_func, (wide, bits))
        yield Kernel(f"primitives.convert_f32[round to {storage}]", "fill", convert.py_func, (bits, wide))


# the kernels also checked with float16 buffers: a step with every kind of buffer, and a mixing kernel
FLOAT16_CHECKED = frozenset({"adamw_f32_step", "adam_amsgrad_f32_step", "rmsprop_f32_step", "peer_f32_mix"})


def _family(name: str) -> str | None:
    blockwise = re.search(r"_(blockwise\d*)_(scales|codes)$", name)  # 8-bit codes, or 4-bit ones (``_blockwise4_``)
    if blockwise:
        return blockwise.group(1)
    for ending, family in (
        ("_short_rows", "short_rows"),
        ("_rows", "rows"),
        ("_kernel", "elementwise"),
        ("_step", "step"),
        ("_mix", "mixing"),
        ("_grid", "grid"),
        ("_gossip", "mixing"),
    ):
        if name.endswith(ending):
            return family
    return None


def _signature(module: str, name: str, family: str, function: Any, float_type: Any, storage: Any = None) -> tuple:
    """The argument types of a kernel computing in ``float_type`` (a step's buffers stored as
    ``storage`` when given: the bits of bfloat16 or float16)."""
    parameters = list(inspect.signature(function).parameters)
    vector, matrix = float_type[::1], float_type[:, ::1]
    if family == "elementwise":  # out, then every input an array (the streaming case)
        return (vector,) * len(parameters)
    if family in ("rows", "short_rows"):
        return (matrix if _row_output_rank(name) == 2 else vector, matrix)
    if family == "step":
        step = _declaration(module, "STEPS", name.rsplit("_", 2)[0])
        buffer = vector if storage is None else storage[::1]
        return tuple(
            types.int32[::1]
            if parameter == "segment_ids"
            else types.int64
            if parameter == "rounding"
            else buffer
            if parameter in step.buffers
            else vector
            if parameter in step.indexed or parameter == "grad_scale"
            else float_type
            for parameter in parameters
        )
    if family in BLOCKWISE_FAMILIES:
        return _blockwise_signature(module, name, parameters, float_type, storage)
    if family == "mixing":
        extra = {"peer": (types.int64[::1], float_type, float_type), "complete": (float_type,) * 3, "dense": (matrix,)}[
            name.split("_")[0]
        ]
        rows = matrix if storage is None else storage[:, ::1]
        if name.endswith("_gossip"):  # the rows, the scratch's dtype, the kind's arguments
            return (rows, vector, *extra)
        return (rows,) * 4 + (vector, vector) + extra + (types.boolean,) + (float_type,) * 7
    if module == "compress":
        return tuple(_compress_grid_type(parameter, float_type) for parameter in parameters)
    return tuple(_grid_type(parameter, float_type) for parameter in parameters)


def _blockwise_signature(module: str, name: str, parameters: list[str], float_type: Any, storage: Any) -> tuple:
    """A step with quantized states: its float buffers (or their half bits), each quantized
    buffer's uint8 codes (8-bit, or 4-bit pairs) with its float32 absmax, map and midpoints and
    int32 lookup entries, integer row length and rounding keys."""
    blockwise = _declaration(module, "BLOCKWISE", re.sub(r"_f32_blockwise\d*_(scales|codes)$", "", name))
    step = blockwise.step
    buffer = float_type[::1] if storage is None else storage[::1]
    parts = {
        f"{quantized}_{part}": (types.int32 if part == "lookup" else types.float32)[::1]
        for quantized in blockwise.quantized
        for part in QUANTIZED_PARTS
    }
    parts.update({quantized: types.uint8[::1] for quantized in blockwise.quantized})
    parts.update({name: types.float32[::1] for name in BLOCKWISE_SCRATCH})
    parts.update(grad_scale=float_type[::1])
    parts.update({name: types.int64 for name in BLOCKWISE_INTEGERS})
    parts.update({name: float_type[::1] for name in blockwise.per_row})
    return tuple(
        parts[parameter] if parameter in parts else buffer if parameter in step.buffers else float_type
        for parameter in parameters
    )


def _declaration(module: str, kind: str, name: str) -> Any:
    for declared in getattr(importlib.import_module(f"steadystep.kernels.{module}"), kind, ()):
        if declared.name == name:
            return declared
    raise LookupError(f"{module}.{kind}: {name}")


def _row_output_rank(name: str) -> int:
    row_name = re.sub(r"_f(32|64)_(short_)?rows$", "", name)
    for module in FORMULA_MODULES:
        for row in getattr(importlib.import_module(f"steadystep.kernels.{module}"), "ROWS", ()):
            if row.name == row_name:
                return 2 if row.value is not None or row.outputs > 1 else 1
    raise LookupError(row_name)


def _grid_type(name: str, float_type: Any) -> Any:
    """Argument types of the model grid kernels, by parameter name (workspaces are 3-D)."""
    if name in ("rows", "columns", "w1", "b1", "w2", "b2"):
        return types.int64
    if name in ("relu", "with_tangent"):
        return types.boolean
    if name == "labels":
        return types.int64[::1]
    if name == "valid":
        return float_type[::1]
    if name == "batch":
        return types.int64[:, ::1]
    if name in ("params", "tangent", "features", "losses", "correct", "result"):
        return float_type[:, ::1]
    return float_type[:, :, ::1]


def _compress_grid_type(name: str, float_type: Any) -> Any:
    """Argument types of the compressed-gossip grid kernels, by parameter name."""
    if name in ("rows", "columns", "kind", "key", "block_size", "offset"):
        return types.int64
    if name in ("nearest", "atc"):
        return types.boolean
    if name in ("clip", "decay"):
        return float_type[::1]
    if name == "neighbours":
        return types.int64[:, ::1]
    if name in ("values", "public", "param", "grad", "exp_avg", "exp_avg_sq", "weights", "outer", "residual"):
        return float_type[:, ::1]
    if name in ("sent", "momentum_buffer", "message", "selected", "scales"):
        return float_type[:, ::1]
    return float_type


MIXING_WORKERS = 8  # the mixing kernels' launch is checked at N = 8 workers (their scratch: N values a thread)


def launch_of(kernel: Kernel) -> tuple[int, int]:
    """(threads per block, dynamic shared bytes) the package launches ``kernel`` with."""
    if kernel.family == "mixing":
        itemsize = 4 if "_f32" in kernel.name else 8
        threads = mixing_threads(MIXING_WORKERS, itemsize)
        return threads, MIXING_WORKERS * threads * itemsize
    return threads_for(kernel.family), 0


def ptx(kernel: Kernel, architecture: tuple[int, int]) -> str:
    """``kernel``'s PTX for ``architecture`` (one of ARCHITECTURES), from Numba's NVVM."""
    return _ptx_of_each(kernel)[architecture]


@functools.lru_cache(maxsize=None)
def _ptx_of_each(kernel: Kernel) -> dict[tuple[int, int], str]:
    """The PTX for every architecture of ARCHITECTURES, kept (the checks read it twice).

    Numba's front end (typing, lowering to LLVM IR) is ~90% of a ``compile_ptx`` call and does
    not depend on the architecture; only NVVM does. So the IR is made once and NVVM runs on it
    per architecture, through numba-cuda's internal ``_compile_pyfunc_with_fixup`` (what
    ``compile_ptx`` itself calls), which halves the PTX test. The PTX is the same as
    ``compile_ptx``'s but for the symbols' unique suffix (tests/test_ptx.py checks so); where
    the internal function is missing or changed, each architecture compiles on its own."""
    from numba.cuda import compiler

    with compiling_without_a_gpu():
        front_end = getattr(compiler, "_compile_pyfunc_with_fixup", None)
        if front_end is not None:
            try:
                library, _ = front_end(
                    kernel.function, kernel.signature, device=False, abi="numba", cc=ARCHITECTURES[0]
                )
                return {architecture: library.get_asm_strs(cc=architecture)[0] for architecture in ARCHITECTURES}
            except TypeError:  # another numba-cuda's signature: the public path below
                pass
        return {
            architecture: cuda.compile_ptx(kernel.function, kernel.signature, cc=architecture)[0]
            for architecture in ARCHITECTURES
        }


@contextlib.contextmanager
def compiling_without_a_gpu() -> Iterator[None]:
    """Where no GPU is present, numba-cuda compiles the device functions a kernel calls
    (``primitives.device_function``: compiled once and linked, not inlined in Numba's IR) for
    ARCHITECTURES[0] instead of asking the current device, which it would otherwise do and fail.
    Their compute capability only chooses among atomics, which the package's device functions
    do not use, so the PTX is the same; with a GPU present nothing changes."""
    from numba.cuda import dispatcher

    current = getattr(dispatcher, "get_current_device", None)
    if current is None or cuda.is_available():
        yield
        return
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=ARCHITECTURES[0])
    try:
        yield
    finally:
        dispatcher.get_current_device = current


def ptxas() -> str | None:
    """NVIDIA's assembler: the nvidia-cuda-nvcc wheel's, else one on PATH (a CUDA toolkit's)."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for found in sorted(Path(root).glob("cu*/bin/ptxas")):
                if os.access(found, os.X_OK):
                    return str(found)
    except ImportError:
        pass
    return shutil.which("ptxas")


_REPORT = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SHARED = re.compile(r"(\d+) bytes smem")


@functools.lru_cache(maxsize=None)
def _assembled(source: str, architecture: tuple[int, int], assembler: str) -> Resources:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "kernel.ptx"
        path.write_text(source)
        sm = f"sm_{architecture[0]}{architecture[1]}"
        finished = subprocess.run(
            [assembler, f"-arch={sm}", "-v", str(path), "-o", os.devnull], capture_output=True, text=True
        )
    report = finished.stderr
    if finished.returncode != 0:
        advice = (
            " (this ptxas is older than the NVVM that wrote the PTX: pip install -U nvidia-cuda-nvcc)"
            if "Unsupported .version" in report
            else ""
        )
        raise RuntimeError(f"{assembler} failed on the PTX for {sm}{advice}:\n{report[-2000:]}")
    registers, spills, shared = _REPORT.search(report), _SPILLS.search(report), _SHARED.search(report)
    if registers is None or spills is None:
        raise RuntimeError(f"ptxas reported no resources:\n{report}")
    return Resources(
        int(registers.group(1)),
        int(spills.group(2)),
        int(spills.group(3)),
        int(spills.group(1)),
        int(shared.group(1)) if shared else 0,
    )


def assemble(kernel: Kernel, architecture: tuple[int, int]) -> Resources:
    """ptxas -v's report on ``kernel`` for ``architecture`` (sm_80, sm_90)."""
    assembler = ptxas()
    if assembler is None:
        raise RuntimeError("ptxas not found: pip install nvidia-cuda-nvcc (in steadystep's dev extra)")
    return _assembled(ptx(kernel, architecture), architecture, assembler)


def blocks_per_sm(resources: Resources, threads: int, dynamic_shared: int, architecture: tuple[int, int]) -> int:
    """How many blocks of ``threads`` fit on one SM at once (0: the launch fails)."""
    hardware = HARDWARE[architecture]
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(max(resources.registers, 1) * 32 / hardware.register_unit) * hardware.register_unit
    by_registers = hardware.registers // (per_warp * warps)
    shared = math.ceil((resources.shared + dynamic_shared) / hardware.shared_unit) * hardware.shared_unit
    by_shared = hardware.shared_bytes // (shared + hardware.shared_reserved)
    return min(by_registers, by_shared, hardware.max_warps // warps, hardware.max_blocks)


def occupancy(resources: Resources, threads: int, dynamic_shared: int, architecture: tuple[int, int]) -> float:
    """The theoretical occupancy: resident warps over the SM's maximum."""
    warps = math.ceil(threads / 32)
    return blocks_per_sm(resources, threads, dynamic_shared, architecture) * warps / HARDWARE[architecture].max_warps
