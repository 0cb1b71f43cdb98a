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

from benchmarks.common import compare, machine, table
from steadystep import decentral, gradient_descent, optim

SIZE, CALLS = 1000, 200


def per_call(function: Callable[[], object]) -> Callable[[], None]:
    """``function`` run CALLS times: one timed sample is a batch, so the timer's own cost vanishes."""

    def batch() -> None:
        for _ in range(CALLS):
            function()

    return batch


def contenders() -> list[tuple[str, dict]]:
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
    return [
        (
            "elementwise: sgd_update(x, g, 0.1, out=)",
            {
                "NumPy arrays": lambda: gradient_descent.sgd_update(x, g, 0.1, out=out),
                "torch tensors": lambda: gradient_descent.sgd_update(tx, tg, 0.1, out=tout),
                "torch.sub(alpha=, out=)": lambda: torch.sub(tx, tg, alpha=0.1, out=tout),
            },
        ),
        (
            "fused step: optim.adamw",
            {
                "NumPy arrays": lambda: optim.adamw(x, g, m, v, step=1, lr=1e-3),
                "torch tensors": lambda: optim.adamw(tx, tg, tm, tv, step=1, lr=1e-3),
                "torch AdamW(fused=True).step()": fused.step,
            },
        ),
        (
            "decentralized step, 4 x 1,000",
            {"NumPy arrays": lambda: workers.step(grads), "torch tensors": lambda: torch_workers.step(torch_grads)},
        ),
    ]


def main(quick: bool = False) -> None:
    print(f"Python overhead per call, {SIZE:,} float32 elements, CPU: {machine()}, torch {torch.__version__}")
    rows = []
    with torch.no_grad():
        for label, functions in contenders():
            times = compare({name: per_call(function) for name, function in functions.items()}, 5 if quick else 20)
            for name, seconds in times.items():
                rows.append([label, name, f"{seconds / CALLS * 1e6:.1f}"])
                label = ""
    print(table(rows, ["call", "arguments", "µs per call"]))


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
