"""One decentralized AdamW step over [N=8, D=4M] float32 on a CUDA GPU: steadystep (torch CUDA
tensors, zero-copy) against torch (row clip, gather mixing, fused AdamW). Run on a GPU machine:
python -m benchmarks.decentral_gpu (ci/gpu_check.sh does).

Then where a clipped step's time goes: the norms alone (two reduction launches and their
copy to the host, which checks them before anything is written), the step without clipping
(one launch), and a probe that moves the bytes of that launch and does nothing else (an H200
took 1.3 ms for the one-peer step, torch 0.9)."""

from __future__ import annotations

import torch

from numba import cuda

from benchmarks.adamw_gpu import cuda_median_ms, seven_stream_probe
from benchmarks.common import table
from steadystep import decentral

WORKERS, WIDTH = 8, 4 << 20


def main() -> None:
    device = torch.device("cuda")
    print(f"decentralized AdamW, N = {WORKERS}, D = {WIDTH:,}, {torch.cuda.get_device_name(device)}")
    rows = []
    for label, topology, order in [
        ("one-peer AWC + clip", decentral.one_peer_exponential(), "awc"),
        ("one-peer ATC + clip", decentral.one_peer_exponential(), "atc"),
        ("complete AWC + clip", decentral.complete(), "awc"),
    ]:
        params = torch.randn(WORKERS, WIDTH, device=device)
        grads = torch.randn(WORKERS, WIDTH, device=device)
        ours = decentral.DecentralizedAdamW(params.clone(), topology=topology, order=order, lr=1e-3, max_norm=1.0)
        tensor = params.clone().requires_grad_()
        tensor.grad = grads.clone()
        fused = torch.optim.AdamW([tensor], lr=1e-3, weight_decay=0.0, fused=True)
        count = [0]

        @torch.no_grad()
        def peer_step():
            count[0] += 1
            norms = torch.linalg.vector_norm(tensor.grad, dim=1, keepdim=True)
            tensor.grad.mul_(torch.clamp(1.0 / (norms + 1e-6), max=1.0))
            if topology.kind == "peer":
                peers = torch.as_tensor(topology.peers(WORKERS, count[0]), device=device)
                tensor.copy_(0.5 * (tensor + tensor.index_select(0, peers)))
            else:
                tensor.copy_(tensor.mean(dim=0, keepdim=True).expand_as(tensor))
            fused.step()

        mine, theirs = cuda_median_ms(lambda: ours.step(grads), 20), cuda_median_ms(peer_step, 20)
        rows.append([label, f"{mine:.3f}", f"{theirs:.3f}", f"{theirs / mine:.2f}"])
    print(table(rows, ["case", "ours ms", "torch ms", "torch/ours"]))
    print(table(breakdown(device), ["one-peer AWC, N = 8", "ms"]))


def breakdown(device: torch.device) -> list[list[str]]:
    params = torch.randn(WORKERS, WIDTH, device=device)
    grads = torch.randn(WORKERS, WIDTH, device=device)
    topology = decentral.one_peer_exponential()
    clipped = decentral.DecentralizedAdamW(params.clone(), topology=topology, lr=1e-3, max_norm=1.0)
    plain = decentral.DecentralizedAdamW(params.clone(), topology=topology, lr=1e-3)
    # x read twice (own and peer rows: a cache may serve the second), g, m, v read; x, m, v written
    flat = [torch.randn(WORKERS * WIDTH, device=device) for _ in range(4)]
    views = [cuda.as_cuda_array(tensor) for tensor in flat]
    blocks = min(65535, (WORKERS * WIDTH + 255) // 256)
    times = {
        "step, clipped": cuda_median_ms(lambda: clipped.step(grads), 20),
        "the norms alone (reductions, copy to the host)": cuda_median_ms(lambda: clipped.gradient_norms(grads), 20),
        "step, not clipped (one launch)": cuda_median_ms(lambda: plain.step(grads), 20),
        "probe: 4 streams read, 3 written": cuda_median_ms(lambda: seven_stream_probe[blocks, 256](*views), 20),
    }
    return [[name, f"{value:.3f}"] for name, value in times.items()]


if __name__ == "__main__":
    main()
