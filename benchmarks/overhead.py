"""The Python around a small call: microseconds per call on 1,000 float32 elements (in cache,
where the kernel itself takes well under a microsecond), steadystep beside torch's own call
for the same work. Run: python -m benchmarks.overhead [--quick].

What it measures is the per-call cost of classifying the arguments, checking them (or finding
them already checked) and launching: what a training loop of many small tensors pays.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch

from numba import njit

from benchmarks.common import compare, machine, seven_stream_probe, table
from steadystep import decentral, gradient_descent, optim

SIZE, CALLS = 1000, 200
# The targets of issue 50, in µs on the machine where torch.sub(x, g, alpha=, out=) took 1.6 µs
# a call: a machine's Python runs a call of torch's as fast as it runs one of ours, so each
# target is scaled here by this machine's torch.sub time over 1.6 µs.
REFERENCE_TORCH_SUB = 1.6
TARGETS = {
    ("elementwise", "NumPy arrays"): 3.0,
    ("elementwise", "torch tensors"): 6.0,
    ("adamw", "NumPy arrays"): 4.0,
    ("decentralized", "NumPy arrays"): 30.0,
}
LARGE = 100_000  # a small model's AdamW step, against its memory probe: the Python's share
LARGE_TARGET = 1.15


@njit(cache=True, error_model="numpy")
def _bare_sgd(out, param, grad, lr):
    for i in range(out.shape[0]):
        out[i] = param[i] - lr * grad[i]


def per_call(function: Callable[[], object]) -> Callable[[], None]:
    """``function`` run CALLS times: one timed sample is a batch, so the timer's own cost vanishes."""

    def batch() -> None:
        for _ in range(CALLS):
            function()

    return batch


def contenders() -> list[tuple[str, str, dict]]:
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((2, SIZE), dtype=np.float32)
    m, v, out = np.zeros_like(x), np.zeros_like(x), np.empty_like(x)
    tx, tg, tm, tv, tout = (torch.from_numpy(a.copy()) for a in (x, g, m, v, out))
    parameter = torch.nn.Parameter(torch.from_numpy(x.copy()))
    parameter.grad = torch.from_numpy(g.copy())
    fused = torch.optim.AdamW([parameter], lr=1e-3, fused=True)
    rows, grads = rng.standard_normal((2, 4, SIZE), dtype=np.float32)
    options = dict(topology=decentral.complete(), lr=1e-3, max_norm=1.0)
    workers = decentral.DecentralizedAdamW(rows.copy(), **options)
    torch_workers = decentral.DecentralizedAdamW(torch.from_numpy(rows.copy()), **options)
    torch_grads = torch.from_numpy(grads)
    lr = np.float32(0.1)
    return [
        (
            "elementwise",
            "sgd_update(x, g, 0.1, out=)",
            {
                "NumPy arrays": lambda: gradient_descent.sgd_update(x, g, 0.1, out=out),
                "torch tensors": lambda: gradient_descent.sgd_update(tx, tg, 0.1, out=tout),
                "torch.sub(alpha=, out=)": lambda: torch.sub(tx, tg, alpha=0.1, out=tout),
                "a bare @njit loop (the floor)": lambda: _bare_sgd(out, x, g, lr),
            },
        ),
        (
            "adamw",
            "fused step: optim.adamw",
            {
                "NumPy arrays": lambda: optim.adamw(x, g, m, v, step=1, lr=1e-3),
                "torch tensors": lambda: optim.adamw(tx, tg, tm, tv, step=1, lr=1e-3),
                "torch AdamW(fused=True).step()": fused.step,
            },
        ),
        (
            "decentralized",
            "decentralized step, 4 x 1,000",
            {"NumPy arrays": lambda: workers.step(grads), "torch tensors": lambda: torch_workers.step(torch_grads)},
        ),
    ]


def large_step(quick: bool) -> tuple[float, float]:
    """(optim.adamw, its seven-stream probe) in seconds on LARGE float32 elements."""
    param, grad, exp_avg, exp_avg_sq = (np.full(LARGE, value, np.float32) for value in (1.0, 1e-3, 0.0, 0.0))
    times = compare(
        {
            "adamw": lambda: optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, lr=1e-3),
            "probe": lambda: seven_stream_probe(param, grad, exp_avg, exp_avg_sq),
        },
        20 if quick else 200,
    )
    return times["adamw"], times["probe"]


def main(quick: bool = False) -> None:
    print(f"Python overhead per call, {SIZE:,} float32 elements, CPU: {machine()}, torch {torch.__version__}")
    rows, measured = [], {}
    with torch.no_grad():
        for key, label, functions in contenders():
            times = compare({name: per_call(function) for name, function in functions.items()}, 5 if quick else 20)
            for name, seconds in times.items():
                measured[key, name] = seconds / CALLS * 1e6
                rows.append([label, name, f"{measured[key, name]:.1f}"])
                label = ""
    print(table(rows, ["call", "arguments", "µs per call"]))
    scale = measured["elementwise", "torch.sub(alpha=, out=)"] / REFERENCE_TORCH_SUB
    print(f"\ntargets (issue 50), scaled by this machine's torch.sub: {scale:.2f}x the reference machine's")
    for (key, name), target in TARGETS.items():
        here = target * scale
        met = measured[key, name] <= here
        print(f"  {'met    ' if met else 'NOT met'}  {key}, {name}: {measured[key, name]:.1f} µs, target {here:.1f}")
    adamw, probe = large_step(quick)
    met = adamw <= LARGE_TARGET * probe
    print(
        f"  {'met    ' if met else 'NOT met'}  optim.adamw on {LARGE:,} elements: {adamw / probe:.2f}x its probe "
        f"({adamw * 1e6:.0f} µs against {probe * 1e6:.0f}), target {LARGE_TARGET}x"
    )


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
