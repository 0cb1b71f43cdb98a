"""The compressors and CHOCO compressed gossip (SPEC §8) against plain NumPy references written
here from the spec, on the CPU and (in the simulator's process) the CUDA target."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadystep import compress, decentral
from tests.conftest import SIMULATOR
from tests.helpers import to_device, to_host

WIDTH = 150 if SIMULATOR else 1000  # crosses block boundaries, with a short last block
STEPS = 2 if SIMULATOR else 5


# -- references ---------------------------------------------------------------------------------


def draws(index: np.ndarray, key: int) -> np.ndarray:
    """The counter-based draws in [0, 1) of SPEC §8's stochastic rounding: Knuth's multiplicative
    hash of the index folded to 32 bits xor the key, plus the key's upper half; its upper 24 bits."""
    words = []
    for i in np.asarray(index, np.int64).ravel().tolist():
        folded = (i ^ (i >> 32)) ^ key
        words.append((((folded & 0xFFFFFFFF) * 0x9E3779B1) + ((key >> 32) & 0xFFFFFFFF)) & 0xFFFFFFFF)
    return (np.array(words, np.int64) >> 8) * 2.0**-24


def step_key(seed: int, step: int) -> int:
    from steadystep import _arrays

    return _arrays.rounding_key(seed, step)


def reference_compress(rows: np.ndarray, compressor: compress.Compressor, seed: int, step: int) -> np.ndarray:
    """Q of each row, block by block, as §8 words it."""
    rows = np.atleast_2d(rows)
    dtype = rows.dtype.type
    key = step_key(seed, step)
    out = np.zeros_like(rows)
    workers, width = rows.shape
    size = compressor.block_size
    for worker, start in itertools.product(range(workers), range(0, width, size)):
        block = rows[worker, start : start + size]
        columns = np.arange(start, start + block.size)
        if compressor.kind == "identity":
            out[worker, columns] = block
        elif compressor.kind == "quantize":
            scale = np.max(np.abs(block))
            if scale == 0:
                continue
            levels = dtype(2 ** (compressor.bits - 1) - 1)
            codes = block / scale * levels
            if compressor.rounding == "nearest":
                codes = np.floor(codes + dtype(0.5))
            else:
                codes = np.floor(codes + draws(worker * width + columns, key).astype(dtype))
            codes = np.clip(codes, -levels, levels)
            out[worker, columns] = scale * codes / levels
        else:
            kept = math.ceil(compressor.fraction * block.size - 1e-12)
            if compressor.kind == "top_k":
                priority = np.abs(block)
            else:
                priority = draws(columns, key).astype(dtype)
            order = np.lexsort((columns, -priority))  # largest first, ties: the lower column
            chosen = columns[order[:kept]]
            factor = block.size / kept if compressor.unbiased else 1.0
            out[worker, chosen] = rows[worker, chosen] * dtype(factor)
    return out


def adamw(g, m, v, t, lr, betas, eps, weight_decay):
    """§4's local AdamW in the kernels' order of operations: the updated moments, and the
    update as a function of the parameters it starts from."""
    dtype = g.dtype.type
    beta1, beta2 = betas
    m = m + dtype(1 - beta1) * (g - m)
    v = v * dtype(beta2) + dtype(1 - beta2) * g * g
    step_size = dtype(lr / (1 - beta1 ** (t + 1)))
    denominator = np.sqrt(v) * dtype(1 / math.sqrt(1 - beta2 ** (t + 1))) + dtype(eps)
    decay = dtype(1 - lr * weight_decay)
    return (lambda x: x * decay + -step_size * m / denominator), m, v


def reference_choco(x, public, g, m, v, t, weights, order, lr, betas, eps, weight_decay, compressor, seed, consensus):
    """One CHOCO step (§8) in the rows' dtype: AdamW of §4 (in the kernels' order of operations,
    so that float32 agrees to the bit and a near-tie in top-k's selection falls the same way),
    the public copies, the gossip."""
    dtype = x.dtype.type
    local, m, v = adamw(g, m, v, t, lr, betas, eps, weight_decay)

    off = consensus * (weights - np.diag(np.diag(weights)))

    def gossip(public):
        return (off @ public.astype(np.float64) - off.sum(axis=1, keepdims=True) * public).astype(dtype)

    if order == "atc":
        x = local(x)
        public = public + reference_compress(x - public, compressor, seed, t)
        return x + gossip(public), public, m, v
    public = public + reference_compress(x - public, compressor, seed, t)
    return local(x + gossip(public)), public, m, v


