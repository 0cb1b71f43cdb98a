"""The host's share of a small GPU call, layer by layer: where the microseconds of a call go
before the GPU does anything. Run on a GPU machine: python -m benchmarks.launch_gpu
(ci/gpu_check.sh does).

On an H200 every row function took 190 µs or more whatever its size, where torch's took 15 µs
and the copy of the input 20 µs: the GPU waits on the host. Each line below times one layer
of what a call does (microseconds of wall time per call, back-to-back calls, a synchronisation
only at the end), then profiles of our calls say which functions hold the rest: a row call,
a small AdamW step, and a step of the module trainer (8 workers of an MLP), whose update took
1.6 ms on the H200 against torch's 0.6.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

import torch
from numba import cuda

from benchmarks.common import table
from benchmarks.decentral_torch import mlp_case, trainer_of
from steadystep import gradient_descent, optim
from steadystep import numerical_stability as ns

CALLS = 300


@cuda.jit
def _copy(out, x):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = x[i]


def wall_us(function: Callable[[], object]) -> float:
    """Microseconds a call, the GPU synchronised once after CALLS back-to-back calls (best of 3)."""
    for _ in range(5):
        function()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(CALLS):
            function()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / CALLS)
    return best * 1e6


def main() -> None:
    device = torch.device("cuda")
    print(f"host time per call on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    x, out = torch.randn(1000, device=device), torch.empty(1000, device=device)
    rows_x, rows_out = torch.randn(1000, 1000, device=device), torch.empty(1000, 1000, device=device)
    param, grad = torch.randn(100_000, device=device), torch.randn(100_000, device=device)
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    interface = x.__cuda_array_interface__
    device_x, device_out = cuda.as_cuda_array(x), cuda.as_cuda_array(out)
    configured = _copy[8, 128]
    try:
        specialized = _copy.specialize(device_out, device_x)[8, 128]
    except Exception as error:  # noqa: BLE001 - its row then reports the failure
        print(f"specialize() failed: {type(error).__name__}: {error}")
        specialized = None
    step = [0]

    def adamw() -> None:
        step[0] += 1
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=step[0], lr=1e-3)

    layers = {
        "torch: x.__cuda_array_interface__": lambda: x.__cuda_array_interface__,
        "numba: from_cuda_array_interface(that)": lambda: cuda.from_cuda_array_interface(interface, owner=x),
        "numba: device_array.reshape(1000)": lambda: device_x.reshape(1000),
        "numba: launch, 2 device arrays": lambda: _copy[8, 128](device_out, device_x),
        "numba: launch, 2 torch tensors": lambda: _copy[8, 128](out, x),
        "numba: the same, configured once (what the package does)": lambda: configured(device_out, device_x),
        "numba: the same, specialized (no typeof per call)": lambda: specialized(device_out, device_x),
        "torch: torch.sub(x, x, alpha=0.1, out=)": lambda: torch.sub(x, x, alpha=0.1, out=out),
        "ours: sgd_update(x, x, 0.1, out=), 1,000": lambda: gradient_descent.sgd_update(x, x, 0.1, out=out),
        "torch: softmax(1000 × 1000, out=)": lambda: torch.softmax(rows_x, -1, out=rows_out),
        "ours: softmax(1000 × 1000, out=)": lambda: ns.softmax(rows_x, out=rows_out),
        "ours: optim.adamw, 100,000": adamw,
    }
    rows = []
    for name, function in layers.items():
        try:
            rows.append([name, f"{wall_us(function):.1f}"])
        except Exception as error:  # noqa: BLE001 - a layer that fails on this numba-cuda is reported, not fatal
            rows.append([name, f"failed: {type(error).__name__}: {error}"[:80]])
    print(table(rows, ["layer", "µs a call"]))
    _, model, inputs, targets = mlp_case("cuda")
    trainer = trainer_of(model, vmap=True)
    profiled = {
        "ours: softmax(1000 × 1000, out=)": (layers["ours: softmax(1000 × 1000, out=)"], CALLS),
        "ours: optim.adamw, 100,000": (adamw, CALLS),
        "ours: DecentralizedTrainer.step, 8 workers of an MLP": (lambda: trainer.step(inputs, targets), 30),
    }
    for name, (function, calls) in profiled.items():
        function()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            function()
        torch.cuda.synchronize()
        profile.disable()
        report = io.StringIO()
        pstats.Stats(profile, stream=report).sort_stats("tottime").print_stats(15)
        print(f"\n{name}: {calls} calls, the 15 functions of most own time\n{report.getvalue()}")


if __name__ == "__main__":
    main()
