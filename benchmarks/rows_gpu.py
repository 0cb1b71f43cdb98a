"""Row functions on a CUDA GPU: steadystep (on torch CUDA tensors, zero-copy) against torch,
and a copy of the input as the memory floor. Run on a GPU machine: python -m benchmarks.rows_gpu
(ci/gpu_check.sh does). CUDA-event medians; "torch/ours" > 1 means steadystep wins.

Rows of at most 128 bytes run one per thread (``<name>_short_rows``), longer ones one per
thread block with a tree merge (``<name>_rows``): the shapes straddle that switch.
"""

from __future__ import annotations

import torch

from benchmarks.adamw_gpu import cuda_median_ms
from benchmarks.common import table
from steadystep import numerical_stability as ns

SHAPES = [(1_000_000, 10), (100_000, 32), (100_000, 33), (20_000, 50), (1000, 1000), (10, 100_000)]


def main() -> None:
    device = torch.device("cuda")
    print(f"row functions on {torch.cuda.get_device_name(device)}, torch {torch.__version__}; σ = 5 normal data")
    rows = []
    for dtype in (torch.float32, torch.float64):
        for shape in SHAPES:
            x = torch.randn(shape, device=device, dtype=dtype) * 5
            cases = {
                "softmax": (lambda: ns.softmax(x), lambda: torch.softmax(x, -1)),
                "log_softmax": (lambda: ns.log_softmax(x), lambda: torch.log_softmax(x, -1)),
                "logsumexp": (lambda: ns.logsumexp(x), lambda: torch.logsumexp(x, -1)),
                "kahan_sum": (lambda: ns.kahan_sum(x), lambda: x.sum(-1)),  # torch sums plainly
                "welford_mean_var": (lambda: ns.welford_mean_var(x), lambda: torch.var_mean(x, -1, correction=0)),
            }
            floor = cuda_median_ms(x.clone)
            for name, (ours, theirs) in cases.items():
                mine, peer = cuda_median_ms(ours), cuda_median_ms(theirs)
                rows.append(
                    [
                        str(dtype).removeprefix("torch."),
                        f"{name} {shape[0]:,} × {shape[1]:,}",
                        f"{mine * 1e3:.1f}",
                        f"{peer * 1e3:.1f}",
                        f"{floor * 1e3:.1f}",
                        f"{peer / mine:.2f}",
                        f"{mine / floor:.2f}",
                    ]
                )
    print(table(rows, ["dtype", "case", "ours µs", "torch µs", "copy µs", "torch/ours", "ours/copy"]))


if __name__ == "__main__":
    main()