# The simulator runs each (worker, block) pair's selection, b² comparisons, as Python: shorter
# blocks there keep the same code paths (whole and short last blocks) affordable.
SPARSE_BLOCK = 32 if SIMULATOR else 256
COMPRESSORS = {
    "identity": compress.identity(),
    "int8": compress.int8(),
    "int8 nearest": compress.int8(rounding="nearest"),
    "int4": compress.int4(),
    "int4 nearest": compress.int4("nearest"),
    "top_k 10%": compress.top_k(0.1, block_size=SPARSE_BLOCK),
    "top_k 1%": compress.top_k(0.01, block_size=SPARSE_BLOCK),
    "random_k 25%": compress.random_k(0.25, block_size=SPARSE_BLOCK),
    "random_k 25% unbiased": compress.random_k(0.25, unbiased=True, block_size=SPARSE_BLOCK),
    "int8 in blocks of 100": compress.int8(block_size=100),
}


# -- the compressors ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPRESSORS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_each_compressor_equals_the_reference_bit_for_bit(name, dtype, target):
    compressor = COMPRESSORS[name]
    rows = np.random.default_rng(3).standard_normal((3, WIDTH)).astype(dtype)
    rows[1, :40] = 0.0  # a block may start with zeros, and a whole block may be zero below
    rows[2, 256:512] = 0.0
    ours = compress.compress(rows, compressor, seed=7, step=11, target=target)
    np.testing.assert_array_equal(to_host(ours), reference_compress(rows, compressor, 7, 11))
    assert to_host(ours).dtype == dtype


@settings(max_examples=15 if SIMULATOR else 60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    name=st.sampled_from(sorted(COMPRESSORS)),
    width=st.integers(1, 40 if SIMULATOR else 600),
    step=st.integers(0, 2**40),
)
def test_any_row_with_ties_zeros_and_subnormals_equals_the_reference(data, name, width, step, target):
    compressor = COMPRESSORS[name]
    pool = st.sampled_from([0.0, -0.0, 1.0, -1.0, 5e-324, -2.5, 3.0, 1e300, 1e-300])
    values = st.floats(-1e6, 1e6, allow_nan=False) | pool
    row = np.array(data.draw(st.lists(values, min_size=width, max_size=width)), np.float64)
    ours = to_host(compress.compress(row, compressor, seed=1, step=step, target=target))
    np.testing.assert_array_equal(ours, reference_compress(row, compressor, 1, step)[0])


def test_stochastic_rounding_is_unbiased_and_nearest_is_within_half_a_level():
    rng = np.random.default_rng(0)
    row = rng.standard_normal(512)
    steps = np.array([compress.compress(row, compress.int4(), seed=2, step=s) for s in range(2000)])
    scale = np.abs(row[:256]).max()
    level = scale / 7
    assert np.max(np.abs(steps.mean(axis=0) - row)[:256]) < 5 * level / math.sqrt(2000)  # unbiased
    nearest = compress.compress(row, compress.int4("nearest"))
    assert np.max(np.abs(nearest - row)[:256]) <= level / 2 * (1 + 1e-12)
    assert not np.array_equal(steps[0], steps[1])  # each step draws anew, a rerun the same
    np.testing.assert_array_equal(steps[0], compress.compress(row, compress.int4(), seed=2, step=0))


def test_top_k_keeps_the_largest_magnitudes_and_random_k_the_same_positions_on_every_row():
    rows = np.random.default_rng(1).standard_normal((4, 512))
    kept = compress.compress(rows, compress.top_k(0.05))
    for row, ours in zip(rows, kept):
        for block in (slice(0, 256), slice(256, 512)):
            chosen = np.flatnonzero(ours[block])
            assert chosen.size == 13  # ⌈0.05·256⌉
            assert np.abs(row[block][chosen]).min() >= np.sort(np.abs(row[block]))[-13]
    positions = compress.compress(rows, compress.random_k(0.05), step=3) != 0
    assert (positions == positions[0]).all() and positions.sum() == 4 * 26
    unbiased = np.mean([compress.compress(rows[0], compress.random_k(0.25, True), step=s) for s in range(4000)], axis=0)
    assert np.max(np.abs(unbiased - rows[0])) < 0.25 * np.abs(rows[0]).max()


