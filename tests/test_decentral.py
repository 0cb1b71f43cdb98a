"""Decentralized AdamW against a plain NumPy reference written from SPEC §4 with dense W_t."""

from __future__ import annotations

import copy
import itertools
import json
import math
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadystep.decentral import checkpoint
from steadystep import decentral, dispatch, optim
from tests.conftest import SIMULATOR
from tests.helpers import to_device, to_host

WIDTH = 7 if SIMULATOR else 53
STEPS = 3 if SIMULATOR else 6
TOLERANCE = {np.float64: 1e-12, np.float32: 2e-5}


def random_stochastic(workers: int, seed: int = 0) -> np.ndarray:
    weights = np.random.default_rng(seed).random((workers, workers))
    return weights / weights.sum(axis=1, keepdims=True)


TOPOLOGIES = {
    "complete": decentral.complete,
    "one_peer_exponential": decentral.one_peer_exponential,
    "ring": decentral.ring,
    "matrix": None,  # a random row-stochastic user matrix, static
}


def topology(name: str, workers: int) -> decentral.Topology:
    factory = TOPOLOGIES[name]
    return factory() if factory else decentral.from_matrix(random_stochastic(workers))


def reference_step(x, g, m, v, t, weights, order, lr, betas, eps, weight_decay, max_norm, mask):
    """SPEC §4, literally: clip, moments, bias-corrected update, then AWC or ATC mixing."""
    beta1, beta2 = betas
    if max_norm is not None:
        norms = np.array([math.hypot(*row) for row in g.astype(np.float64)])  # exact, never overflows
        g = g * np.minimum(1.0, max_norm / (norms + 1e-6))[:, None].astype(g.dtype)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    update = (m / (1 - beta1 ** (t + 1))) / (np.sqrt(v / (1 - beta2 ** (t + 1))) + eps)
    decay = 1 - lr * weight_decay * (1.0 if mask is None else mask)
    if order == "awc":
        x = decay * (weights @ x) - lr * update
    else:
        x = weights @ (decay * x - lr * update)
    return x.astype(g.dtype), m, v


def close(ours, theirs, dtype, what):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    error = np.max(np.abs(ours - theirs)) / max(np.max(np.abs(theirs)), 1e-30)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.3g}"


CASES = list(itertools.product(TOPOLOGIES, ["awc", "atc"], [1, 2, 3, 5, 8], [np.float64, np.float32]))


