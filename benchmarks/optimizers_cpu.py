"""Adam, SGD with momentum and Lion at 10M float32 parameters on the CPU, against torch's own.

Run: python -m benchmarks.optimizers_cpu. torch's fused CPU kernels where they exist (Adam,
SGD); Lion is not in torch, so its peer is a torch foreach implementation of the same rule.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import compare, machine, table
from steadystep import optim

SIZE = 10_000_000
REPEATS = 30


def buffers(seed: int = 0):
    rng = np.random.default_rng(seed)
    param = rng.standard_normal(SIZE, dtype=np.float32)
    return param, rng.standard_normal(SIZE, dtype=np.float32)


def ours(name: str):
    param, grad = buffers()
    state = [np.zeros_like(param) for _ in range(2)]
    count = [0]

    def step():
        count[0] += 1
        if name == "adam":
            optim.adam(param, grad, state[0], state[1], step=count[0])
        elif name == "sgd-momentum":
            optim.sgd(param, grad, state[0], step=count[0], lr=0.01, momentum=0.9)
        else:
            optim.lion(param, grad, state[0])

    return step


def theirs(name: str):
    param, grad = buffers()
    tensor = torch.from_numpy(param).requires_grad_()
    tensor.grad = torch.from_numpy(grad)
    if name == "adam":
        return torch.optim.Adam([tensor], fused=True).step
    if name == "sgd-momentum":
        return torch.optim.SGD([tensor], lr=0.01, momentum=0.9, fused=True).step
    exp_avg = torch.zeros_like(tensor)

    @torch.no_grad()
    def lion(lr=1e-4, beta1=0.9, beta2=0.99):
        update = torch.lerp(tensor.grad, exp_avg, beta1).sign_()
        tensor.add_(update, alpha=-lr)
        exp_avg.lerp_(tensor.grad, 1 - beta2)

    return lion


def main() -> None:
    print(f"float32 steps at {SIZE:,} parameters, CPU: {machine()}, torch {torch.__version__}")
    rows = []
    for name in ("adam", "sgd-momentum", "lion"):
        times = compare({"ours": ours(name), "torch": theirs(name)}, REPEATS)
        mine, peer = times["ours"], times["torch"]
        rows.append([name, f"{mine * 1e3:.2f}", f"{peer * 1e3:.2f}", f"{peer / mine:.2f}"])
    print(table(rows, ["optimizer", "ours ms", "torch ms", "torch/ours"]))


if __name__ == "__main__":
    main()
