"""Registers, spills, shared memory and theoretical occupancy of every CUDA kernel at the
launch the package uses, read from NVIDIA's ptxas for sm_80 and sm_90 (no GPU needed), and
the time each streaming step would take at the H200's HBM bandwidth.

    python -m benchmarks.kernel_resources            # the heaviest kernel of each family, and the steps
    python -m benchmarks.kernel_resources --all      # every kernel
    python -m benchmarks.kernel_resources --device   # on a GPU: the device's own numbers beside ptxas's

The step times are a floor, not a measurement: bytes an element moves (every buffer read
once, every updated one written once) × 10M float32 parameters / 4.8 TB/s, against which a
first run on an H200 can be judged (ci/gpu_check.sh prints both).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.common import table
from steadystep.cuda import assembly
from steadystep.cuda.assembly import MIXING_WORKERS, launch_of
from steadystep.kernels import optim as optim_formulas

H200_BANDWIDTH = 4.8e12  # bytes per second (HBM3e, NVIDIA's datasheet)
PARAMETERS = 10_000_000


def rows_of(kernels: list[assembly.Kernel]) -> list[list[str]]:
    rows = []
    for kernel in kernels:
        threads, dynamic = launch_of(kernel)
        for architecture in assembly.ARCHITECTURES:
            found = assembly.assemble(kernel, architecture)
            rows.append(
                [
                    kernel.name,
                    kernel.family,
                    f"sm_{architecture[0]}{architecture[1]}",
                    threads,
                    found.registers,
                    found.spills,
                    found.stack,
                    found.shared + dynamic,
                    assembly.blocks_per_sm(found, threads, dynamic, architecture),
                    f"{assembly.occupancy(found, threads, dynamic, architecture):.0%}",
                ]
            )
    return rows


def heaviest(kernels: list[assembly.Kernel]) -> list[assembly.Kernel]:
    """The kernel of each family with the most registers on sm_90."""
    chosen: dict[str, tuple[int, assembly.Kernel]] = {}
    for kernel in kernels:
        registers = assembly.assemble(kernel, (9, 0)).registers
        if kernel.family not in chosen or registers > chosen[kernel.family][0]:
            chosen[kernel.family] = (registers, kernel)
    return [kernel for _, kernel in sorted(chosen.values(), key=lambda pair: pair[1].family)]


def step_floor_rows() -> list[list[str]]:
    """The HBM-bandwidth floor of each float32 step over 10M parameters, with every optional
    buffer in use (RMSprop centred with momentum; mixing: N·D = 10M)."""
    rows = []
    for step in optim_formulas.STEPS:
        if step.name in ("adam_schedule", "loss_scale"):  # one-element steps: a launch, not a stream
            continue
        streams = len(step.buffers) + len(step.updates)
        rows.append([f"optim.{step.name}", streams, f"{PARAMETERS * 4 * streams / H200_BANDWIDTH * 1e6:.0f}"])
    streams = 4 + 3  # params, grads, exp_avg, exp_avg_sq read; params and the moments written
    rows.append(
        [
            f"decentral (N = {MIXING_WORKERS}, any mixing)",
            streams,
            f"{PARAMETERS * 4 * streams / H200_BANDWIDTH * 1e6:.0f}",
        ]
    )
    return rows


def device_rows(kernels: list[assembly.Kernel]) -> list[list[str]]:
    """The same kernels compiled for this process's GPU: the driver's registers and resident
    blocks (cuOccupancyMaxActiveBlocksPerMultiprocessor) beside ptxas's prediction."""
    from numba import cuda

    device = cuda.get_current_device()
    architecture = device.compute_capability
    context = cuda.current_context()
    rows = []
    for kernel in kernels:
        threads, dynamic = launch_of(kernel)
        predicted = assembly.assemble(kernel, architecture) if architecture in assembly.HARDWARE else None
        try:
            compiled = cuda.jit(kernel.signature, lto=False)(kernel.function)  # linked as jit_kernel links
            specialised = compiled.overloads[kernel.signature]
            registers = specialised.regs_per_thread
            blocks = context.get_active_blocks_per_multiprocessor(specialised.library.get_cufunc(), threads, dynamic)
        except Exception as error:  # noqa: BLE001 - a first run on real hardware: report, do not stop
            registers, blocks = f"error: {type(error).__name__}: {error}"[:60], "-"
        rows.append(
            [
                kernel.name,
                f"sm_{architecture[0]}{architecture[1]}",
                threads,
                registers,
                predicted.registers if predicted else "-",
                blocks,
                assembly.blocks_per_sm(predicted, threads, dynamic, architecture) if predicted else "-",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every kernel, not the heaviest of each family")
    parser.add_argument("--device", action="store_true", help="also compile for this GPU and ask its driver")
    options = parser.parse_args(argv)
    if assembly.ptxas() is None:
        print("ptxas not found: pip install nvidia-cuda-nvcc (in steadystep's dev extra)", file=sys.stderr)
        return 2
    kernels = list(assembly.kernels())
    chosen = kernels if options.all else heaviest(kernels)
    print(
        f"CUDA kernels at the package's launches, from ptxas ({len(kernels)} kernels; "
        f"{'all' if options.all else 'the heaviest of each family'}):\n"
    )
    print(
        table(
            rows_of(chosen),
            [
                "kernel",
                "family",
                "arch",
                "threads",
                "registers",
                "spilled B",
                "stack B",
                "shared B",
                "blocks/SM",
                "occupancy",
            ],
        )
    )
    print(
        f"\nHBM floor of the float32 steps over {PARAMETERS / 1e6:.0f}M parameters at "
        f"{H200_BANDWIDTH / 1e12:.1f} TB/s (H200):\n"
    )
    print(table(step_floor_rows(), ["step", "streams", "µs"]))
    if options.device:
        print("\nOn this GPU (driver) beside ptxas's prediction:\n")
        print(
            table(
                device_rows(chosen), ["kernel", "arch", "threads", "registers", "predicted", "blocks/SM", "predicted"]
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