def case_options(index: int) -> tuple[float | None, float, bool]:
    """(max_norm, consensus, masked) of case ``index``: bits of the index above the dtype's, so
    that each dtype and order meets every combination (test below)."""
    return (None, 0.5)[(index // 2) % 2], (1.0, 0.6)[(index // 4) % 2], bool((index // 8) % 2)


def test_the_reference_table_meets_every_option_in_each_dtype_and_order():
    met = {(case[1], case[3], case_options(index)) for index, case in enumerate(CASES) if case[2] > 1}
    assert len(met) == 2 * 2 * 8


@pytest.mark.parametrize("name, order, workers, dtype", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_matches_the_numpy_reference(name, order, workers, dtype, target):
    index = CASES.index((name, order, workers, dtype))
    max_norm, consensus, masked = case_options(index)
    rng = np.random.default_rng(index)
    mask = (rng.random(WIDTH) < 0.5).astype(dtype) if masked else None
    options = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    x = rng.normal(size=(workers, WIDTH)).astype(dtype)
    chosen = topology(name, workers)
    optimizer = decentral.DecentralizedAdamW(
        x.copy(),
        topology=chosen,
        order=order,
        max_norm=max_norm,
        decay_mask=mask,
        consensus=consensus,
        target=target,
        **options,
    )
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t in range(STEPS):
        g = rng.normal(size=x.shape).astype(dtype)
        optimizer.step(g)
        weights = consensus * chosen.matrix(workers, t) + (1 - consensus) * np.eye(workers)
        x, m, v = reference_step(x, g, m, v, t, weights.astype(dtype), order, max_norm=max_norm, mask=mask, **options)
    close(to_host(optimizer.params), x, dtype, "params")
    close(to_host(optimizer.exp_avg), m, dtype, "exp_avg")
    close(to_host(optimizer.exp_avg_sq), v, dtype, "exp_avg_sq")


@pytest.mark.parametrize(
    "name, order", [("one_peer_exponential", "awc"), ("ring", "atc"), ("complete", "atc"), ("matrix", "atc")]
)
def test_several_blocks_each_thread_with_its_own_scratch(name, order, target):
    """71 columns: on the simulator (32 threads a block) three blocks, the last one ragged;
    each thread keeps its column's N values in its own slots of the block's shared memory."""
    workers, width = 5, 71
    rng = np.random.default_rng(11)
    x = rng.normal(size=(workers, width))
    options = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    chosen = topology(name, workers)
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=chosen, order=order, max_norm=1.0, target=target, **options
    )
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t in range(2):
        g = rng.normal(size=x.shape)
        optimizer.step(g)
        x, m, v = reference_step(x, g, m, v, t, chosen.matrix(workers, t), order, max_norm=1.0, mask=None, **options)
    close(to_host(optimizer.params), x, np.float64, "params")
    close(to_host(optimizer.exp_avg_sq), v, np.float64, "exp_avg_sq")


def test_gpu_mixing_threads_fit_every_workers_scratch_in_shared_memory(target):
    from steadystep.cuda import threads

    assert threads.mixing_threads(8, 4) == threads.threads_for("mixing")  # 8 KiB of 48
    if target == "cpu":  # 256 threads a block (the simulator's blocks are 32)
        assert threads.mixing_threads(100, 8) == 32  # 61 fit: whole warps
        assert threads.mixing_threads(1000, 4) == 12  # fewer than a warp still works
    for workers, itemsize in ((8, 4), (100, 8), (1000, 4), (12288, 4)):
        assert workers * threads.mixing_threads(workers, itemsize) * itemsize <= threads.SHARED_BYTES
    with pytest.raises(ValueError, match="12289 workers of 4-byte values do not fit"):
        threads.mixing_threads(12289, 4)


@pytest.mark.skipif(SIMULATOR, reason="the CPU kernels' task layout; the simulator covers the same formulas")
@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("order", ["awc", "atc"])
def test_many_workers_and_wide_rows_cross_every_cpu_task_boundary(name, order):
    # A CPU task mixes MIX_SCRATCH // 19 = 1724 columns of all 19 workers, so 2·4096 + 5
    # columns make five tasks, the last one ragged. One-peer exponential at N = 19 reaches
    # peers 16 rows away.
    workers, width = 19, 2 * 4096 + 5
    rng = np.random.default_rng(7)
    x = rng.normal(size=(workers, width)).astype(np.float32)
    options = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    chosen = topology(name, workers)
    optimizer = decentral.DecentralizedAdamW(x.copy(), topology=chosen, order=order, max_norm=3.0, **options)
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t in range(5):
        g = rng.normal(size=x.shape).astype(np.float32)
        optimizer.step(g)
        x, m, v = reference_step(
            x, g, m, v, t, chosen.matrix(workers, t).astype(np.float32), order, max_norm=3.0, mask=None, **options
        )
    close(optimizer.params, x, np.float32, "params")
    close(optimizer.exp_avg, m, np.float32, "exp_avg")
    close(optimizer.exp_avg_sq, v, np.float32, "exp_avg_sq")


@pytest.mark.parametrize(
    "name, order",
    [
        ("one_peer_exponential", "awc"),
        ("one_peer_exponential", "atc"),
        ("complete", "atc"),
        ("matrix", "awc"),
        ("matrix", "atc"),
    ],
)
def test_the_caller_buffers_are_trained_in_place_on_both_targets(name, order, target):
    def on_target(array):
        return array if target == "cpu" else to_device(array)

    x = on_target(np.ones((4, WIDTH)))
    optimizer = decentral.DecentralizedAdamW(x, topology=topology(name, 4), order=order, target=target)
    moments = optimizer.exp_avg, optimizer.exp_avg_sq
    for _ in range(2):
        optimizer.step(on_target(np.ones((4, WIDTH))))
    # each CPU task mixes from a scratch copy of its columns, each GPU thread from its column's
    # copy in shared memory: no second buffers, and views of params stay views of the workers
    assert optimizer.params is x and (optimizer.exp_avg, optimizer.exp_avg_sq) == moments
    assert not np.all(to_host(x) == 1)


def _gradient_values(dtype, huge: bool):
    info = np.finfo(dtype)
    special = [0.0, -0.0, float(info.smallest_subnormal), -float(info.smallest_subnormal), float(info.tiny)]
    if huge:  # only under clipping: unclipped, their squares overflow the moments, as in torch
        special += [1e30, -3e30] if dtype == np.float32 else [1e300, -3e300]
    return st.one_of(st.floats(-4.0, 4.0, width=32), st.sampled_from(special))


@settings(
    max_examples=15 if SIMULATOR else 60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_shapes_topologies_and_extreme_gradients_match_the_reference(data, target):
    workers = data.draw(st.integers(1, 9), label="workers")
    width = data.draw(st.integers(0, 6 if SIMULATOR else 40), label="width")  # 0: empty rows
    name = data.draw(st.sampled_from(sorted(TOPOLOGIES)), label="topology")
    order = data.draw(st.sampled_from(["awc", "atc"]), label="order")
    dtype = data.draw(st.sampled_from([np.float32, np.float64]), label="dtype")
    max_norm = data.draw(st.sampled_from([None, 0.5]), label="max_norm")
    consensus = data.draw(st.sampled_from([1.0, 0.4]), label="consensus")
    size = workers * width

    def array(elements):
        return np.array(data.draw(st.lists(elements, min_size=size, max_size=size)), dtype).reshape(workers, width)

    options = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    x = array(st.floats(-4.0, 4.0, width=32))
    chosen = topology(name, workers)
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=chosen, order=order, max_norm=max_norm, consensus=consensus, target=target, **options
    )
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t in range(2):
        g = array(_gradient_values(dtype, huge=max_norm is not None))
        optimizer.step(g)
        weights = consensus * chosen.matrix(workers, t) + (1 - consensus) * np.eye(workers)
        x, m, v = reference_step(x, g, m, v, t, weights.astype(dtype), order, max_norm=max_norm, mask=None, **options)
    assert to_host(optimizer.params).shape == (workers, width) and optimizer.t == 2
    if size:
        close(to_host(optimizer.params), x, dtype, "params")
        close(to_host(optimizer.exp_avg), m, dtype, "exp_avg")
        close(to_host(optimizer.exp_avg_sq), v, dtype, "exp_avg_sq")


def test_gradient_norms_are_the_rows_norms_and_refuse_what_step_refuses(target):
    rng = np.random.default_rng(4)
    g = rng.normal(size=(3, WIDTH))
    optimizer = decentral.DecentralizedAdamW(np.zeros((3, WIDTH)), topology=decentral.ring(), target=target)
    np.testing.assert_allclose(optimizer.gradient_norms(g), [math.hypot(*row) for row in g], rtol=1e-14)
    g[1, 2] = np.nan
    with pytest.raises(decentral.NonFiniteGradientError, match=r"worker\(s\) \[1\]"):
        optimizer.gradient_norms(g)
    with pytest.raises(ValueError, match="grads must be float64 of shape"):
        optimizer.gradient_norms(g[:, 1:])
    assert optimizer.t == 0 and not np.any(to_host(optimizer.params))


def test_a_finite_gradient_whose_squared_norm_overflows_is_clipped_not_refused(target):
    # |g|² overflows float32 (and 1e300² float64) though g is finite: the norm is recomputed
    # with a scale, so clipping uses the true norm rather than raising a non-finite error.
    for dtype, big in ((np.float32, 1e30), (np.float64, 1e300)):
        g = np.array([[big, -2 * big, 3.0], [1.0, 2.0, 2.0]], dtype)
        optimizer = decentral.DecentralizedAdamW(
            np.zeros((2, 3), dtype), topology=decentral.ring(), lr=0.1, max_norm=1.0, target=target
        )
        optimizer.step(g)
        clipped = g.astype(np.float64) / (np.array([[math.hypot(big, 2 * big, 3.0)], [3.0]]) + 1e-6)
        close(to_host(optimizer.exp_avg), 0.1 * clipped, dtype, f"exp_avg {dtype.__name__}")


def test_one_worker_is_plain_adamw_bit_for_bit(target):
    rng = np.random.default_rng(1)
    start = rng.normal(size=(1, WIDTH))
    workers = decentral.DecentralizedAdamW(
        start.copy(), topology=decentral.one_peer_exponential(), lr=0.01, weight_decay=0.1, target=target
    )
    param, m, v = start[0].copy(), np.zeros(WIDTH), np.zeros(WIDTH)
    for t in range(STEPS):
        g = rng.normal(size=(1, WIDTH))
        workers.step(g)
        optim.adamw(param, g[0].copy(), m, v, step=t + 1, lr=0.01, weight_decay=0.1, target=target)
    assert to_host(workers.params)[0].tobytes() == param.tobytes()
    assert to_host(workers.exp_avg_sq)[0].tobytes() == v.tobytes()


def test_batched_workers_equal_independent_adamw_runs_composed_with_mixing(target):
    """AWC with one-peer mixing: mix on the host, then N separate optim.adamw steps."""
    rng = np.random.default_rng(2)
    count = 4
    x = rng.normal(size=(count, WIDTH))
    chosen = decentral.ring()
    batched = decentral.DecentralizedAdamW(x.copy(), topology=chosen, lr=0.02, target=target)
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t in range(STEPS):
        g = rng.normal(size=x.shape)
        batched.step(g)
        peers = chosen.peers(count, t)
        x = 0.5 * x + 0.5 * x[peers]
        for worker in range(count):
            optim.adamw(x[worker], g[worker].copy(), m[worker], v[worker], step=t + 1, lr=0.02, weight_decay=0.0)
    assert to_host(batched.params).tobytes() == x.tobytes()
    assert to_host(batched.exp_avg).tobytes() == m.tobytes()  # moments are never mixed


def test_functional_step_equals_the_optimizer_object():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(3, WIDTH))
    options = dict(topology=decentral.ring(), order="atc", lr=0.02, max_norm=0.5)
    held = decentral.DecentralizedAdamW(x.copy(), **options)
    params, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    for t in range(STEPS):
        g = rng.normal(size=x.shape)
        held.step(g)
        decentral.step(params, g, m, v, t=t, **options)
    assert params.tobytes() == held.params.tobytes() and v.tobytes() == held.exp_avg_sq.tobytes()
    before = [params.copy(), m.copy()]
    with pytest.raises(ValueError, match="exp_avg_sq must be float64 of shape"):
        decentral.step(params, g, m, v[:, :-1], t=STEPS, **options)
    with pytest.raises(ValueError, match="exp_avg is read-only"):
        decentral.step(params, g, np.broadcast_to(m[0], m.shape), v, t=STEPS, **options)
    # None used to step with moments of its own, then fail to hand them back, params already written
    with pytest.raises(TypeError, match="exp_avg must be the \\[N, D\\] moments this step updates in place"):
        decentral.step(params, g, None, v, t=STEPS, **options)
    assert params.tobytes() == before[0].tobytes() and m.tobytes() == before[1].tobytes()


# -- topologies --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["complete", "one_peer_exponential", "ring"])
def test_every_matrix_is_row_stochastic_and_doubly_stochastic(name):
    for workers, t in itertools.product(range(1, 10), range(8)):
        weights = topology(name, workers).matrix(workers, t)
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=0, atol=1e-15)
        np.testing.assert_allclose(weights.sum(axis=0), 1.0, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "workers, offsets",
    [(8, [1, 2, 4, 1, 2, 4]), (5, [1, 2, 4, 1, 2, 4]), (19, [1, 2, 4, 8, 16, 1, 2]), (2, [1, 1, 1]), (3, [1, 2, 1])],
)
def test_one_peer_offsets_follow_powers_of_two(workers, offsets):
    """Worker i hears from i − 2^(t mod τ), τ = bit_length(N − 1): N = 5 cycles 1, 2, 4 (τ = 3)
    like N = 8; N = 19 through 16 (τ = 5)."""
    rule = decentral.one_peer_exponential()
    for t, offset in enumerate(offsets):
        assert rule.peers(workers, t).tolist() == [(i - offset) % workers for i in range(workers)], t
    assert rule.peers(1, 3).tolist() == [0]
    assert decentral.ring().peers(5, 0).tolist() == [4, 0, 1, 2, 3]
    assert decentral.ring().peers(5, 1).tolist() == [1, 2, 3, 4, 0]


