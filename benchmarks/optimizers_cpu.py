"""Adam, AdamW with AMSGrad, SGD with momentum, RMSprop, Adagrad, Lion and gradient clipping on the CPU,
against torch's own.

Run: python -m benchmarks.optimizers_cpu. float32, 1M parameters (warm: the buffers stay in
cache between back-to-back steps) and 10M (round-robin: memory-bound). torch's fused CPU
kernels where they exist (Adam, AdamW, SGD, Adagrad); RMSprop runs torch's default
implementation, and Lion, which torch lacks, a foreach implementation of the same rule.
Clipping: ``optim.clip_grad_norm`` against ``torch.nn.utils.clip_grad_norm_`` (max_norm 1).
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import compare, machine, median_seconds, table
from steadystep import optim

CASES = ("adam", "adamw-amsgrad", "sgd-momentum", "rmsprop", "adagrad", "lion", "clip")


def buffers(size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    param = rng.standard_normal(size, dtype=np.float32)
    return param, rng.standard_normal(size, dtype=np.float32)


def ours(name: str, size: int):
    param, grad = buffers(size)
    state = [np.zeros_like(param) for _ in range(3)]
    count = [0]

    def step():
        count[0] += 1
        if name == "adam":
            optim.adam(param, grad, state[0], state[1], step=count[0])
        elif name == "adamw-amsgrad":
            optim.adamw(param, grad, *state, step=count[0], amsgrad=True)
        elif name == "sgd-momentum":
            optim.sgd(param, grad, state[0], step=count[0], lr=0.01, momentum=0.9)
        elif name == "rmsprop":
            optim.rmsprop(param, grad, state[0])
        elif name == "adagrad":
            optim.adagrad(param, grad, state[0], step=count[0])
        elif name == "clip":
            optim.clip_grad_norm(grad, 1.0)
        else:
            optim.lion(param, grad, state[0])

    return step


def theirs(name: str, size: int):
    param, grad = buffers(size)
    tensor = torch.from_numpy(param).requires_grad_()
    tensor.grad = torch.from_numpy(grad)
    if name == "adam":
        return torch.optim.Adam([tensor], fused=True).step
    if name == "adamw-amsgrad":
        return torch.optim.AdamW([tensor], amsgrad=True, fused=True).step
    if name == "sgd-momentum":
        return torch.optim.SGD([tensor], lr=0.01, momentum=0.9, fused=True).step
    if name == "rmsprop":
        return torch.optim.RMSprop([tensor]).step
    if name == "adagrad":
        return torch.optim.Adagrad([tensor], fused=True).step
    if name == "clip":
        return lambda: torch.nn.utils.clip_grad_norm_([tensor], 1.0)
    exp_avg = torch.zeros_like(tensor)

    @torch.no_grad()
    def lion(lr=1e-4, beta1=0.9, beta2=0.99):
        update = torch.lerp(tensor.grad, exp_avg, beta1).sign_()
        tensor.add_(update, alpha=-lr)
        exp_avg.lerp_(tensor.grad, 1 - beta2)

    return lion


def main() -> None:
    print(f"float32 optimizer steps, CPU: {machine()}, torch {torch.__version__}")
    rows = []
    for name in CASES:
        warm = {
            who: median_seconds(step, 200)
            for who, step in (("ours", ours(name, 1_000_000)), ("torch", theirs(name, 1_000_000)))
        }
        cold = compare({"ours": ours(name, 10_000_000), "torch": theirs(name, 10_000_000)}, 30)
        rows.append(
            [
                name,
                f"{warm['ours'] * 1e6:.0f}",
                f"{warm['torch'] * 1e6:.0f}",
                f"{warm['torch'] / warm['ours']:.2f}",
                f"{cold['ours'] * 1e3:.2f}",
                f"{cold['torch'] * 1e3:.2f}",
                f"{cold['torch'] / cold['ours']:.2f}",
            ]
        )
    print(
        table(
            rows,
            ["step", "1M ours µs", "1M torch µs", "1M torch/ours", "10M ours ms", "10M torch ms", "10M torch/ours"],
        )
    )


if __name__ == "__main__":
    main()
