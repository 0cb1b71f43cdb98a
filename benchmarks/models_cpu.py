"""The reference models on the CPU: steadystep's two batched kernels against torch autograd on
the same batched MLP (bmm over the N workers), in one process. Run: python -m benchmarks.models_cpu

Cases: one training step's loss + gradient for N = 8 workers × B = 32 samples (the demo's
inner loop), and exact Hessian-vector products at one point over the full training set
(1437 digits) for K = 32 vectors at once (the diagnostics' inner loop). torch's HVP is double
backward, batched the same way.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import compare, machine, table
from steadystep import models

FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 32, 10, 1437


def torch_loss(model: models.Model, flat: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, batch: torch.Tensor):
    """Sum over workers of each worker's mean cross-entropy: its gradient is every worker's own."""
    tensors = [flat[:, offset : offset + int(np.prod(shape))].reshape(-1, *shape)
               for shape, offset in zip(model.layout.shapes, model.layout.offsets)]
    weights1, bias1, weights2, bias2 = tensors
    inputs = features[batch]  # [N, B, F]
    hidden = torch.tanh(torch.bmm(inputs, weights1) + bias1[:, None, :])
    logits = torch.bmm(hidden, weights2) + bias2[:, None, :]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[batch].reshape(-1),
                                             reduction="sum") / batch.shape[1]


def cases(dtype) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(0)
    model = models.mlp(FEATURES, HIDDEN, CLASSES)
    features = rng.standard_normal((SAMPLES, FEATURES)).astype(dtype)
    labels = rng.integers(0, CLASSES, SAMPLES)
    features_t, labels_t = torch.from_numpy(features), torch.from_numpy(labels)
    found = []

    params = model.init(8, seed=0, dtype=dtype)
    batch = rng.integers(0, SAMPLES, (8, 32))
    gradient = np.empty_like(params)
    params_t, batch_t = torch.from_numpy(params.copy()).requires_grad_(), torch.from_numpy(batch)

    def torch_gradient():
        params_t.grad = None
        torch_loss(model, params_t, features_t, labels_t, batch_t).backward()

    found.append(("loss + gradient, N=8 × B=32", {
        "steadystep": lambda: model.loss_and_grad(params, features, labels, batch, out=gradient),
        "torch": torch_gradient}))

    vectors = rng.standard_normal((32, model.dim)).astype(dtype)
    point = np.tile(params[0], (32, 1))
    everything = np.tile(np.arange(SAMPLES), (32, 1))
    point_t, vectors_t, everything_t = torch.from_numpy(point.copy()).requires_grad_(), torch.from_numpy(vectors), torch.from_numpy(everything)

    def torch_hvp():
        (grad,) = torch.autograd.grad(torch_loss(model, point_t, features_t, labels_t, everything_t), point_t, create_graph=True)
        torch.autograd.grad((grad * vectors_t).sum(), point_t)

    found.append(("H·v, K=32 vectors, full data", {
        "steadystep": lambda: model.hvp(point, vectors, features, labels, everything),
        "torch": torch_hvp}))
    return found


def main() -> None:
    print(f"reference MLP {FEATURES}-{HIDDEN}-{CLASSES} tanh, float32, CPU: {machine()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    rows = []
    for label, contenders in cases(np.float32):
        times = compare(contenders, 20, warmup=3)
        rows.append([label, f"{times['steadystep'] * 1e3:.2f}", f"{times['torch'] * 1e3:.2f}",
                     f"{times['torch'] / times['steadystep']:.2f}"])
    print(table(rows, ["case", "ours ms", "torch ms", "torch/ours"]))


if __name__ == "__main__":
    main()
