"""Decentralized AdamW: N workers as the rows of [N, D] buffers, local moments, parameter mixing.

Per step t (zero-based, shared by all workers), with each worker's gradient g_i:

1. any non-finite gradient stops training ([`NonFiniteGradientError`][steadystep.decentral.NonFiniteGradientError],
nothing written);
2. clipping: g̃_i = g_i·min(1, c/(‖g_i‖ + 1e−6)) when ``max_norm`` c is set (‖g_i‖ is the true
   norm even where its square overflows the dtype);
3. AdamW moments m_i, v_i (never mixed) and update u_i with bias corrections at t + 1;
4. mixing over the topology's W_t (with consensus strength γ: γW + (1 − γ)I):
   AWC  x_i ← (1 − ηλ)·Σ_j W_ij x_j − η u_i;   ATC  x_i ← Σ_j W_ij [(1 − ηλ) x_j − η u_j];
   or, with ``compression``, CHOCO's gossip of compressed differences through public copies.

Steps 2–4 are one kernel launch over [N, D] (after one row-norm reduction), on the CPU or
the GPU, in place, and no worker ever reads a half-updated neighbour: each CPU task mixes
from a scratch copy of its columns, each GPU thread from its column's copy in shared memory.

>>> import numpy as np
>>> from steadystep import decentral
>>> workers = decentral.DecentralizedAdamW(np.zeros((8, 100)), topology=decentral.one_peer_exponential(), lr=1e-2)
>>> workers.step(np.ones((8, 100)))
>>> round(float(workers.params[0, 0]), 6)
-0.01
"""

from __future__ import annotations

from steadystep.decentral.checkpoint import FORMAT, written_beside
from steadystep.decentral.communication import (
    DiLoCo,
    bytes_sent,
    check_communication,
    gossip_neighbours,
    mixing_neighbours,
    payloads_sent,
    readers,
)
from steadystep.decentral.consensus import consensus_distance, consensus_errors, mean_model
from steadystep.decentral.optimizer import DecentralizedAdamW, NonFiniteGradientError, step
from steadystep.decentral.schedules import AdaptiveConsensus, TokenSchedule, budget_steps, token_lr
from steadystep.decentral.topology import (
    ORDERS,
    TOPOLOGIES,
    Topology,
    base_graph,
    base_graph_period,
    check_is_topology,
    check_mixing,
    check_topology,
    complete,
    directed_ring,
    from_matrix,
    one_peer_exponential,
    ring,
)

__all__ = [
    "AdaptiveConsensus",
    "DecentralizedAdamW",
    "DiLoCo",
    "FORMAT",
    "NonFiniteGradientError",
    "ORDERS",
    "TOPOLOGIES",
    "TokenSchedule",
    "Topology",
    "base_graph",
    "base_graph_period",
    "budget_steps",
    "bytes_sent",
    "check_communication",
    "check_is_topology",
    "check_mixing",
    "check_topology",
    "complete",
    "directed_ring",
    "consensus_distance",
    "consensus_errors",
    "from_matrix",
    "gossip_neighbours",
    "mean_model",
    "mixing_neighbours",
    "one_peer_exponential",
    "payloads_sent",
    "readers",
    "ring",
    "step",
    "token_lr",
    "written_beside",
]
