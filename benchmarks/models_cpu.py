"""The reference models on the CPU: steadystep's two batched kernels against torch autograd on
the same batched MLP (bmm over the N workers), in one process. Run: python -m benchmarks.models_cpu

Cases: one training step's loss + gradient for N = 8 workers × B = 32 samples (the demo's
inner loop), and exact Hessian-vector products at one point over the full training set
(1437 digits) for K = 32 vectors at once (the diagnostics' inner loop). steadystep takes the
point as one row of params (forward and backward once, tangent work per vector); torch's
peers are double backward over the point repeated 32 times (bmm, as for the workers), and
double backward at the one point with the 32 vectors vmapped (``is_grads_batched``).
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import compare, machine, table
from steadystep import models

FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 32, 10, 1437


def torch_loss(
    model: models.Model, flat: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, batch: torch.Tensor
):
    """Sum over workers of each worker's mean cross-entropy: its gradient is every worker's own."""
    tensors = [
        flat[:, offset : offset + int(np.prod(shape))].reshape(-1, *shape)
        for shape, offset in zip(model.layout.shapes, model.layout.offsets)
    ]
    weights1, bias1, weights2, bias2 = tensors
    inputs = features[batch]  # [N, B, F]
    hidden = torch.tanh(torch.bmm(inputs, weights1) + bias1[:, None, :])
    logits = torch.bmm(hidden, weights2) + bias2[:, None, :]
    return (
        torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[batch].reshape(-1), reduction="sum"
        )
        / batch.shape[1]
    )


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

    found.append(
        (
            "loss + gradient, N=8 × B=32",
            {
                "steadystep": lambda: model.loss_and_grad(params, features, labels, batch, out=gradient),
                "torch": torch_gradient,
            },
        )
    )

    vectors = rng.standard_normal((32, model.dim)).astype(dtype)
    point = params[:1].copy()
    repeated_t = torch.from_numpy(np.repeat(point, 32, axis=0)).requires_grad_()
    point_t, vectors_t = torch.from_numpy(point.copy()).requires_grad_(), torch.from_numpy(vectors)
    everything_t = torch.from_numpy(np.tile(np.arange(SAMPLES), (32, 1)))

    def torch_repeated():
        (grad,) = torch.autograd.grad(
            torch_loss(model, repeated_t, features_t, labels_t, everything_t), repeated_t, create_graph=True
        )
        torch.autograd.grad((grad * vectors_t).sum(), repeated_t)

    def torch_vmapped():
        (grad,) = torch.autograd.grad(
            torch_loss(model, point_t, features_t, labels_t, everything_t[:1]), point_t, create_graph=True
        )
        torch.autograd.grad(grad, point_t, grad_outputs=vectors_t[:, None, :], is_grads_batched=True)

    found.append(
        (
            "H·v, K=32 vectors at one point, full data",
            {
                "steadystep": lambda: model.hvp(point, vectors, features, labels),
                "torch": torch_repeated,
                "torch vmapped": torch_vmapped,
            },
        )
    )
    return found


def main() -> None:
    print(
        f"reference MLP {FEATURES}-{HIDDEN}-{CLASSES} tanh, float32, CPU: {machine()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )
    rows = []
    for label, contenders in cases(np.float32):
        times = compare(contenders, 20, warmup=3)
        mine = times.pop("steadystep")
        for peer, seconds in times.items():
            rows.append([label, f"{mine * 1e3:.2f}", peer, f"{seconds * 1e3:.2f}", f"{seconds / mine:.2f}"])
    print(table(rows, ["case", "ours ms", "peer", "peer ms", "peer/ours"]))


if __name__ == "__main__":
    main()
