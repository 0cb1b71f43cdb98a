"""Curvature on the CPU, in one process. Run: python -m benchmarks.curvature_cpu

1. Lanczos with k = 20 steps on the demo's MLP (64-32-10 tanh, digits, D = 2410) at the mean
   model x̄ of 4 workers after 100 decentralized AdamW steps, H·v from the model's R-operator
   over the 1437 training digits: top_eigenpairs (block 1, 20 steps) against 20 separate H·v
   calls, i.e. what the method adds to its products (reorthogonalisation, Ritz pairs).
   Target: at most 2x. Then the top 20 eigenpairs to convergence (block 20, tolerance 1e-6),
   to show what converging them costs in products.
2. The torch H·v source (ModuleHessian: jvp of grad, vmapped over K vectors, one pass over
   the data) against a Python loop of torch.autograd.functional.hvp (double backward, one
   vector per call) on the same torch MLP and data, K = 20. Target: at least 3x.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import compare, machine, table
from steadystep import curvature, decentral, diagnostics, models
from steadystep.demo import load_digits
from steadystep.torch.curvature import ModuleHessian

K = 20


def mean_model(data, model) -> np.ndarray:
    workers = decentral.DecentralizedAdamW(
        model.init(4, seed=0, dtype=np.float64),
        topology=decentral.ring(),
        lr=5e-3,
        max_norm=1.0,
        decay_mask=model.decay_mask(np.float64),
    )
    rng = np.random.default_rng(0)
    for _ in range(100):
        batches = rng.integers(0, len(data.train_labels), (4, 32))
        _, grads = model.loss_and_grad(workers.params, data.train_features, data.train_labels, batches)
        workers.step(grads)
    return decentral.mean_model(workers.params)


def main() -> None:
    print(f"curvature, float64, CPU: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    data = load_digits(seed=0, dtype=np.float64)
    model = models.mlp(features=64, hidden=32, classes=10)
    point = mean_model(data, model)
    hvp = diagnostics.model_hvp(model, point, data.train_features, data.train_labels)
    support = model.parameter_indices
    vectors = np.zeros((K, model.dim))
    vectors[:, support] = np.random.default_rng(1).standard_normal((K, len(support)))
    found: dict = {}

    def steps():
        found["steps"] = curvature.top_eigenpairs(
            hvp, model.dim, k=1, block=1, max_steps=K, tolerance=0.0, support=support
        )

    def converged():
        found["pairs"] = curvature.top_eigenpairs(hvp, model.dim, k=K, support=support)

    def separate():
        for vector in vectors:
            hvp(vector[None])

    rows = []
    times = compare({"steps": steps, "converged": converged, "separate": separate}, 5, warmup=1)
    pairs = found["pairs"]
    for name, label in (
        ("steps", f"Lanczos, {K} steps ({found['steps'].calls} calls)"),
        ("converged", f"Lanczos top {K} ({pairs.calls} calls, {pairs.products} H·v)"),
    ):
        rows.append(
            [
                label,
                f"{times[name] * 1e3:.1f}",
                f"{K} separate H·v calls",
                f"{times['separate'] * 1e3:.1f}",
                f"{times[name] / times['separate']:.2f}",
            ]
        )

    network = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10)).double()
    features, labels = torch.from_numpy(data.train_features), torch.from_numpy(data.train_labels)
    source = ModuleHessian(network, torch.nn.CrossEntropyLoss(), [(features, labels)])
    tangents = np.random.default_rng(2).standard_normal((K, source.dim))
    parameters = tuple(p.detach() for p in network.parameters())
    shapes = [p.shape for p in parameters]

    names = [name for name, _ in network.named_parameters()]

    def loss(*tensors):
        logits = torch.func.functional_call(network, dict(zip(names, tensors)), (features,))
        return torch.nn.functional.cross_entropy(logits, labels)

    def split(vector):
        pieces, offset = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            pieces.append(torch.from_numpy(vector[offset : offset + size]).reshape(shape))
            offset += size
        return tuple(pieces)

    def looped():
        for tangent in tangents:
            torch.autograd.functional.hvp(loss, parameters, split(tangent))

    (_, theirs) = torch.autograd.functional.hvp(loss, parameters, split(tangents[0]))
    agreement = np.abs(source(tangents[:1])[0] - torch.cat([t.reshape(-1) for t in theirs]).numpy()).max()
    times = compare({"vmapped": lambda: source(tangents), "looped": looped}, 5, warmup=1)
    rows.append(
        [
            f"ModuleHessian, K={K} vectors",
            f"{times['vmapped'] * 1e3:.1f}",
            "loop of autograd.functional.hvp",
            f"{times['looped'] * 1e3:.1f}",
            f"{times['vmapped'] / times['looped']:.2f}",
        ]
    )
    print(table(rows, ["case", "ours ms", "peer", "peer ms", "ours/peer"]))
    print(f"Lanczos: converged {pairs.converged}, top eigenvalues {np.round(pairs.values[:3], 4).tolist()}")
    print(f"ModuleHessian against autograd.functional.hvp: largest difference {agreement:.1e}")


if __name__ == "__main__":
    main()