@pytest.mark.skipif(SIMULATOR, reason="host matrices")
@pytest.mark.parametrize("peers", [1, 2, 3])
def test_base_graphs_average_exactly_for_every_n_with_at_most_k_peers(peers):
    """SPEC §8's check, for N from 2 to 33: every W_t doubly stochastic with at most k
    off-diagonal non-zeros a row, the period's product 11ᵀ/N within 1e-12, P ≤ 2⌊log_{k+1} N⌋ + 2;
    and the topology's W_t is the period's, repeated."""
    topology = decentral.base_graph(peers)
    for workers in range(2, 34):
        period = decentral.base_graph_period(workers, peers)
        product = np.eye(workers)
        for weights in period:
            assert (weights >= 0).all()
            np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=0, atol=1e-15)
            np.testing.assert_allclose(weights.sum(axis=0), 1.0, rtol=0, atol=1e-15)
            assert int(((weights != 0) & ~np.eye(workers, dtype=bool)).sum(axis=1).max()) <= peers, workers
            product = weights @ product
        assert np.max(np.abs(product - 1.0 / workers)) <= 1e-12, workers
        digits = len(np.base_repr(workers, peers + 1)) - 1  # ⌊log_{k+1} N⌋, exactly
        assert len(period) <= 2 * digits + 2, (workers, len(period))
        for t in range(2 * len(period)):
            np.testing.assert_array_equal(topology.matrix(workers, t), period[t % len(period)])
    assert decentral.base_graph_period(8, 1)[0].shape == (8, 8) and len(decentral.base_graph_period(8, 1)) == 3
    assert topology.name == f"base_{peers + 1}_graph"


