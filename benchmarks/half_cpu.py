"""bfloat16 AdamW on the CPU: steadystep against torch's fused bfloat16 step and a bandwidth
probe over the half-width streams; the cost of stochastic rounding over round to nearest; the
float16 step against the same probe.

Run: python -m benchmarks.half_cpu [--quick]. Every number comes from this process; times are
medians taken round-robin, and "torch fused / ours" > 1 means steadystep is faster.
"""

from __future__ import annotations

import sys

import torch

from benchmarks.common import compare, machine, repeats_for, seven_stream_probe, table
from steadystep import optim

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 1e-2


def tensors(size: int, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """param, grad, exp_avg, exp_avg_sq in ``dtype`` (the moments already warmed up)."""
    generator = torch.Generator().manual_seed(0)
    param, grad = (torch.randn(size, generator=generator) for _ in range(2))
    return [tensor.to(dtype) for tensor in (param, grad, grad * 0.1, grad * grad * 0.01)]


def ours(size: int, stochastic: bool = False, dtype: torch.dtype = torch.bfloat16):
    param, grad, exp_avg, exp_avg_sq = tensors(size, dtype)
    count = [0]

    def step() -> None:
        count[0] += 1
        optim.adamw(
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            step=count[0],
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WEIGHT_DECAY,
            rounding_seed=optim.step_seed(0, count[0]) if stochastic else None,
        )

    return step


def torch_fused(size: int):
    param, grad, exp_avg, exp_avg_sq = tensors(size)
    param.requires_grad_()
    param.grad = grad
    optimizer = torch.optim.AdamW([param], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)
    return optimizer.step


def probe(size: int):
    """Seven half-width streams (read p, g, m, v; write p, m, v), no arithmetic: the floor."""
    buffers = [tensor.view(torch.int16).numpy() for tensor in tensors(size)]
    param, grad, exp_avg, exp_avg_sq = buffers
    return lambda: seven_stream_probe(param, grad, exp_avg, exp_avg_sq)


def main(quick: bool = False) -> None:
    print(f"bfloat16 AdamW step, CPU: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    sizes = [100_000, 1_000_000] if quick else [100_000, 1_000_000, 10_000_000, 40_000_000]
    rows, checks = [], []
    for size in sizes:
        times = compare(
            {
                "ours": ours(size),
                "stochastic": ours(size, stochastic=True),
                "float16": ours(size, dtype=torch.float16),
                "probe": probe(size),
                "torch fused": torch_fused(size),
            },
            repeats_for(size),
        )
        mine = times["ours"]
        rows.append(
            [
                f"{size:,}",
                f"{mine * 1e6:,.0f}",
                f"{times['probe'] * 1e6:,.0f}",
                f"{mine / times['probe']:.2f}",
                f"{times['torch fused'] * 1e6:,.0f}",
                f"{times['torch fused'] / mine:.2f}",
                f"{times['stochastic'] * 1e6:,.0f}",
                f"{times['stochastic'] / mine:.2f}",
                f"{times['float16'] * 1e6:,.0f}",
                f"{times['float16'] / times['probe']:.2f}",
            ]
        )
        if size >= 1_000_000:
            checks += [
                (f"≤ 1.1× probe at {size:,}", mine / times["probe"] <= 1.1, f"{mine / times['probe']:.2f}×"),
                (
                    f"at least level with torch fused at {size:,}",
                    times["torch fused"] / mine >= 1.0,
                    f"{times['torch fused'] / mine:.2f}×",
                ),
                (
                    f"stochastic rounding ≤ 1.15× round to nearest at {size:,}",
                    times["stochastic"] / mine <= 1.15,
                    f"{times['stochastic'] / mine:.2f}×",
                ),
            ]
        if size >= 10_000_000:
            checks.append(
                (
                    f"float16 ≤ 1.1× probe at {size:,}",
                    times["float16"] / times["probe"] <= 1.1,
                    f"{times['float16'] / times['probe']:.2f}×",
                )
            )
    print(
        table(
            rows,
            [
                "params",
                "ours µs",
                "probe µs",
                "ours/probe",
                "torch fused µs",
                "torch fused/ours",
                "stochastic µs",
                "stochastic/nearest",
                "float16 µs",
                "float16/probe",
            ],
        )
    )
    print("\ntargets (issues 34 and 50):")
    for target, met, measured in checks:
        print(f"  {'met    ' if met else 'NOT met'}  {target}: {measured}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