def test_payload_bytes_follow_the_spec():
    assert compress.identity().payload_bytes(1000, 4) == 4000
    assert compress.int8().payload_bytes(1000, 4) == 1000 + 4 * 4
    assert compress.int4().payload_bytes(1001, 2) == 501 + 4 * 4
    assert compress.int8().payload_bytes(1000, 8) == 1000 + 8 * 4  # float64 rows: float64 scales
    assert compress.top_k(0.01).payload_bytes(1000, 4) == (3 * 3 + 3) * 5  # ⌈2.56⌉ per whole block, ⌈2.32⌉ last
    assert compress.random_k(0.5).payload_bytes(512, 8) == 256 * 8
    assert compress.top_k(0.01).kept(0) == 0 and compress.int8().payload_bytes(0, 4) == 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: compress.top_k(0.0), "fraction must be"),
        (lambda: compress.top_k(1.5), "fraction must be"),
        (lambda: compress.random_k(float("nan")), "fraction must be"),
        (lambda: compress.random_k(0.5, unbiased="yes"), "unbiased must be True or False"),
        (lambda: compress.Compressor("quantize", bits=3), "bits must be 8 or 4"),
        (lambda: compress.int8(rounding="up"), "rounding must be"),
        (lambda: compress.int8(block_size=0), "block_size must be"),
        (lambda: compress.top_k(0.1, block_size=512), "at most 256 for top_k"),
        (lambda: compress.Compressor("sign"), "kind must be one of"),
        (lambda: compress.compress(np.zeros(4, np.int64), compress.int8()), "use float32 or float64"),
        (lambda: compress.compress(np.zeros((2, 2, 2)), compress.int8()), "a row"),
        (lambda: compress.compress(np.zeros(4), "int8"), "compression must be a steadystep.compress"),
        (lambda: compress.compress(np.zeros(4), compress.int8(), seed=-1), "seed must be"),
    ],
)
def test_bad_compressors_and_inputs_are_refused_naming_the_argument(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("name", COMPRESSORS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_payload_rebuilds_the_senders_public_copy_bit_for_bit(name, dtype, target):
    """encode() updates the sender's x̂ as worker 2 of the in-process step does (the reference),
    its payload has payload_bytes(), and decode() of it gives a receiver the same x̂, bit for bit."""
    compressor = COMPRESSORS[name]
    rng = np.random.default_rng(list(COMPRESSORS).index(name))
    values, public = rng.standard_normal((2, 3, WIDTH)).astype(dtype)
    public[2, :40] = values[2, :40]  # a block may start with zero differences
    place = (lambda row: row.copy()) if target == "cpu" else to_device  # noqa: E731
    mine, theirs = place(public[2]), place(public[2])
    payload = compress.encode(place(values[2]), mine, compressor, seed=5, step=9, worker=2)
    assert payload.dtype == np.uint8 and payload.size == compressor.payload_bytes(WIDTH, np.dtype(dtype).itemsize)
    expected = public[2] + reference_compress(values - public, compressor, 5, 9)[2]
    assert to_host(mine).tobytes() == expected.tobytes()
    compress.decode(theirs, payload, compressor, seed=5, step=9)
    assert to_host(theirs).tobytes() == expected.tobytes()


def test_payloads_hold_codes_and_scales_or_values_and_offsets():
    row = np.array([0.5, -1.0, 0.25, 0.0])

    def payload(compressor):
        return compress.encode(row, np.zeros(4), compressor)

    codes = np.array([64, -127, 32, 0], np.int8)  # round(v/s·127), s = 1
    assert payload(compress.int8("nearest")).tobytes() == codes.tobytes() + np.float64(1.0).tobytes()
    # int4: c + 8 for c = 4, −7, 2, 0; two a byte, the first in the low half
    assert payload(compress.int4("nearest")).tolist()[:2] == [12 | 1 << 4, 10 | 8 << 4]
    top = payload(compress.top_k(0.5, block_size=4))
    assert top.tobytes() == np.array([0.5, -1.0]).tobytes() + bytes([0, 1])
    assert payload(compress.identity()).tobytes() == row.tobytes()
    assert payload(compress.random_k(0.5, block_size=4)).size == 2 * 8


def test_bad_payloads_and_rows_are_refused_before_anything_is_written():
    public = np.ones(4)
    with pytest.raises(ValueError, match="payload must be the 12 bytes"):
        compress.decode(public, np.zeros(11, np.uint8), compress.int8())
    with pytest.raises(ValueError, match="payload must be"):
        compress.decode(public, np.zeros(12, np.float64), compress.int8())
    with pytest.raises(ValueError, match="values and public must be rows of one length and dtype"):
        compress.encode(np.ones(5), public, compress.int8())
    with pytest.raises(ValueError, match="values must be one row"):
        compress.encode(np.ones((1, 4)), np.ones((1, 4)), compress.int8())
    with pytest.raises(ValueError, match="worker must be"):
        compress.encode(np.ones(4), public, compress.int8(), worker=-1)
    assert (public == 1).all()


# -- CHOCO gossip in the decentralized step --------------------------------------------------------

TOPOLOGIES = {
    "ring": decentral.ring(),
    "one_peer_exponential": decentral.one_peer_exponential(),
    "complete": decentral.complete(),
    "base_2_graph": decentral.base_graph(1),
}
# the simulator takes the one-peer, complete and dense kinds (each topology on the CPU)
SIMULATED = ["ring", "complete", "base_2_graph"] if SIMULATOR else list(TOPOLOGIES)
CASES = list(
    itertools.product(
        SIMULATED,
        ["awc", "atc"],
        ["identity", "int8", "top_k 10%", "random_k 25% unbiased"],
    )
)


@pytest.mark.parametrize("name, order, compressor", CASES)
def test_the_choco_step_matches_the_numpy_reference(name, order, compressor, target):
    rng = np.random.default_rng(CASES.index((name, order, compressor)))
    workers, consensus = 6, 0.4
    options = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    x = rng.standard_normal((workers, WIDTH))
    topology = TOPOLOGIES[name]
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=topology, order=order, consensus=consensus, compression=COMPRESSORS[compressor],
        seed=5, target=target, **options,
    )  # fmt: skip
    public, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    for t in range(STEPS):
        g = rng.standard_normal(x.shape)
        optimizer.step(g)
        weights = topology.matrix(workers, t)
        x, public, m, v = reference_choco(
            x, public, g, m, v, t, weights, order, compressor=COMPRESSORS[compressor], seed=5, consensus=consensus,
            **options,
        )  # fmt: skip
    for ours, theirs in [(optimizer.params, x), (optimizer.public, public), (optimizer.exp_avg, m)]:
        np.testing.assert_allclose(to_host(ours), theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", ["awc", "atc"])
def test_float32_choco_is_within_a_few_ulp_of_the_reference(order, target):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, WIDTH)).astype(np.float32)
    options = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=decentral.ring(), order=order, consensus=0.5, compression=COMPRESSORS["top_k 10%"],
        target=target, **options,
    )  # fmt: skip
    public, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    for t in range(STEPS):
        g = rng.standard_normal(x.shape).astype(np.float32)
        optimizer.step(g)
        x, public, m, v = reference_choco(
            x, public, g, m, v, t, decentral.ring().matrix(4, t), order, compressor=COMPRESSORS["top_k 10%"], seed=0,
            consensus=0.5, **options,
        )  # fmt: skip
    np.testing.assert_allclose(to_host(optimizer.params), x, rtol=4e-6, atol=4e-6)


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("consensus", [1.0, 0.3])
def test_identity_compression_is_plain_gossip_within_rounding(name, order, consensus, target):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, WIDTH))
    options = dict(topology=TOPOLOGIES[name], order=order, consensus=consensus, lr=0.02, weight_decay=0.05)
    options["target"] = target
    plain = decentral.DecentralizedAdamW(x.copy(), **options)
    gossip = decentral.DecentralizedAdamW(x.copy(), compression=compress.identity(), **options)
    for _ in range(STEPS):
        g = rng.standard_normal(x.shape)
        plain.step(g)
        gossip.step(g)
    np.testing.assert_allclose(to_host(gossip.params), to_host(plain.params), rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", SIMULATED)
@pytest.mark.parametrize("compressor", ["int8", "int4 nearest", "top_k 1%", "random_k 25%"])
@pytest.mark.parametrize("order", ["awc", "atc"])
def test_compressed_mixing_preserves_the_sum_of_the_workers(name, compressor, order, target):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, WIDTH))
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=TOPOLOGIES[name], order=order, lr=0.0, compression=COMPRESSORS[compressor], target=target
    )
    for _ in range(STEPS):
        optimizer.step(rng.standard_normal(x.shape))
    np.testing.assert_allclose(to_host(optimizer.params).sum(axis=0), x.sum(axis=0), rtol=0, atol=1e-12)