@pytest.mark.parametrize("workers, peers", [(6, 1), (7, 2), (12, 1)])
def test_one_period_of_a_base_graph_averages_the_workers_exactly(workers, peers, target):
    """Where one-peer exponential cannot (N = 6, above), P steps of the Base-(k+1) graph leave
    every worker at the mean, through the step's own dense mixing."""
    x = np.random.default_rng(4).normal(size=(workers, WIDTH))
    mixer = decentral.DecentralizedAdamW(x.copy(), topology=decentral.base_graph(peers), lr=0.0, target=target)
    for _ in range(len(decentral.base_graph_period(workers, peers))):
        mixer.step(np.zeros_like(x))
    np.testing.assert_allclose(to_host(mixer.params), np.broadcast_to(x.mean(axis=0), x.shape), rtol=0, atol=1e-14)


def test_a_base_graph_needs_at_least_one_peer():
    with pytest.raises(ValueError, match="peers"):
        decentral.base_graph(0)
    with pytest.raises(ValueError, match="workers"):
        decentral.base_graph_period(0, 1)


@pytest.mark.parametrize("workers, exact", [(8, True), (4, True), (6, False)])
def test_tau_one_peer_steps_average_exactly_for_powers_of_two(workers, exact, target):
    x = np.random.default_rng(3).normal(size=(workers, WIDTH))
    mixer = decentral.DecentralizedAdamW(x.copy(), topology=decentral.one_peer_exponential(), lr=0.0, target=target)
    for _ in range((workers - 1).bit_length()):
        mixer.step(np.zeros_like(x))
    spread = np.max(np.abs(to_host(mixer.params) - x.mean(axis=0)))
    assert (spread < 1e-14) == exact, spread


@pytest.mark.parametrize("name", ["complete", "one_peer_exponential", "ring"])
def test_doubly_stochastic_mixing_preserves_the_mean(name, target):
    x = np.random.default_rng(4).normal(size=(5, WIDTH))
    mixer = decentral.DecentralizedAdamW(x.copy(), topology=topology(name, 5), lr=0.0, target=target)
    for _ in range(STEPS):
        mixer.step(np.zeros_like(x))
    np.testing.assert_allclose(decentral.mean_model(mixer.params), x.mean(axis=0), rtol=0, atol=1e-14)
    assert decentral.consensus_distance(mixer.params) < decentral.consensus_distance(x)


def test_a_notebook_shows_what_an_optimizer_and_a_topology_are():
    workers = decentral.DecentralizedAdamW(
        np.zeros((8, 1000), np.float32), topology=decentral.ring(), lr=0.01, max_norm=1.0, decay_mask=np.ones(1000)
    )
    workers.step(np.ones((8, 1000), np.float32))
    assert repr(workers) == (
        "DecentralizedAdamW(8 workers × 1,000 float32 on cpu, topology=ring, t=1, order='awc', "
        "lr=0.01, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0, max_norm=1.0, consensus=1.0, decay_mask)"
    )
    assert repr(decentral.one_peer_exponential()) == "Topology(name='one_peer_exponential', kind='peer', static=True)"


def test_user_matrices_are_checked():
    with pytest.raises(ValueError, match="rows \\[1\\] sum to"):
        decentral.from_matrix(np.array([[0.5, 0.5], [0.2, 0.2]])).matrix(2, 0)
    with pytest.raises(ValueError, match="shape"):
        decentral.from_matrix(np.eye(3)).matrix(2, 0)
    changing = decentral.from_matrix(lambda t: np.eye(2) if t % 2 else np.full((2, 2), 0.5))
    assert changing.matrix(2, 1).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    # a fixed matrix that cannot mix the optimizer's workers is refused when it is built
    with pytest.raises(ValueError, match="rows \\[0\\] sum to \\[1.1\\]"):
        decentral.DecentralizedAdamW(
            np.ones((2, 3)), topology=decentral.from_matrix(np.array([[0.5, 0.6], [0.5, 0.5]]))
        )
    with pytest.raises(ValueError, match="has shape \\(3, 3\\); the run has 2 worker\\(s\\), so it must be \\(2, 2\\)"):
        decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.from_matrix(np.eye(3)))


def test_a_float32_matrix_is_taken_to_its_precision_and_mixes_without_drift():
    """torch builds matrices in float32, where three thirds sum to 1 + 3e-8: that was refused
    (a 1e-12 tolerance). It is accepted, and its rows are scaled to sum to 1 in float64, so
    200 steps of pure mixing keep the mean of float64 workers (unscaled, it grew by 6e-6)."""
    third = np.full((3, 3), 1 / 3, np.float32)
    assert np.abs(third.astype(np.float64).sum(axis=1) - 1).max() > 1e-8
    weights = decentral.from_matrix(third).matrix(3, 0)
    np.testing.assert_array_equal(weights.sum(axis=1), 1.0)
    x = np.random.default_rng(11).normal(size=(3, WIDTH)) + 1.0
    mixer = decentral.DecentralizedAdamW(x.copy(), topology=decentral.from_matrix(third), lr=0.0)
    for _ in range(200):
        mixer.step(np.zeros_like(x))
    np.testing.assert_allclose(decentral.mean_model(mixer.params), x.mean(axis=0), rtol=1e-13)
    with pytest.raises(ValueError, match="sum to \\[1.000"):  # a real error in float32 is still refused
        decentral.from_matrix(np.full((3, 3), 0.3334, np.float32)).matrix(3, 0)


# -- evaluation helpers, schedules ----------------------------------------------------------------------


def test_consensus_helpers():
    x = np.array([[1.0, 2.0], [3.0, 6.0]])
    np.testing.assert_array_equal(decentral.mean_model(x), [2.0, 4.0])
    errors = decentral.consensus_errors(x)
    np.testing.assert_array_equal(errors.sum(axis=0), [0.0, 0.0])
    assert decentral.consensus_distance(x) == (1 + 4 + 1 + 4) / 2


