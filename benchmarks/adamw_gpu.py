"""float32 AdamW on a CUDA GPU: steadystep (on torch CUDA tensors, zero-copy) against
torch.optim.AdamW(fused=True) and the achieved HBM bandwidth of a 7-stream probe; then AdamW
with 8-bit and 4-bit moments against the same step in float32, against the bytes they must
move at the probe's bandwidth, and against bitsandbytes' AdamW8bit where it is installed.

Run on a GPU machine: python -m benchmarks.adamw_gpu (ci/gpu_check.sh does). Times are
CUDA-event medians; bandwidth counts the 7 streams an AdamW step must move (4 reads, 3 writes).
The "wall" columns are host time per step over back-to-back steps: where the kernel is short
(small models), Python and the launch, not the GPU, set the pace of a training loop.
"""

from __future__ import annotations

import statistics
import time

import torch
from numba import cuda

import steadystep.torch
from benchmarks.adamw_cpu import BETAS, EPS, LR, WEIGHT_DECAY, mlp
from benchmarks.common import table
from steadystep import optim, quantization


@cuda.jit
def seven_stream_probe(param, grad, exp_avg, exp_avg_sq):
    for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        g = grad[i]
        exp_avg[i] = exp_avg[i] + g
        exp_avg_sq[i] = exp_avg_sq[i] + g
        param[i] = param[i] + g


def cuda_median_ms(function, repeats: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        function()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_us(function, device: torch.device, steps: int = 200) -> float:
    """Host µs per call over ``steps`` back-to-back calls, the device drained at both ends."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    function()
    synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        function()
    synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def drop_in_steps(device: torch.device) -> dict[str, float]:
    """Wall µs per step of steadystep.torch.AdamW and torch's fused AdamW on the benchmarks'
    400k-parameter MLP (6 tensors) on ``device``, fixed gradients."""
    found = {}
    for name, make in (
        ("steadystep.torch.AdamW", steadystep.torch.AdamW),
        ("torch.optim.AdamW(fused=True)", lambda ps, **o: torch.optim.AdamW(ps, fused=True, **o)),
    ):
        network = mlp().to(device)
        for parameter in network.parameters():
            parameter.grad = torch.randn_like(parameter)
        optimizer = make(network.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        found[name] = wall_us(optimizer.step, device)
    return found


def low_bit_rows(device: torch.device, sizes: tuple[int, ...], timer, bandwidth: float) -> list[list[str]]:
    """AdamW with quantized moments at each size: ms a step for float32, 8-bit and 4-bit moments
    (and bitsandbytes' AdamW8bit where installed), each width's time against its bytes at
    ``bandwidth`` (TB/s): p and g read, p written, the two code streams read and written."""
    rows = []
    for size in sizes:
        param = torch.randn(size, device=device)
        grad = torch.randn(size, device=device) * 1e-3
        times = {}
        for bits in (32, 8, 4):
            if bits == 32:
                moments = [torch.zeros_like(param), torch.zeros_like(param)]
            else:
                moments = [quantization.zeros(size, signed=signed, bits=bits, like=param) for signed in (True, False)]
            count = [0]

            def step(moments=moments, count=count) -> None:
                count[0] += 1
                optim.adamw(param, grad, *moments, step=count[0], lr=LR, betas=BETAS, eps=EPS)

            times[bits] = timer(step)
        floor = {bits: (12 + 2 * 2 * bits / 8) * size / (bandwidth * 1e12) * 1e3 for bits in (8, 4)}
        peer = "not installed"
        try:
            import bitsandbytes

            peer_param = param.clone().requires_grad_()
            peer_param.grad = grad.clone()
            peer = f"{timer(bitsandbytes.optim.AdamW8bit([peer_param], lr=LR).step) / times[8]:.2f}"
        except ImportError:
            pass
        rows.append(
            [
                f"{size:,}",
                f"{times[32]:.3f}",
                f"{times[8]:.3f}",
                f"{times[8] / floor[8]:.2f}",
                f"{times[4]:.3f}",
                f"{times[4] / floor[4]:.2f}",
                peer,
            ]
        )
    return rows


def main() -> None:
    device = torch.device("cuda")
    print(f"float32 AdamW step on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    rows = []
    for size in (100_000, 1_000_000, 10_000_000, 100_000_000):
        param = torch.randn(size, device=device)
        grad = torch.randn(size, device=device)
        exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
        count = [0]

        def ours():
            count[0] += 1
            optim.adamw(param, grad, exp_avg, exp_avg_sq, step=count[0])

        peer_param = param.clone().requires_grad_()
        peer_param.grad = grad.clone()
        peer = torch.optim.AdamW([peer_param], fused=True)
        views = [cuda.as_cuda_array(t) for t in (param, grad, exp_avg, exp_avg_sq)]
        blocks = min(65535, (size + 255) // 256)

        def probe():
            seven_stream_probe[blocks, 256](*views)

        mine, theirs, floor = cuda_median_ms(ours), cuda_median_ms(peer.step), cuda_median_ms(probe)
        bandwidth = 7 * 4 * size / (floor * 1e-3) / 1e12
        my_wall, their_wall = wall_us(ours, device), wall_us(peer.step, device)
        rows.append(
            [
                f"{size:,}",
                f"{mine * 1e3:.1f}",
                f"{theirs * 1e3:.1f}",
                f"{floor * 1e3:.1f}",
                f"{theirs / mine:.2f}",
                f"{mine / floor:.2f}",
                f"{bandwidth:.2f}",
                f"{my_wall:.1f}",
                f"{their_wall:.1f}",
                f"{their_wall / my_wall:.2f}",
            ]
        )
    print(
        table(
            rows,
            [
                "params",
                "ours µs",
                "torch fused µs",
                "probe µs",
                "torch/ours",
                "ours/probe",
                "probe TB/s",
                "ours wall µs",
                "torch wall µs",
                "torch/ours wall",
            ],
        )
    )
    rows = low_bit_rows(device, (10_000_000, 100_000_000), lambda f: cuda_median_ms(f, repeats=20, warmup=3), bandwidth)
    print("\nAdamW with blockwise moments, CUDA-event ms a step; /floor: against its bytes at the probe's bandwidth")
    headers = ["params", "float32 ms", "8-bit ms", "8-bit/floor", "4-bit ms", "4-bit/floor", "bitsandbytes 8-bit/ours"]
    print(table(rows, headers))
    steps = drop_in_steps(device)
    mine, theirs = steps["steadystep.torch.AdamW"], steps["torch.optim.AdamW(fused=True)"]
    print(
        f"torch drop-in on a 400k-parameter MLP, wall µs per step: steadystep.torch.AdamW {mine:.1f}, "
        f"torch.optim.AdamW(fused=True) {theirs:.1f}, torch fused/ours {theirs / mine:.2f}"
    )


if __name__ == "__main__":
    main()