def averaging_error(rows: np.ndarray, average: np.ndarray) -> float:
    """Σ_i ‖x_i − x̄(0)‖²: how far the workers are from the average they set out to reach."""
    return float(np.sum((rows - average) ** 2))


def naive_quantized_gossip(x: np.ndarray, compressor, steps: int) -> np.ndarray:
    """x_i ← Σ_j W_ij Q(x_j): gossip of the quantized rows themselves, without public copies."""
    ring = decentral.ring()
    for t in range(steps):
        x = ring.matrix(len(x), t) @ reference_compress(x, compressor, 0, t)
    return x


@pytest.mark.parametrize("compressor, consensus, steps", [("int8", 1.0, 300), ("top_k 10%", 0.25, 1200)])
def test_choco_drives_the_consensus_error_down_where_naive_quantized_gossip_stalls(compressor, consensus, steps):
    x = np.random.default_rng(2).standard_normal((8, 512))
    average = x.mean(axis=0)
    start = averaging_error(x, average)
    optimizer = decentral.DecentralizedAdamW(
        x.copy(), topology=decentral.ring(), lr=0.0, consensus=consensus, compression=COMPRESSORS[compressor]
    )
    zeros = np.zeros_like(x)
    for _ in range(steps):
        optimizer.step(zeros)
    assert averaging_error(optimizer.params, average) <= 1e-6 * start
    # the naive scheme agrees on some point, but each quantization moved it off the average for good
    naive = naive_quantized_gossip(x.copy(), COMPRESSORS[compressor], steps)
    assert averaging_error(naive, average) > 1e-5 * start