def test_token_schedule_and_budget():
    assert decentral.budget_steps(1_000_000, workers=8, batch=4, context=128) == 4883
    lr = decentral.token_lr(
        10, workers=8, batch=4, context=128, warmup_tokens=20_480, total_tokens=409_600, base_lr=1.0
    )
    assert lr == steadystep_warmup(10 * 8 * 4 * 128, 20_480, 409_600)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: decentral.token_lr(
                -1, workers=8, batch=4, context=128, warmup_tokens=10, total_tokens=100, base_lr=1.0
            ),
            "step must be a whole number ≥ 0, got -1",
        ),  # was a negative learning rate
        (
            lambda: decentral.token_lr(
                2.5, workers=8, batch=4, context=128, warmup_tokens=10, total_tokens=100, base_lr=1.0
            ),
            "step must be a whole number ≥ 0, got 2.5",
        ),
        (
            lambda: decentral.token_lr(
                1, workers=0, batch=4, context=128, warmup_tokens=10, total_tokens=100, base_lr=1.0
            ),
            "workers must be a whole number ≥ 1, got 0",
        ),
        (
            lambda: decentral.budget_steps(1_000_000, workers=8, batch=0, context=128),
            "batch must be a whole number ≥ 1, got 0",
        ),  # was an OverflowError converting an infinite budget
        (lambda: decentral.budget_steps(-5, workers=8, batch=4, context=128), "num_params must be a whole number ≥ 0"),
    ],
)
def test_token_schedule_and_budget_refuse_counts_that_are_not_whole_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def steadystep_warmup(tokens, warmup, total):
    from steadystep.training_stability import warmup_cosine_lr

    return warmup_cosine_lr(float(tokens), float(warmup), float(total), 1.0, 0.0)


# -- failures and checkpoints -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_stops_with_nothing_written(bad, target):
    rng = np.random.default_rng(5)
    workers = decentral.DecentralizedAdamW(
        rng.normal(size=(4, WIDTH)), topology=decentral.complete(), lr=0.1, target=target
    )
    workers.step(rng.normal(size=(4, WIDTH)))
    before = [to_host(a).copy() for a in (workers.params, workers.exp_avg, workers.exp_avg_sq)]
    g = rng.normal(size=(4, WIDTH))
    g[1, 3] = bad
    g[3, 0] = bad
    with pytest.raises(decentral.NonFiniteGradientError, match="worker\\(s\\) \\[1, 3\\] at step 1") as caught:
        workers.step(g)
    assert caught.value.workers == [1, 3] and caught.value.step == 1 and workers.t == 1
    for now, then in zip((workers.params, workers.exp_avg, workers.exp_avg_sq), before):
        assert to_host(now).tobytes() == then.tobytes()


def _stepped(start, grads, options, library=np.asarray) -> decentral.DecentralizedAdamW:
    """An optimizer over a copy of ``start``, stepped once with each of ``grads`` (both given
    as ``library`` makes them)."""
    workers = decentral.DecentralizedAdamW(library(start.copy()), **options)
    for g in grads:
        workers.step(library(g))
    return workers


@pytest.mark.parametrize("mask_on", ["host", "target"])
def test_save_and_resume_continue_bit_for_bit(mask_on, tmp_path, target):
    rng = np.random.default_rng(6)
    start = rng.normal(size=(4, WIDTH))
    grads = [rng.normal(size=(4, WIDTH)) for _ in range(2 * STEPS)]
    mask = rng.integers(0, 2, WIDTH).astype(np.float64)
    options = dict(
        topology=decentral.one_peer_exponential(),
        order="atc",
        lr=0.03,
        weight_decay=0.5,
        max_norm=1.0,
        target=target,
        decay_mask=to_device(mask) if mask_on == "target" and target == "cuda" else mask,
    )
    straight, first = _stepped(start, grads, options), _stepped(start, grads[:STEPS], options)
    first.save(tmp_path / "state.npz", extra={"rng": "state-of-the-data-order"})
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "state.npz", target=target)
    assert resumed.t == STEPS and resumed.extra == {"rng": "state-of-the-data-order"}
    for g in grads[STEPS:]:
        resumed.step(g)
    assert to_host(resumed.params).tobytes() == to_host(straight.params).tobytes()
    assert to_host(resumed.exp_avg_sq).tobytes() == to_host(straight.exp_avg_sq).tobytes()
    unmasked = _stepped(start, grads, dict(options, decay_mask=None))  # the mask mattered
    assert to_host(unmasked.params).tobytes() != to_host(straight.params).tobytes()


def test_the_decay_mask_is_saved_as_an_array_and_older_checkpoints_still_load(tmp_path):
    """The mask once went into the JSON metadata: 20 MB of text and ~2 s per save and load at
    D = 4M. It is an array of the archive now; a checkpoint written the old way still loads."""
    rng = np.random.default_rng(9)
    width = 20_000
    mask = rng.integers(0, 2, width)
    workers = decentral.DecentralizedAdamW(
        rng.normal(size=(2, width)), topology=decentral.ring(), lr=0.1, weight_decay=0.5, decay_mask=mask
    )
    workers.step(rng.normal(size=(2, width)))
    workers.save(tmp_path / "state.npz")
    with np.load(tmp_path / "state.npz") as archive:
        assert archive["meta"].size < 1000
        np.testing.assert_array_equal(archive["decay_mask"], mask)
    host = {name: np.asarray(getattr(workers, name)) for name in ("params", "exp_avg", "exp_avg_sq")}
    meta = json.loads(bytes(np.load(tmp_path / "state.npz")["meta"]).decode())
    checkpoint.write(tmp_path / "old.npz", dict(meta, decay=mask.astype(float).tolist()), host)  # no decay_mask array
    grads = rng.normal(size=(2, width))
    resumed = [decentral.DecentralizedAdamW.load(tmp_path / path) for path in ("state.npz", "old.npz")]
    for run in (workers, *resumed):
        run.step(grads)
    for run in resumed:
        np.testing.assert_array_equal(run.decay, mask)
        assert run.params.tobytes() == workers.params.tobytes()


