"""One decentralized AdamW step over [N=8, D=4M] on the CPU: steadystep against NumPy, torch and
a bandwidth probe. Run: python -m benchmarks.decentral_cpu [--quick].

torch's version is the natural one: clip each row, mix with a gather, then fused AdamW on the
[N, D] tensor. The probe reads X, X[peer], G, M, V and writes X', M', V' once, as flat arrays
with adds only: the floor (steadystep also reads G once more for the per-worker norms).
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from numba import njit, prange

from benchmarks.common import compare, machine, table
from steadystep import decentral

WORKERS = 8
LR, BETAS, EPS, MAX_NORM = 1e-3, (0.9, 0.999), 1e-8, 1.0


@njit(cache=True, parallel=True, error_model="numpy")
def flat_probe(x_out, m_out, v_out, x, x_peer, g, m, v):
    """The floor: read x, the peer's x, g, m, v and write x', m', v' once, flat, adds only."""
    for k in prange(x.shape[0]):
        gk = g[k]
        x_out[k] = x[k] + x_peer[k] + gk
        m_out[k] = m[k] + gk
        v_out[k] = v[k] + gk


def setup(width: int, dtype, topology, order: str):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((WORKERS, width)).astype(dtype)
    g = rng.standard_normal((WORKERS, width)).astype(dtype)
    ours = decentral.DecentralizedAdamW(
        x.copy(), topology=topology, order=order, lr=LR, betas=BETAS, eps=EPS, max_norm=MAX_NORM
    )

    def step_ours():
        ours.step(g)

    numpy_state = {"x": x.copy(), "m": np.zeros_like(x), "v": np.zeros_like(x), "t": 0}

    def step_numpy():
        state = numpy_state
        state["t"] += 1
        clipped = g * np.minimum(1, MAX_NORM / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-6)).astype(dtype)
        state["m"] = BETAS[0] * state["m"] + (1 - BETAS[0]) * clipped
        state["v"] = BETAS[1] * state["v"] + (1 - BETAS[1]) * clipped * clipped
        update = (state["m"] / (1 - BETAS[0] ** state["t"])) / (
            np.sqrt(state["v"] / (1 - BETAS[1] ** state["t"])) + EPS
        )
        peers = topology.peers(WORKERS, state["t"]) if topology.kind == "peer" else None
        mixed = (
            0.5 * (state["x"] + state["x"][peers])
            if peers is not None
            else np.broadcast_to(state["x"].mean(axis=0), x.shape)
        )
        state["x"] = mixed - LR * update

    tensor = torch.from_numpy(x.copy()).requires_grad_()
    tensor.grad = torch.from_numpy(g.copy())
    fused = torch.optim.AdamW([tensor], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=True)
    torch_step_count = [0]

    @torch.no_grad()
    def step_torch():
        torch_step_count[0] += 1
        norms = torch.linalg.vector_norm(tensor.grad, dim=1, keepdim=True)
        tensor.grad.mul_(torch.clamp(MAX_NORM / (norms + 1e-6), max=1.0))
        if topology.kind == "peer":
            peers = torch.from_numpy(topology.peers(WORKERS, torch_step_count[0]))
            tensor.copy_(0.5 * (tensor + tensor.index_select(0, peers)))
        else:
            tensor.copy_(tensor.mean(dim=0, keepdim=True).expand_as(tensor))
        fused.step()

    peers = decentral.ring().peers(WORKERS, 0)
    flat = [np.zeros(x.size, dtype) for _ in range(3)] + [
        x.ravel().copy(),
        x[peers].ravel().copy(),
        g.ravel().copy(),
        np.zeros(x.size, dtype),
        np.zeros(x.size, dtype),
    ]

    def probe():
        flat_probe(*flat)

    return {"steadystep": step_ours, "probe": probe, "torch": step_torch, "numpy": step_numpy}


def main(quick: bool = False) -> None:
    width = 1 << 18 if quick else 4 << 20
    print(f"decentralized AdamW step, N = {WORKERS}, D = {width:,}, CPU: {machine()}, torch {torch.__version__}")
    rows = []
    for label, dtype, topology, order in [
        ("one-peer AWC + clip", np.float32, decentral.one_peer_exponential(), "awc"),
        ("one-peer ATC + clip", np.float32, decentral.one_peer_exponential(), "atc"),
        ("complete AWC + clip", np.float32, decentral.complete(), "awc"),
        ("one-peer AWC + clip, float64", np.float64, decentral.one_peer_exponential(), "awc"),
    ]:
        contenders = setup(width, dtype, topology, order)
        numpy_step = contenders.pop("numpy")
        times = compare(contenders, 5 if quick else 10, warmup=2)
        times["numpy"] = compare({"numpy": numpy_step}, 5, warmup=1)["numpy"]
        mine = times["steadystep"]
        rows.append(
            [
                label,
                f"{mine * 1e3:.1f}",
                f"{times['probe'] * 1e3:.1f}",
                f"{mine / times['probe']:.2f}",
                f"{times['torch'] / mine:.2f}",
                f"{times['numpy'] / mine:.2f}",
            ]
        )
    print(table(rows, ["case", "ours ms", "probe ms", "ours/probe", "torch/ours", "numpy/ours"]))
    headline = rows[0]  # one-peer AWC + clip, float32
    print("\ntargets (issue 5, one-peer AWC + clip):")
    for label, met, measured in [
        ("≤ 1.2× the probe", float(headline[3]) <= 1.2, headline[3]),
        ("≥ 4× faster than torch", float(headline[4]) >= 4, headline[4]),
        ("≥ 8× faster than NumPy", float(headline[5]) >= 8, headline[5]),
    ]:
        print(f"  {'met    ' if met else 'NOT met'}  {label}: {measured}×")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
