"""Local steps with an outer optimizer (DiLoCo, SPEC §8) against a NumPy reference written here
from the spec, on the CPU and (in the simulator's process) the CUDA target."""

from __future__ import annotations

import numpy as np
import pytest

from steadystep import compress, decentral
from tests.conftest import SIMULATOR
from tests.helpers import to_host
from tests.test_compress import COMPRESSORS, adamw, reference_compress

WIDTH = 150 if SIMULATOR else 700
OPTIONS = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def reference_diloco(x, grads, topology, outer, compressor, seed):
    """Inner AdamW steps alone; after every H steps: e += y − x, q = Q(e), e −= q, Δ̄ = W_r q,
    b ← μb + Δ̄, y ← y − α(Δ̄ + μb), x ← y. The outer copies start at the workers' mean."""
    y = np.broadcast_to(x.mean(axis=0), x.shape).copy()
    b, e, m, v = (np.zeros_like(x) for _ in range(4))
    for t, g in enumerate(grads):
        local, m, v = adamw(g, m, v, t, **OPTIONS)
        x = local(x)
        if (t + 1) % outer.every == 0:
            round_index = (t + 1) // outer.every - 1
            e = e + (y - x)
            q = reference_compress(e, compressor or compress.identity(), seed, round_index)
            e = e - q
            mixed = topology.matrix(len(x), round_index) @ q
            b = outer.momentum * b + mixed
            y = y - outer.lr * (mixed + outer.momentum * b)
            x = y.copy()
    return x, y, b, e


TOPOLOGIES = {"complete": decentral.complete(), "ring": decentral.ring(), "base_2_graph": decentral.base_graph(1)}


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("compressor", [None, "int8", "top_k 10%"])
def test_the_outer_step_matches_the_numpy_reference(name, compressor, target):
    rng = np.random.default_rng(list(TOPOLOGIES).index(name))
    x = rng.standard_normal((5, WIDTH))
    grads = [rng.standard_normal(x.shape) for _ in range(7)]  # two rounds and a step of the third
    outer = decentral.DiLoCo(every=3, lr=0.7, momentum=0.9)
    chosen = None if compressor is None else COMPRESSORS[compressor]
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=TOPOLOGIES[name], outer=outer, compression=chosen, seed=4, target=target, **OPTIONS
    )
    for g in grads:
        optimizer.step(g)
    expected = reference_diloco(x, grads, TOPOLOGIES[name], outer, chosen, 4)
    for key, theirs in zip(("params", "outer", "momentum_buffer", "residual"), expected):
        np.testing.assert_allclose(to_host(optimizer.buffers[key]), theirs, rtol=1e-12, atol=1e-12, err_msg=key)


def test_one_step_rounds_of_lr_one_without_momentum_are_complete_atc(target):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, WIDTH))
    common = dict(topology=decentral.complete(), order="atc", target=target, **OPTIONS)
    outer = decentral.DecentralizedAdamW(x.copy(), outer=decentral.DiLoCo(every=1, lr=1.0, momentum=0.0), **common)
    plain = decentral.DecentralizedAdamW(x.copy(), **common)
    for _ in range(4):
        g = rng.standard_normal(x.shape)
        outer.step(g)
        plain.step(g)
    np.testing.assert_allclose(to_host(outer.params), to_host(plain.params), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(outer.bytes_sent, plain.bytes_sent)


def test_bytes_are_sent_only_in_outer_steps():
    workers, width = 6, 1000
    optimizer = decentral.DecentralizedAdamW(
        np.zeros((workers, width), np.float32),
        topology=decentral.ring(),
        outer=decentral.DiLoCo(every=4),
        compression=compress.int8(),
    )
    counts = []
    for _ in range(8):
        optimizer.step(np.ones((workers, width), np.float32))
        counts.append(optimizer.bytes_sent[0])
    payload = compress.int8().payload_bytes(width, 4)
    assert counts == [0, 0, 0, payload, payload, payload, payload, 2 * payload]


def test_save_and_resume_mid_round_continue_bit_for_bit(tmp_path, target):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, WIDTH))
    grads = [rng.standard_normal(x.shape) for _ in range(8)]
    options = dict(topology=decentral.ring(), outer=decentral.DiLoCo(every=3), compression=compress.int8(), seed=5)
    whole = decentral.DecentralizedAdamW(x.copy(), target=target, **options)
    first = decentral.DecentralizedAdamW(x.copy(), target=target, **options)
    for t, g in enumerate(grads):
        whole.step(g)
        if t < 4:
            first.step(g)
    first.save(tmp_path / "outer.npz")
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "outer.npz", target=target)
    assert resumed.outer == decentral.DiLoCo(every=3) and resumed.t == 4
    for g in grads[4:]:
        resumed.step(g)
    for name, buffer in whole.buffers.items():
        np.testing.assert_array_equal(to_host(resumed.buffers[name]), to_host(buffer), err_msg=name)
    np.testing.assert_array_equal(resumed.bytes_sent, whole.bytes_sent)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: decentral.DiLoCo(every=0), ValueError, "every must be a whole number ≥ 1"),
        (lambda: decentral.DiLoCo(every=2.5), ValueError, "every must be a whole number"),
        (lambda: decentral.DiLoCo(lr=0.0), ValueError, "lr must be a finite number > 0"),
        (lambda: decentral.DiLoCo(lr=float("inf")), ValueError, "lr must be a finite number > 0"),
        (lambda: decentral.DiLoCo(momentum=1.0), ValueError, r"momentum must be a finite number in \[0, 1\)"),
        (lambda: decentral.DiLoCo(momentum=-0.1), ValueError, "momentum must be"),
        (
            lambda: decentral.DecentralizedAdamW(np.zeros((2, 4)), topology=decentral.ring(), outer=50),
            TypeError,
            "outer must be a decentral.DiLoCo",
        ),
        (
            lambda: decentral.DecentralizedAdamW(
                np.zeros((2, 4)), topology=decentral.ring(), outer=decentral.DiLoCo(), consensus=0.5
            ),
            ValueError,
            "consensus and public are compressed gossip's",
        ),
    ],
)
def test_bad_outer_settings_are_refused_naming_the_argument(make, error, message):
    with pytest.raises(error, match=message):
        make()