def test_gradients_may_be_any_host_array_like():
    """Nested lists (and torch CPU tensors, elsewhere) step as the NumPy array of their values."""
    start, grads = np.random.default_rng(10).normal(size=(2, 3, 5))
    runs = [decentral.DecentralizedAdamW(start.copy(), topology=decentral.ring(), lr=0.1) for _ in range(2)]
    runs[0].step(grads)
    runs[1].step(grads.tolist())
    assert runs[1].params.tobytes() == runs[0].params.tobytes()


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
@pytest.mark.parametrize("order", decentral.ORDERS)
def test_torch_tensors_train_in_place_with_the_bits_of_numpy_and_resume_as_torch(order, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    start = rng.normal(size=(4, WIDTH)).astype(np.float32)
    grads = [rng.normal(size=(4, WIDTH)).astype(np.float32) for _ in range(STEPS)]
    mask = rng.integers(0, 2, WIDTH).astype(np.float32)
    options = dict(topology=decentral.ring(), order=order, lr=0.03, weight_decay=0.01, max_norm=1.0, consensus=0.7)
    expected = _stepped(start, grads, dict(options, decay_mask=mask))
    params = torch.from_numpy(start.copy())
    workers = decentral.DecentralizedAdamW(params, decay_mask=torch.from_numpy(mask), **options)
    for g in grads:
        workers.step(torch.from_numpy(g))
    assert workers.params is params and isinstance(workers.exp_avg, torch.Tensor)
    for buffer in ("params", "exp_avg", "exp_avg_sq"):
        assert getattr(workers, buffer).numpy().tobytes() == getattr(expected, buffer).tobytes()
    workers.save(tmp_path / "state.npz")
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "state.npz", like=torch.zeros(1, dtype=torch.float64))
    assert resumed.params.dtype == torch.float32 and resumed.params.numpy().tobytes() == params.numpy().tobytes()


@pytest.mark.skipif(
    SIMULATOR,
    reason="Numba's device arrays (the simulator's too) cannot be pickled; on the GPU, "
    "save() and load() carry the state",
)
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_copy_of_the_optimizer_object_continues_bit_for_bit(name, how, library):
    """pickle (to another process, or a whole-object save) or copy.deepcopy (branching an
    experiment) mid-run: the copy continues as uninterrupted training, and so does the
    original, which the copy's steps leave alone (the kernels' views of torch buffers are
    remade for the copy, not copied beside them)."""
    make = np.asarray if library == "numpy" else pytest.importorskip("torch").from_numpy
    rng = np.random.default_rng(7)
    start = rng.normal(size=(4, WIDTH))
    grads = [rng.normal(size=(4, WIDTH)) for _ in range(2 * STEPS)]
    options = dict(
        topology=topology(name, 4),
        order="awc",
        lr=0.03,
        weight_decay=0.01,
        max_norm=1.0,
        decay_mask=rng.integers(0, 2, WIDTH),
    )
    straight, original = _stepped(start, grads, options), _stepped(start, grads[:STEPS], options, make)
    copied = pickle.loads(pickle.dumps(original)) if how == "pickle" else copy.deepcopy(original)
    for workers in (copied, original):
        for g in grads[STEPS:]:
            workers.step(make(g))
        assert workers.t == 2 * STEPS
        for buffer in ("params", "exp_avg", "exp_avg_sq"):
            assert to_host(getattr(workers, buffer)).tobytes() == to_host(getattr(straight, buffer)).tobytes()


def test_extra_takes_numpy_and_torch_numbers_and_arrays(tmp_path):
    """What a training loop has at hand (np.argmin's epoch, a loss tensor) is stored as JSON:
    it comes back as Python numbers and lists; an object JSON cannot hold is named before any write."""
    torch = pytest.importorskip("torch")
    workers = decentral.DecentralizedAdamW(np.ones((2, 5)), topology=decentral.ring(), lr=0.1)
    extra = {
        "epoch": np.int64(3),
        "loss": np.float32(0.5),
        "history": np.arange(3.0),
        "rng": {"seed": 7},
        "scale": torch.tensor(65536.0),
    }
    workers.save(tmp_path / "state.npz", extra=extra)
    expected = {"epoch": 3, "loss": 0.5, "history": [0.0, 1.0, 2.0], "rng": {"seed": 7}, "scale": 65536.0}
    assert decentral.DecentralizedAdamW.load(tmp_path / "state.npz").extra == expected
    with pytest.raises(TypeError, match="extra holds function .* which a checkpoint cannot store"):
        workers.save(tmp_path / "other.npz", extra={"schedule": lambda t: t})
    assert not list(tmp_path.glob("other.npz*"))


def test_corrupted_or_mismatched_checkpoints_are_rejected(tmp_path):
    workers = decentral.DecentralizedAdamW(np.ones((2, 5)), topology=decentral.ring(), lr=0.1)
    workers.step(np.ones((2, 5)))
    path = tmp_path / "state.npz"
    workers.save(path)
    with pytest.raises(ValueError, match="saved with topology 'ring', not 'complete'"):
        decentral.DecentralizedAdamW.load(path, topology=decentral.complete())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted|not a readable"):
        decentral.DecentralizedAdamW.load(path)
    with pytest.raises(FileNotFoundError):  # what a "resume if there is a checkpoint" loop catches
        decentral.DecentralizedAdamW.load(tmp_path / "never-saved.npz")


def test_a_save_that_fails_leaves_no_half_written_file(tmp_path):
    """A path that is a directory (or a full disk, or an interrupt) failed after the archive
    was written beside it: a stray ``.partial`` file of the checkpoint's size was left."""
    workers = decentral.DecentralizedAdamW(np.ones((2, 5)), topology=decentral.ring(), lr=0.1)
    target = tmp_path / "checkpoints"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        workers.save(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoints"]


def test_a_topology_that_changes_with_t_must_be_passed_again_to_load(tmp_path):
    alternating = decentral.from_matrix(lambda t: np.eye(2) if t % 2 else np.full((2, 2), 0.5), "alternating")
    start, grads = np.arange(10.0).reshape(2, 5), [np.ones((2, 5)) * k for k in (1, 2, 3, 4)]
    straight = decentral.DecentralizedAdamW(start.copy(), topology=alternating, lr=0.1)
    for g in grads:
        straight.step(g)
    first = decentral.DecentralizedAdamW(start.copy(), topology=alternating, lr=0.1)
    for g in grads[:1]:
        first.step(g)
    first.save(tmp_path / "state.npz")
    with pytest.raises(ValueError, match="changes with t \\('alternating'\\); pass it as topology="):
        decentral.DecentralizedAdamW.load(tmp_path / "state.npz")
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "state.npz", topology=alternating)
    for g in grads[1:]:
        resumed.step(g)
    assert resumed.params.tobytes() == straight.params.tobytes()