@pytest.mark.parametrize("name", ["ring", "complete", "base_2_graph"])
def test_bytes_sent_are_the_payloads_times_the_peers_each_worker_sends_to(name):
    """Dense rows go to the peers that read them at step t; compressed differences go to every
    worker that keeps a public copy, all those that read the row at some step (here: any of the
    first 12, longer than these periods)."""
    topology = TOPOLOGIES[name]
    workers, width = 6, 1000
    ever = sum(topology.matrix(workers, t) != 0 for t in range(12)) != 0
    holders = ever.sum(axis=0) - 1  # the worker itself reads its row
    for compressor in (None, compress.int8(), compress.top_k(0.01)):
        rows = np.zeros((workers, width), np.float32)
        optimizer = decentral.DecentralizedAdamW(rows, topology=topology, compression=compressor)
        expected = np.zeros(workers)
        for t in range(4):
            optimizer.step(np.ones((workers, width), np.float32))
            payload = 4 * width if compressor is None else compressor.payload_bytes(width, 4)
            if name == "complete":
                expected += payload * ((workers - 1) if compressor else 2 * (workers - 1) / workers)
            elif compressor is not None:
                expected += payload * holders
            else:
                matrix = topology.matrix(workers, t)
                expected += payload * ((matrix != 0).sum(axis=0) - (np.diag(matrix) != 0))
        np.testing.assert_allclose(optimizer.bytes_sent, expected)


@pytest.mark.parametrize("order", ["awc", "atc"])
def test_save_and_resume_carry_the_public_copies_and_continue_bit_for_bit(order, tmp_path, target):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, WIDTH))
    grads = [rng.standard_normal(x.shape) for _ in range(2 * STEPS)]
    options = dict(topology=decentral.ring(), order=order, compression=compress.int8(), seed=9, target=target)
    whole = decentral.DecentralizedAdamW(x.copy(), **options)
    for g in grads:
        whole.step(g)
    first = decentral.DecentralizedAdamW(x.copy(), **options)
    for g in grads[:STEPS]:
        first.step(g)
    first.save(tmp_path / "choco.npz")
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "choco.npz", target=target)
    assert resumed.compression == compress.int8() and resumed.seed == 9
    for g in grads[STEPS:]:
        resumed.step(g)
    np.testing.assert_array_equal(to_host(resumed.params), to_host(whole.params))
    np.testing.assert_array_equal(to_host(resumed.public), to_host(whole.public))
    np.testing.assert_array_equal(resumed.bytes_sent, whole.bytes_sent)


