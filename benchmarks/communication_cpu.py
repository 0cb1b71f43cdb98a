"""The compressed decentralized step (CHOCO, SPEC §8) over [N=8, D=4M] float32 on the CPU, over
the directed ring:
steadystep against the same step in torch ops and a bandwidth probe, and against the plain
(uncompressed) step. Run: python -m benchmarks.communication_cpu [--quick].

CHOCO-ATC must finish every public copy before any worker mixes, so its floor is two passes: the
probe reads g, x, m, v, x̂ and writes x, m, v, x̂ (the local step and x̂ += Q(x' − x̂)), then reads
x, x̂ and the peer's x̂ and writes x (the gossip), flat, with adds only. torch's version clips the
rows, runs fused AdamW on the [N, D] tensor, quantizes x' − x̂ blockwise with torch.rand for the
stochastic rounding, and gossips with a gather.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from numba import njit, prange

from benchmarks.common import compare, machine, table
from steadystep import compress, decentral

WORKERS = 8
LR, BETAS, EPS, MAX_NORM, GAMMA = 1e-3, (0.9, 0.999), 1e-8, 1.0, 1.0


@njit(cache=True, parallel=True, error_model="numpy")
def local_probe(x, m, v, public, g):
    """Read g, x, m, v, x̂; write x, m, v, x̂."""
    for k in prange(x.shape[0]):
        gk = g[k]
        x[k] = x[k] + gk
        m[k] = m[k] + gk
        v[k] = v[k] + gk
        public[k] = public[k] + gk


@njit(cache=True, parallel=True, error_model="numpy")
def gossip_probe(x, public, public_peer):
    """Read x, x̂ and the peer's x̂; write x."""
    for k in prange(x.shape[0]):
        x[k] = x[k] + public_peer[k] - public[k]


def torch_choco_step(tensor, optimizer, public, peers, levels: float, block: int) -> None:
    """One CHOCO-ATC step with int8 stochastic rounding, in torch ops."""
    with torch.no_grad():
        norms = torch.linalg.vector_norm(tensor.grad, dim=1, keepdim=True)
        tensor.grad.mul_(torch.clamp(MAX_NORM / (norms + 1e-6), max=1.0))
        optimizer.step()
        difference = (tensor - public).view(WORKERS, -1, block)
        scale = difference.abs().amax(dim=2, keepdim=True)
        codes = torch.floor(difference / scale * levels + torch.rand_like(difference)).clamp_(-levels, levels)
        public.add_((scale * codes / levels).view(WORKERS, -1))
        tensor.add_(GAMMA * 0.5 * (public.index_select(0, peers) - public))


def setup(width: int, compressor):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((WORKERS, width)).astype(np.float32)
    g = rng.standard_normal((WORKERS, width)).astype(np.float32)
    topology = decentral.directed_ring()  # one reader a step: compressed gossip sends one payload
    options = dict(topology=topology, order="atc", lr=LR, betas=BETAS, eps=EPS, max_norm=MAX_NORM)
    ours = decentral.DecentralizedAdamW(x.copy(), compression=compressor, **options)
    plain = decentral.DecentralizedAdamW(x.copy(), **options)

    tensor = torch.from_numpy(x.copy()).requires_grad_()
    tensor.grad = torch.from_numpy(g.copy())
    fused = torch.optim.AdamW([tensor], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=True)
    public = tensor.detach().clone()
    peers = torch.from_numpy(topology.peers(WORKERS, 0))

    flat = [np.ascontiguousarray(array).ravel() for array in (x.copy(), np.zeros_like(x), np.zeros_like(x))]
    public_flat, public_peer, g_flat = x.ravel().copy(), x[peers.numpy()].ravel().copy(), g.ravel().copy()

    def probe():
        local_probe(*flat, public_flat, g_flat)
        gossip_probe(flat[0], public_flat, public_peer)

    contenders = {
        "steadystep": lambda: ours.step(g),
        "probe": probe,
        "plain": lambda: plain.step(g),
    }
    if compressor.kind == "quantize":
        contenders["torch"] = lambda: torch_choco_step(
            tensor, fused, public, peers, float(compressor.levels), compressor.block_size
        )
    return contenders, ours, plain


def main(quick: bool = False) -> None:
    width = 1 << 18 if quick else 4 << 20
    print(f"CHOCO-ATC step, N = {WORKERS}, D = {width:,} float32, CPU: {machine()}, torch {torch.__version__}")
    rows = []
    for compressor in (compress.int8(), compress.int4(), compress.top_k(0.01), compress.random_k(0.01)):
        contenders, ours, plain = setup(width, compressor)
        times = compare(contenders, 5 if quick else 10, warmup=2)
        sent = plain.bytes_sent.sum() / ours.bytes_sent.sum()  # over the same steps
        mine = times["steadystep"]
        rows.append(
            [
                compressor.name,
                f"{mine * 1e3:.1f}",
                f"{mine / times['probe']:.2f}",
                f"{times['torch'] / mine:.2f}" if "torch" in times else "",
                f"{mine / times['plain']:.2f}",
                f"{sent:.1f}",
            ]
        )
    print(table(rows, ["compressor", "ours ms", "ours/probe", "torch/ours", "ours/plain step", "bytes saved ×"]))


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