@pytest.mark.slow  # starts processes of its own
@pytest.mark.skipif(SIMULATOR, reason="a CPU subprocess")
def test_resume_after_a_kill_in_the_middle(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time, numpy as np
        from steadystep import decentral
        rng = np.random.default_rng(7)
        start = rng.normal(size=(4, 9)); grads = [rng.normal(size=(4, 9)) for _ in range(8)]
        workers = decentral.DecentralizedAdamW(start, topology=decentral.ring(), lr=0.05)
        for g in grads:
            workers.step(g)
            workers.save(r"{tmp_path / "run.npz"}")
            print(workers.t, flush=True)
            if workers.t == 3:
                time.sleep(60)  # killed here
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.strip() == "3":
            process.send_signal(signal.SIGKILL)
            break
    process.wait()
    rng = np.random.default_rng(7)
    start, grads = rng.normal(size=(4, 9)), [rng.normal(size=(4, 9)) for _ in range(8)]
    straight = decentral.DecentralizedAdamW(start, topology=decentral.ring(), lr=0.05)
    for g in grads:
        straight.step(g)
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "run.npz")
    assert resumed.t == 3
    for g in grads[3:]:
        resumed.step(g)
    assert resumed.params.tobytes() == straight.params.tobytes()


def test_bad_arguments():
    with pytest.raises(ValueError, match="order must be one of"):
        decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring(), order="mix")
    with pytest.raises(ValueError, match="\\[N, D\\]"):
        decentral.DecentralizedAdamW(np.ones(3), topology=decentral.ring())
    with pytest.raises(ValueError, match="params is read-only"):
        decentral.DecentralizedAdamW(np.broadcast_to(np.ones(3), (2, 3)), topology=decentral.ring())
    with pytest.raises(ValueError, match="params must be C-contiguous"):
        decentral.DecentralizedAdamW(np.ones((3, 2)).T, topology=decentral.ring())
    with pytest.raises(TypeError, match="topology must be a Topology, such as decentral.ring"):
        decentral.DecentralizedAdamW(np.ones((2, 3)), topology="ring")
    with pytest.raises(
        ValueError, match="decay_mask must have one value per column of params \\(3\\); got shape \\(2,\\)"
    ):
        decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring(), decay_mask=[1, 0])
    with pytest.raises(ValueError, match="decay_mask must hold only 0 and 1 .* it holds 0.5"):
        decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring(), decay_mask=[1, 0.5, 0])
    workers = decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring())
    with pytest.raises(ValueError, match="grads must be float64 of shape \\(2, 3\\)"):
        workers.step(np.ones((3, 3)))
    # buffers that share memory: the step would read what it had already overwritten
    params = np.ones((2, 3))
    with pytest.raises(ValueError, match="params and exp_avg share memory"):
        decentral.DecentralizedAdamW(params, topology=decentral.ring(), exp_avg=params)
    with pytest.raises(ValueError, match="exp_avg and grads share memory"):
        workers.step(workers.exp_avg[::-1])
    assert workers.t == 0 and workers.params.tobytes() == np.ones((2, 3)).tobytes()


@pytest.mark.parametrize(
    "call, message",
    [
        # '<=' not supported between float and str, and NumPy's ambiguous truth value, before
        (
            lambda: decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring(), consensus="0.5"),
            "consensus must be a number in \\[0, 1\\] .*, got '0.5'",
        ),
        (
            lambda: decentral.DecentralizedAdamW(
                np.ones((2, 3)), topology=decentral.ring(), consensus=np.array([0.5, 1.0])
            ),
            "consensus must be a number in \\[0, 1\\]",
        ),
        # an optimizer of no workers was built, and stepped doing nothing
        (
            lambda: decentral.DecentralizedAdamW(np.ones((0, 3)), topology=decentral.ring()),
            "params must be an \\[N, D\\] array of N ≥ 1 workers' rows, got shape \\(0, 3\\)",
        ),
        # a mixing matrix for t = −1 or 1.5 (the odd step's), or for no workers, before
        (lambda: decentral.ring().matrix(4, -1), "t must be a whole number ≥ 0, got -1"),
        (lambda: decentral.one_peer_exponential().peers(4, 1.5), "t must be a whole number ≥ 0, got 1.5"),
        (lambda: decentral.complete().matrix(0, 0), "workers must be a whole number ≥ 1, got 0"),
        # the mean of a vector's entries, and NaN with NumPy's warnings for no rows, before
        (lambda: decentral.mean_model(np.ones(3)), "params must be an \\[N, D\\] array .* got shape \\(3,\\)"),
        (lambda: decentral.consensus_distance(np.ones((0, 3))), "got shape \\(0, 3\\)"),
    ],
)
def test_bad_arguments_of_the_helpers_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("order", decentral.ORDERS)
def test_the_parameters_may_be_their_own_gradients(order, target):
    # Exactly the same elements (the gradient of ½‖x‖²): every read comes before its write.
    start = np.random.default_rng(4).normal(size=(4, 50))
    runs = [
        decentral.DecentralizedAdamW(
            start.copy(),
            topology=decentral.one_peer_exponential(),
            order=order,
            lr=0.1,
            weight_decay=0.1,
            target=target,
        )
        for _ in range(2)
    ]
    for _ in range(3):
        runs[0].step(runs[0].params)
        runs[1].step(dispatch.host_array(runs[1].params).copy())
    np.testing.assert_array_equal(to_host(runs[0].params), to_host(runs[1].params))


@pytest.mark.parametrize("workers", range(1, 17))
def test_identical_float64_workers_have_exactly_zero_consensus_error(workers):
    """The docstring's promise: a sum-then-divide mean of equal float64 values is not always
    that value (N = 3, 5, 6, 7 gave 1e-16), so consensus_errors takes x̄ as x₀ + mean(xᵢ − x₀)."""
    rng = np.random.default_rng(workers)
    for scale in (1e-300, 1e-8, 1.0, 1e8, 1e300):
        rows = np.tile(rng.normal(size=257) * scale, (workers, 1))
        assert not decentral.consensus_errors(rows).any()
        assert decentral.consensus_distance(rows) == 0.0