def test_compression_options_are_checked_before_anything_is_made():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError, match="compression must be a steadystep.compress"):
        decentral.DecentralizedAdamW(x, topology=decentral.ring(), compression="int8")
    with pytest.raises(ValueError, match="public copies are CHOCO's"):
        decentral.DecentralizedAdamW(x, topology=decentral.ring(), public=np.zeros_like(x))
    with pytest.raises(ValueError, match="seed must be"):
        decentral.DecentralizedAdamW(x, topology=decentral.ring(), compression=compress.int8(), seed=-2)
    with pytest.raises(ValueError, match="consensus"):
        decentral.DecentralizedAdamW(x, topology=decentral.ring(), compression=compress.int8(), consensus=0.0)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="compression and outer steps need float32 or float64"):
        decentral.DecentralizedAdamW(
            torch.zeros((2, 8), dtype=torch.bfloat16), topology=decentral.ring(), compression=compress.int8()
        )


def test_a_non_finite_gradient_stops_the_compressed_step_with_nothing_written(target):
    x = np.random.default_rng(0).standard_normal((3, WIDTH))
    options = dict(topology=decentral.ring(), compression=compress.int8(), target=target)
    optimizer = decentral.DecentralizedAdamW(x.copy(), **options)
    optimizer.step(np.ones_like(x))
    before = [to_host(a).copy() for a in (optimizer.params, optimizer.public, optimizer.exp_avg)]
    bad = np.ones_like(x)
    bad[1, 3] = np.nan
    with pytest.raises(decentral.NonFiniteGradientError):
        optimizer.step(bad)
    for old, new in zip(before, (optimizer.params, optimizer.public, optimizer.exp_avg)):
        np.testing.assert_array_equal(to_host(new), old)
    assert optimizer.t == 1


# -- who keeps a public copy ---------------------------------------------------------------------


def test_each_topology_knows_its_period_and_who_reads_each_worker():
    """W_{t+P} = W_t for the period each topology states, and readers() is every j ≠ i with
    W_ji ≠ 0 at some step (here: any of the first 40)."""
    shifting = decentral.from_matrix(lambda t: np.roll(np.eye(5), t % 3, axis=1), "shifting", period=3)
    for workers in range(1, 10):
        for topology in (
            decentral.one_peer_exponential(),
            decentral.ring(),
            decentral.directed_ring(),
            decentral.complete(),
            decentral.base_graph(1),
            decentral.base_graph(2),
            decentral.from_matrix(np.full((workers, workers), 1 / workers)),
            *([shifting] if workers == 5 else []),
        ):
            period = topology.period(workers)
            for t in range(2 * period):
                np.testing.assert_array_equal(topology.matrix(workers, t + period), topology.matrix(workers, t))
            ever = np.any([topology.matrix(workers, t) != 0 for t in range(40)], axis=0)
            np.fill_diagonal(ever, False)
            np.testing.assert_array_equal(decentral.readers(topology, workers), ever)
    assert decentral.one_peer_exponential().period(8) == 3 and decentral.ring().period(8) == 2
    ring = decentral.directed_ring()
    assert ring.period(8) == 1 and (ring.peers(8, 5) == (np.arange(8) - 1) % 8).all()


def test_compressed_gossip_refuses_a_topology_that_does_not_say_its_period():
    rows = np.zeros((3, 8))
    moving = decentral.from_matrix(lambda t: np.full((3, 3), 1 / 3), "moving")
    with pytest.raises(ValueError, match="compressed gossip over the topology 'moving' needs its period"):
        decentral.DecentralizedAdamW(rows, topology=moving, compression=compress.int8())
    decentral.DecentralizedAdamW(rows, topology=moving)  # dense rows go to this step's peers only
    decentral.DecentralizedAdamW(rows, topology=moving, outer=decentral.DiLoCo(every=2))  # and outer steps
    periodic = decentral.from_matrix(lambda t: np.full((3, 3), 1 / 3), "moving", period=1)
    decentral.DecentralizedAdamW(rows, topology=periodic, compression=compress.int8())
    with pytest.raises(ValueError, match="period is for a matrix that is a function of t"):
        decentral.from_matrix(np.eye(3), period=2)
    with pytest.raises(ValueError, match="period must be"):
        decentral.from_matrix(lambda t: np.eye(3), period=0)