def test_consensus_errors_agree_with_an_exact_mean():
    """x₀ + mean(xᵢ − x₀) is as close to x̄ as the plain mean: against fractions, exactly summed."""
    from fractions import Fraction

    rows = np.random.default_rng(5).normal(size=(7, 40)) * np.logspace(-3, 3, 40)
    errors = decentral.consensus_errors(rows)
    for column in range(40):
        exact = sum(Fraction(value) for value in rows[:, column]) / 7
        for worker in range(7):
            truth = float(Fraction(rows[worker, column]) - exact)
            assert abs(errors[worker, column] - truth) <= 4 * np.spacing(np.abs(rows[:, column]).max())


def test_load_refuses_a_like_that_is_not_an_array(tmp_path):
    workers = decentral.DecentralizedAdamW(np.ones((2, 3)), topology=decentral.ring())
    workers.save(tmp_path / "run.npz")
    with pytest.raises(TypeError, match="like must be an array .*; got 'abc'"):  # ignored, before: NumPy buffers
        decentral.DecentralizedAdamW.load(tmp_path / "run.npz", like="abc")


def test_identical_float32_workers_have_exactly_zero_consensus_error():
    """A float32 mean of 8 equal values can be off by an ulp (3x rounds); consensus is exact."""
    rows = np.tile(np.random.default_rng(0).normal(size=1000).astype(np.float32), (8, 1))
    assert (rows - rows.mean(axis=0)).any()  # the float32 way does not give 0
    np.testing.assert_array_equal(decentral.consensus_errors(rows), 0.0)
    assert decentral.consensus_distance(rows) == 0.0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(lr=-1e-3), "lr must be a finite number ≥ 0"),
        (dict(lr=float("nan")), "lr must"),
        (dict(weight_decay=float("inf")), "weight_decay must be a finite number"),  # accepted: every parameter inf
        (dict(eps=-1e-8), "eps must"),
        (dict(weight_decay=-0.1), "weight_decay must"),
        (dict(max_norm=-1.0), "max_norm must"),
        (dict(betas=(0.9, 1.0)), "betas must"),
    ],
)
def test_bad_hyperparameters_are_named_before_anything_is_written(options, message):
    """A negative max_norm flipped every gradient, a negative eps sent parameters to -inf."""
    with pytest.raises(ValueError, match=message):
        decentral.DecentralizedAdamW(np.zeros((4, 8)), topology=decentral.ring(), **options)
    workers = decentral.DecentralizedAdamW(np.zeros((4, 8)), topology=decentral.ring())
    with pytest.raises(ValueError, match="lr must"):
        workers.step(np.ones((4, 8)), lr=-1.0)
    assert workers.t == 0 and not workers.params.any() and not workers.exp_avg.any()


@pytest.mark.parametrize("t", [-1, 1.5, True, "3"])
def test_the_functional_step_refuses_a_count_that_is_not_a_step(t):
    """t = -1 divided by zero in the bias correction; t = 1.5 stepped with a made-up correction."""
    buffers = [np.zeros((2, 3)) for _ in range(3)]
    with pytest.raises(ValueError, match="t must be a whole number ≥ 0"):
        decentral.step(buffers[0], np.ones((2, 3)), buffers[1], buffers[2], t=t, topology=decentral.ring())
    assert not any(buffer.any() for buffer in buffers)


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
def test_a_step_classifies_the_gradients_once_and_its_own_buffers_never_again(monkeypatch):
    """The entry point classifies ``grads`` once and passes the operand down (reduction,
    checks, kernel); the optimizer's own buffers were classified when it was made."""
    torch = pytest.importorskip("torch")
    from steadystep import _arrays, dispatch
    from steadystep.cpu import backend

    rng = np.random.default_rng(3)
    params = torch.from_numpy(rng.normal(size=(3, 40)))
    workers = decentral.DecentralizedAdamW(params, topology=decentral.ring(), lr=0.1, max_norm=1.0)
    grads = torch.from_numpy(rng.normal(size=(3, 40)))
    workers.step(grads)
    classified = []
    for module in (_arrays, dispatch, backend):  # each holds the name
        original = module.classify
        monkeypatch.setattr(
            module,
            "classify",
            lambda name, value, original=original: (classified.append(value), original(name, value))[1],
        )
    workers.step(grads)
    assert sum(value is grads for value in classified) == 1
    assert not any(value is params or value is workers.exp_avg for value in classified)


@pytest.mark.parametrize("topology", ["one_peer_exponential", "ring", "complete", "base_graph"])
def test_a_gpu_step_uploads_nothing_once_its_topologys_arrays_are_there(topology, target, monkeypatch):
    """A step's peers and weights (a schedule cycles through a few) are uploaded once per content
    and the clip factors rewritten in place: each upload allocates GPU memory and waits for the
    copy, host time at every step. Six steps after six, with clipping: no upload."""
    if target != "cuda":
        pytest.skip("uploads are the GPU's")
    from steadystep.cuda import backend

    chosen = decentral.base_graph(2) if topology == "base_graph" else decentral.TOPOLOGIES[topology]()
    rows = np.random.default_rng(9).standard_normal((8, WIDTH)).astype(np.float32)
    state = decentral.DecentralizedAdamW(to_device(rows), topology=chosen, max_norm=1.0, lr=1e-2)
    on_cpu = decentral.DecentralizedAdamW(rows.copy(), topology=chosen, max_norm=1.0, lr=1e-2)
    grads = to_device(np.full((8, WIDTH), 0.5, np.float32))
    for _ in range(6):
        state.step(grads)
    uploads = []
    upload = backend.cuda.to_device
    monkeypatch.setattr(backend.cuda, "to_device", lambda *a, **k: uploads.append(1) or upload(*a, **k))
    for _ in range(6):
        state.step(grads)
    assert uploads == []
    for _ in range(12):  # the kept arrays hold the topology's: the CPU's bits
        on_cpu.step(np.full((8, WIDTH), 0.5, np.float32))
    np.testing.assert_array_equal(to_host(state.params), on_cpu.params)
