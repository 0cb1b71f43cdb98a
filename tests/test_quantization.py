"""8-bit and 4-bit optimizer states (SPEC §9): the maps, the code lookup, the 4-bit packing,
and every fused step with quantized states against the reference written from the spec:
dequantize, the float32 step, quantize (absmax per block, the nearest code to m/absmax)."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steadystep import dispatch, optim, quantization
from steadystep.kernels.optim import BLOCKWISE
from steadystep._arrays import classify
from steadystep._half import BFLOAT16_BITS, narrowed, widened
from tests.conftest import SIMULATOR
from tests.helpers import to_device

SIZE = 600 if SIMULATOR else 5000  # two whole blocks and a shorter one on the simulator; 19 and 136 elements here
STEPS = 2
BITS = [8, 4]


def exact_nearest(y, qmap):
    """The index of the map entry nearest each y in float64, ties to the lower entry."""
    distance = np.abs(np.asarray(y, np.float64)[:, None] - qmap.astype(np.float64)[None, :])
    return np.argmin(distance, axis=1)


def assert_codes(codes, y, qmap):
    """Codes equal the exact nearest ones, except where y lies within 1 float32 ulp of the
    midpoint between the two codes, where either is right."""
    codes = np.asarray(codes).reshape(-1).astype(np.int64)
    exact = exact_nearest(y, qmap)
    differ = np.flatnonzero(codes != exact)
    if differ.size:
        assert np.all(np.abs(codes[differ] - exact[differ]) == 1), differ[:5]
        midpoint = (qmap[codes[differ]].astype(np.float64) + qmap[exact[differ]]) / 2
        ulp = np.spacing(np.abs(y[differ]).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(y[differ] - midpoint) <= ulp), (y[differ][:5], midpoint[:5])


def test_dynamic_maps_equal_bitsandbytes():
    functional = pytest.importorskip("bitsandbytes.functional")
    for signed in (True, False):
        theirs = functional.create_dynamic_map(signed=signed).numpy()
        np.testing.assert_array_equal(quantization.dynamic_map(signed), theirs)
    assert quantization.dynamic_map(True)[0] < 0 and quantization.dynamic_map(False)[0] == 0


def _torchao_dynamic_map(signed, exponent_bits=3, total_bits=4):
    """torchao's create_dynamic_map (bitsandbytes' without the zero padding) in torch's own
    arithmetic: float32 linspace and means, scaled by powers of ten."""
    values = [0.0, 1.0]
    for i in range(exponent_bits):
        items = 2 ** (i + total_bits - 1 - exponent_bits + (0 if signed else 1)) + 1
        ends = torch.linspace(0.1, 1, items)
        means = (10 ** (i + 1 - exponent_bits)) * ((ends[:-1] + ends[1:]) / 2.0)
        values += means.tolist() + ((-means).tolist() if signed else [])
    return np.sort(np.array(values, np.float32))


def test_4bit_maps_are_torchaos():
    np.testing.assert_array_equal(quantization.dynamic_map(True, bits=4), _torchao_dynamic_map(True))
    np.testing.assert_array_equal(quantization.dynamic_map(False, bits=4), _torchao_dynamic_map(False))
    np.testing.assert_array_equal(quantization.linear_map(), torch.linspace(0, 1, 17)[1:].numpy())
    np.testing.assert_array_equal(quantization.dynamic_map(True), _torchao_dynamic_map(True, 7, 8))
    assert quantization.state_map(True, 4) is quantization.dynamic_map(True, bits=4)
    assert quantization.state_map(False, 4) is quantization.linear_map()
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        quantization.state_map(True, 2)


MAPS = {
    "8-bit signed": lambda: quantization.dynamic_map(True),
    "8-bit from 0": lambda: quantization.dynamic_map(False),
    "4-bit signed": lambda: quantization.dynamic_map(True, bits=4),
    "4-bit from 0": lambda: quantization.dynamic_map(False, bits=4),
    "4-bit linear": quantization.linear_map,
}


def _probes(qmap):
    """Values around every map entry and midpoint (±2 ulp), spread magnitudes, the ends, ±0."""
    midpoints = (qmap[:-1].astype(np.float64) + qmap[1:]) / 2
    near = np.concatenate([qmap, midpoints.astype(np.float32)])
    up, down = near, near
    around = [near]
    for _ in range(2):
        up, down = np.nextafter(up, np.float32(2)), np.nextafter(down, np.float32(-2))
        around += [up, down]
    rng = np.random.default_rng(0)
    spread = (rng.uniform(-1, 1, 20000) * 10.0 ** rng.uniform(-12, 0, 20000)).astype(np.float32)
    values = np.concatenate([*around, spread, np.float32([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45])])
    values = np.clip(values, -1, 1).astype(np.float32)
    return values if qmap[0] < 0 else np.abs(values)


@pytest.mark.parametrize("kind", list(MAPS))
def test_the_code_lookup_finds_the_nearest_code(kind):
    qmap = MAPS[kind]()
    values = _probes(qmap)
    _, lookup = quantization.code_tables(qmap)
    assert_codes(quantization.nearest_codes(values, lookup), values, qmap)


@pytest.mark.parametrize("contiguous", [True, False], ids=["byte permutes where the CPU has them", "a load each"])
def test_the_cpu_reads_a_block_of_codes_as_their_map_values_times_the_scale(contiguous):
    from numba import njit

    from steadystep.cpu.primitives import byte_planes, dequantize_block

    @njit(error_model="numpy")
    def dequantized(values, codes, start, count, qmap, scale):
        dequantize_block(values, codes, start, count, qmap, byte_planes(qmap), scale)

    rng = np.random.default_rng(7)
    qmap = np.sort(rng.standard_normal(256) * 10.0 ** rng.uniform(-30, 30, 256)).astype(np.float32)
    qmap[:3] = -np.inf, -0.0, np.float32(1e-45)  # every bit of every byte plane matters
    codes = np.concatenate([np.arange(256), rng.integers(0, 256, 744)]).astype(np.uint8)
    cases = [(0, 0, 1.0), (64, 0, 1.0), (256, 0, 0.37), (255, 700, -3.0), (65, 3, 1e-3), (1, 999, 2.0)]
    for count, start, scale in cases:
        values = np.full(512 if contiguous else (256, 2), np.nan, np.float32)
        into = values if contiguous else values[:, 0]  # strided: Numba types it as non-contiguous
        dequantized(into, codes, start, count, qmap, np.float32(scale))
        expected = qmap[codes[start : start + count]] * np.float32(scale)
        np.testing.assert_array_equal(into[:count], expected)
        assert np.isnan(into[count:256]).all()


@pytest.mark.parametrize("contiguous", [True, False], ids=["16 at a time", "left to the caller"])
@pytest.mark.parametrize("kind", ["8-bit signed", "8-bit from 0"])
def test_the_cpu_writes_a_block_of_codes_as_the_formulas_do(kind, contiguous):
    """cpu.primitives.quantize_block (nearest) and quantize_block_rounded (stochastic) against
    the formulas nearest_code and rounded_code, compiled as the kernels compile them: the same
    codes for every whole group of 16, nothing written past it or where the arrays are strided."""
    from numba import njit

    from steadystep.cpu._generated.optim import nearest_code_f32, rounded_code_f32
    from steadystep.cpu.primitives import quantize_block, quantize_block_rounded

    @njit(error_model="numpy")
    def blocks(codes, start, values, count, scale, lookup, qmap, key):
        if key == 0:
            return quantize_block(codes, start, values, count, scale, lookup)
        return quantize_block_rounded(codes, start, values, count, scale, lookup, qmap, start * 2 + 1, 2, key)

    @njit(error_model="numpy")
    def formulas(codes, start, values, count, scale, lookup, qmap, key):
        for k in range(count):
            y = values[k] / scale if scale > np.float32(0.0) else np.float32(0.0)
            nearest = nearest_code_f32(y, lookup)
            codes[start + k] = nearest if key == 0 else rounded_code_f32(y, nearest, qmap, (start + k) * 2 + 1, key)

    qmap = MAPS[kind]()
    _, lookup = quantization.code_tables(qmap)
    probes = _probes(qmap)
    rng = np.random.default_rng(9)
    cases = [(0, 0, 1.0), (16, 0, 1.0), (256, 5, 1.0), (255, 700, 0.37), (17, 3, 3.0), (1, 999, 2.0), (40, 9, 0.0)]
    for key in (0, 0x5DEECE66D12345, -7):
        for count, start, scale in cases:
            values = (rng.choice(probes, count) * np.float32(scale)).astype(np.float32)
            given = np.full(256 if contiguous else (256, 2), np.nan, np.float32)
            into = given if contiguous else given[:, 0]  # strided: Numba types it as non-contiguous
            into[:count] = values
            codes = np.full(1000 if contiguous else (1000, 2), 77, np.uint8)
            written = codes if contiguous else codes[:, 0]
            done = blocks(written, start, into, count, np.float32(scale), lookup, qmap, key)
            assert done == (count // 16 * 16 if contiguous else 0)
            expected = np.full(1000, 77, np.uint8)
            formulas(expected, start, into, done, np.float32(scale), lookup, qmap, key)
            np.testing.assert_array_equal(written, expected)
            if key == 0:
                y = values[:done] / np.float32(scale) if scale > 0 else np.zeros(done, np.float32)
                assert_codes(written[start : start + done], y, qmap)


def _perturbed_dynamic_map():
    """The signed dynamic map with each value moved by up to 1e-5 of itself: no longer linear
    within its decades, so the lookup holds no pieces for it."""
    qmap = quantization.dynamic_map(signed=True).astype(np.float64)
    return np.sort(qmap * (1 + 1e-5 * np.random.default_rng(3).uniform(-1, 1, qmap.size))).astype(np.float32)


@pytest.mark.skipif(SIMULATOR, reason="the CPU's own code path")
@pytest.mark.parametrize("kind", ["8-bit signed", "8-bit from 0", "perturbed"])
def test_the_cpu_finds_codes_by_the_maps_linear_pieces_as_the_lookup_does(kind):
    """A CPU with AVX-512 finds 16 codes at a time by the map's linear pieces (the lookup's
    words after its buckets), the buckets serving a vector that holds a value within the band
    of a midpoint: every 211th float32 of [−1, 1], and each midpoint and its neighbours, give
    the lookup's codes. The dynamic maps have pieces; a map moved off its lines has none."""
    from numba import njit

    from steadystep import _primitives
    from steadystep.cpu.primitives import FLOAT_PERMUTES, quantize_block

    @njit(error_model="numpy")
    def coded(codes, values, lookup):
        for start in range(0, values.shape[0], 256):
            quantize_block(codes, start, values[start : start + 256], 256, np.float32(1.0), lookup)

    qmap = _perturbed_dynamic_map() if kind == "perturbed" else MAPS[kind]()
    midpoints, lookup = quantization.code_tables(qmap)
    pieces = lookup[_primitives.PIECES.at :]
    kinds = {"8-bit signed": _primitives.MIRRORED, "8-bit from 0": _primitives.POSITIVE, "perturbed": 0}
    assert pieces[_primitives.PIECES.kind] == kinds[kind]
    magnitudes = np.arange(0, 0x3F800001, 211, dtype=np.int64).astype(np.int32).view(np.float32)
    # each midpoint and its neighbours in a vector of its own, beside values the pieces place
    # for certain (a map value), so that the pieces, not the buckets, decide them where they can
    edges = np.concatenate([midpoints[:255], *(np.nextafter(midpoints[:255], np.float32(d)) for d in (-2, 2))])
    alone = np.full((edges.size, 16), qmap[-2], np.float32)
    alone[:, 0] = edges
    values = np.concatenate([magnitudes, -magnitudes, alone.reshape(-1), np.float32([0.0, -0.0, 1.0, -1.0])])
    values = values[: values.size // 256 * 256]
    codes = np.zeros(values.size, np.uint8)
    coded(codes, values, lookup)
    exact = quantization.nearest_codes(values, lookup)
    np.testing.assert_array_equal(codes, exact)
    if not FLOAT_PERMUTES:
        return
    # the pieces alone: with the buckets emptied, what the pieces coded is still exact
    pieces_only = lookup.copy()
    pieces_only[: _primitives.PIECES.at] = 0
    coded(codes, values, pieces_only)
    served = magnitudes.size * (1 if kind == "8-bit from 0" else 2)  # a map from 0 leaves negatives to the buckets
    vectors = (codes == exact).reshape(-1, 16).all(axis=1)[: served // 16]
    if kind == "perturbed":
        assert not vectors.any()
    else:
        assert vectors.mean() > 0.99, vectors.mean()  # a vector holds a value within the band now and then


@pytest.mark.parametrize("contiguous", [True, False], ids=["16 bytes at a time", "left to the caller"])
@pytest.mark.parametrize("kind", ["4-bit signed", "4-bit from 0", "4-bit linear"])
def test_the_cpu_writes_a_block_of_4bit_codes_as_the_formulas_do(kind, contiguous):
    """cpu.primitives.quantize_pairs (nearest) and quantize_pairs_rounded (stochastic) against
    the formulas nearest_code16 and rounded_code as the kernels compile them: the same bytes for
    every whole group of 16, nothing written past it, or at all where the arrays are strided or
    the CPU has no AVX-512."""
    from numba import njit

    from steadystep.cpu._generated.optim import nearest_code16_f32, rounded_code_f32
    from steadystep.cpu.primitives import FLOAT_PERMUTES, quantize_pairs, quantize_pairs_rounded

    @njit(error_model="numpy")
    def vectors(codes, base, values, pairs, midpoints, qmap, key):
        if key == 0:
            return quantize_pairs(codes, base, values, pairs, midpoints)
        return quantize_pairs_rounded(codes, base, values, pairs, midpoints, qmap, base * 2 + 1, 2, key)

    @njit(error_model="numpy")
    def formulas(codes, base, values, pairs, midpoints, qmap, key):
        for h in range(2 * pairs):
            y = values[h]
            code = nearest_code16_f32(y, midpoints)
            if key != 0:
                code = rounded_code_f32(y, code, qmap, (base + h) * 2 + 1, key)
            codes[base + h // 2] = code << 4 if h % 2 == 0 else codes[base + h // 2] | code

    qmap = MAPS[kind]()
    midpoints, _ = quantization.code_tables(qmap)
    probes = _probes(qmap)
    rng = np.random.default_rng(10)
    for key in (0, 0x5DEECE66D12345, -7):
        for pairs, base in [(0, 0), (15, 0), (16, 0), (17, 5), (64, 100), (63, 9)]:
            given = np.full(256 if contiguous else (256, 2), np.nan, np.float32)
            into = given if contiguous else given[:, 0]  # strided: Numba types it as non-contiguous
            into[: 2 * pairs] = rng.choice(probes, 2 * pairs)
            codes = np.full(200 if contiguous else (200, 2), 77, np.uint8)
            written = codes if contiguous else codes[:, 0]
            done = vectors(written, base, into, pairs, midpoints, qmap, key)
            assert done == (pairs // 16 * 16 if contiguous and FLOAT_PERMUTES else 0)
            expected = np.full(200, 77, np.uint8)
            formulas(expected, base, into, done, midpoints, qmap, key)
            np.testing.assert_array_equal(written, expected)


@pytest.mark.parametrize("contiguous", [True, False], ids=["a permute where the CPU has AVX-512", "a load each"])
def test_the_cpu_reads_a_block_of_4bit_codes_as_their_map_values_times_the_scale(contiguous):
    from numba import njit

    from steadystep.cpu.primitives import dequantize_pairs

    @njit(error_model="numpy")
    def dequantized(values, codes, base, pairs, qmap, scale):
        dequantize_pairs(values, codes, base, pairs, qmap, scale)

    rng = np.random.default_rng(8)
    qmap = np.sort(rng.standard_normal(16)).astype(np.float32)
    qmap[:2] = -np.inf, -0.0
    codes = np.concatenate([np.arange(256), rng.integers(0, 256, 100)]).astype(np.uint8)
    for pairs, base, scale in [(0, 0, 1.0), (16, 0, 1.0), (64, 0, 0.37), (63, 200, -3.0), (17, 3, 1e-3), (1, 355, 2.0)]:
        values = np.full(256 if contiguous else (128, 2), np.nan, np.float32)
        into = values if contiguous else values[:, 0]
        dequantized(into, codes, base, pairs, qmap, np.float32(scale))
        chosen = codes[base : base + pairs]
        expected = np.stack([qmap[chosen >> 4], qmap[chosen & 15]], axis=1).reshape(-1) * np.float32(scale)
        np.testing.assert_array_equal(into[: 2 * pairs], expected)
        assert np.isnan(into[2 * pairs : 128]).all()


def test_quantize_and_dequantize_round_trip():
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(1000) * 10.0 ** rng.uniform(-3, 0, 1000)).astype(np.float32)
    state = quantization.quantize(values)
    assert state.signed and state.absmax.shape == (4,)
    back = quantization.dequantize(state)
    for block in range(4):
        piece = slice(256 * block, 256 * (block + 1))
        assert state.absmax[block] == np.abs(values[piece]).max()
        assert_codes(state.codes[piece], values[piece] / state.absmax[block], state.host_map)
    # the dynamic map's worst relative step is in its top decade: 0.9/64 of the absmax
    assert np.all(np.abs(back - values) <= 0.9 / 64 / 2 * np.repeat(state.absmax, 256)[:1000] * 1.0001)


@pytest.mark.parametrize("size", [1000, 999])
def test_4bit_codes_are_packed_as_torchao_packs_them(size):
    """Blocks of 128, two codes a byte with the first in the high nibble (torchao's
    ``(codes[::2] << 4) | codes[1::2]``); an odd row ends in a byte of one code."""
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(size) * 10.0 ** rng.uniform(-3, 0, size)).astype(np.float32)
    state = quantization.quantize(values, bits=4)
    assert state.bits == 4 and state.size == size and state.codes.shape == (500,) and state.absmax.shape == (8,)
    codes = np.zeros(1000, np.int64)
    for block in range(8):
        piece = slice(128 * block, min(128 * (block + 1), size))
        assert state.absmax[block] == np.abs(values[piece]).max()
        codes[piece] = exact_nearest(values[piece] / state.absmax[block], state.host_map)
    np.testing.assert_array_equal(state.codes, (codes[0::2] << 4) | codes[1::2])
    np.testing.assert_array_equal(quantization.element_codes(state), codes[:size])
    back = quantization.dequantize(state)
    np.testing.assert_array_equal(back, state.host_map[codes[:size]] * np.repeat(state.absmax, 128)[:size])
    unsigned = quantization.quantize(np.abs(values), bits=4)
    assert unsigned.host_map is not None and np.array_equal(unsigned.host_map, quantization.linear_map())
    zeros = quantization.zeros(size, signed=True, bits=4)
    assert not np.any(quantization.dequantize(zeros)) and zeros.codes.shape == (500,)
    assert quantization.element_codes(zeros)[0] == np.flatnonzero(zeros.host_map == 0)[0]


def test_4bit_states_equal_torchaos_where_it_is_installed():
    """torchao's own quantization of the same values (its scale, map, codes and packing), both
    signs: the same bytes, and its state dequantized by steadystep as torchao does. Skipped
    where torchao is not installed (the benchmark's peer; not a test dependency)."""
    pytest.importorskip("torchao")
    from torchao.optim.quant_utils import quantize_4bit_with_qmap, scale_tensor
    from torchao.optim.subclass_4bit import OptimState4bit, get_qmap_signed, get_qmap_unsigned

    rng = np.random.default_rng(8)
    values = (rng.standard_normal(128 * 64) * 10.0 ** rng.uniform(-3, 0, 128 * 64)).astype(np.float32)
    for signed, chosen in ((True, values), (False, np.abs(values))):
        qmap = torch.tensor(get_qmap_signed() if signed else get_qmap_unsigned())
        scaled, scale = scale_tensor(torch.from_numpy(chosen.copy()), 128)
        codes = quantize_4bit_with_qmap(scaled, qmap)
        theirs = OptimState4bit((codes[::2] << 4) | codes[1::2], scale, qmap, signed, (chosen.size,))
        ours = quantization.quantize(chosen, bits=4, signed=signed)
        np.testing.assert_array_equal(ours.host_map, qmap.numpy())
        np.testing.assert_array_equal(ours.absmax, scale.numpy())
        np.testing.assert_array_equal(ours.codes, theirs.codes.numpy())  # no value lies on a midpoint here
        read = quantization.QuantizedState(theirs.codes, theirs.scale, theirs.qmap)
        np.testing.assert_array_equal(quantization.dequantize(read), theirs.dequantize().numpy())


# -- every step with 8-bit states against dequantize → float32 step → quantize ---------------------

OPTIMIZERS = {
    "adamw": (("exp_avg", "exp_avg_sq"), dict(lr=1e-2, weight_decay=0.1), True),
    "adam": (("exp_avg", "exp_avg_sq"), dict(lr=1e-2, weight_decay=0.1), True),
    "lion": (("exp_avg",), dict(lr=1e-3, weight_decay=0.1), False),
    "sgd": (("momentum_buffer",), dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01), True),
    "rmsprop": (("square_avg",), dict(lr=1e-3, weight_decay=0.01), False),
    "adagrad": (("state_sum",), dict(lr=1e-2, weight_decay=0.01), True),
}
SIGNED = {"exp_avg": True, "exp_avg_sq": False, "momentum_buffer": True, "square_avg": False, "state_sum": False}


def _call(name, param, grad, states, options, step, target):
    names, _, counted = OPTIMIZERS[name]
    function = getattr(optim, name)
    extra = dict(step=step) if counted else {}
    function(param, grad, *(states[state] for state in names), **options, **extra, target=target)


def _initial_states(names, size, rng, bits=8):
    states = {}
    for state in names:
        values = rng.standard_normal(size) * 10.0 ** rng.uniform(-4, 0, size) * 1e-2
        values = np.abs(values) if not SIGNED[state] else values
        states[state] = quantization.quantize(values.astype(np.float32), signed=SIGNED[state], bits=bits)
    return states


def _reference(name, param, grad, states, options, step):
    """The spec's step: float32 moments from the codes, the float32 optimizer (steadystep's own,
    on the CPU; tested against torch in test_optim.py) on float32 copies, then per block
    absmax = max |m| and y = m/absmax (0 in a block of zeros)."""
    names = OPTIMIZERS[name][0]
    moments = {state: quantization.dequantize(states[state]).reshape(-1) for state in names}
    wide = param.astype(np.float32) if param.dtype != np.float32 else param.copy()
    _call(name, wide, grad.astype(np.float32), moments, options, step, "cpu")
    result = {}
    for state, values in moments.items():
        block = 256 if states[state].bits == 8 else 128
        blocks = -(-values.size // block)
        padded = np.zeros(blocks * block, np.float32)
        padded[: values.size] = np.abs(values)
        absmax = padded.reshape(blocks, block).max(axis=1)
        scale = np.repeat(absmax, block)[: values.size]
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(scale > 0, values / scale, np.float32(0)).astype(np.float32)
        result[state] = absmax, y
    return wide, result


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_step_with_quantized_states_equals_the_reference(name, dtype, bits, target):
    if dtype == "bfloat16" and name not in ("adamw", "lion"):
        pytest.skip("half precision on two of the steps (the same at/put in every one; each compiles apart)")
    if SIMULATOR and (dtype == "bfloat16" or name not in ("adamw", "lion", "sgd")):
        pytest.skip("the simulator checks three steps in float32 (one skeleton; each compiles apart)")
    names, options, _ = OPTIMIZERS[name]
    rng = np.random.default_rng(2)
    param = rng.standard_normal(SIZE).astype(np.float32)
    if dtype == "bfloat16":
        param = param.astype(ml_dtypes.bfloat16)
    states = _initial_states(names, SIZE, rng, bits)
    for step in range(1, STEPS + 1):
        grad = (rng.standard_normal(SIZE) * 10.0 ** rng.uniform(-3, 0, SIZE)).astype(param.dtype)
        expected_param, expected = _reference(name, param, grad, states, options, step)
        _call(name, param, grad, states, options, step, target)
        if dtype == "bfloat16":
            np.testing.assert_array_equal(param.view(np.uint16), narrowed(expected_param, BFLOAT16_BITS))
        else:
            np.testing.assert_array_equal(param, expected_param)
        for state in names:
            absmax, y = expected[state]
            np.testing.assert_array_equal(states[state].absmax, absmax)
            assert_codes(quantization.element_codes(states[state]), y, states[state].host_map)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_no_moment_overflows_within_the_bounds_that_let_the_cpu_skip_the_scales_kernel(name):
    """cpu.backend's bounds hold because every moment update is a polynomial of degree at most 2:
    at the bounds' corners (numbers at STEP_BOUND, a gradient times a loss scale's inverse at
    STEP_BOUND², old moments at STATE_BOUND), every step's float32 moments are finite and
    agree with the same step in float64, which has room to spare there."""
    from steadystep.cpu.backend import STATE_BOUND, STEP_BOUND

    names, options, _ = OPTIMIZERS[name]
    extreme = {key: STEP_BOUND for key in ("lr", "weight_decay", "momentum") if key in options}
    sign = np.array([1, -1, 1, -1])
    for step in (1, 2):
        moments = {}
        for dtype in (np.float32, np.float64):
            param = (sign * STEP_BOUND).astype(dtype)
            grad = (np.array([1, 1, -1, -1]) * STEP_BOUND**2).astype(dtype)
            states = {state: (STATE_BOUND * (sign if SIGNED[state] else np.abs(sign))).astype(dtype) for state in names}
            _call(name, param, grad, states, {**options, **extreme}, step, "cpu")
            moments[dtype] = states
        for state in names:
            assert np.all(np.isfinite(moments[np.float32][state])), (state, moments[np.float32][state])
            np.testing.assert_allclose(moments[np.float32][state], moments[np.float64][state], rtol=1e-6)
        blockwise = {entry.name: entry for entry in BLOCKWISE}[name]
        if not blockwise.reads_param:  # the bound check leaves the parameter out: no moment may read it
            param = (sign * 1e30).astype(np.float32)
            grad = (np.array([1, 1, -1, -1]) * STEP_BOUND**2).astype(np.float32)
            states = {
                state: (STATE_BOUND * (sign if SIGNED[state] else np.abs(sign))).astype(np.float32) for state in names
            }
            _call(name, param, grad, states, {**options, **extreme}, step, "cpu")
            for state in names:
                np.testing.assert_array_equal(states[state], moments[np.float32][state])


@pytest.mark.skipif(SIMULATOR, reason="the CPU's: a GPU always runs both kernels")
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize(
    "grad_size, param_size",
    [(1e-2, 1.0), (1e5, 1.0), (1e-2, 1e5), (math.inf, 1.0)],
    ids=["within the bound", "a gradient beyond it", "a parameter beyond it", "refused"],
)
@pytest.mark.parametrize("name", ["adamw", "sgd"])  # sgd's moment takes the parameter too (weight decay)
def test_a_large_step_skips_its_scales_kernel_only_where_no_state_can_overflow(
    name, grad_size, param_size, bits, monkeypatch
):
    """The CPU's codes kernel finds each block's absmax itself; the scales kernel, which flags
    a step that would make a state non-finite, runs unless every number and array of the step
    that a moment reads is within cpu.backend.STEP_BOUND (and the states within STATE_BOUND):
    AdamW's moments never read the parameter, SGD's do. Either way the step is the
    reference's, and a refused one writes nothing."""
    from steadystep.cpu import backend

    launched = []
    original = backend.blockwise_launch

    def spied(scales, codes, names, quantized, size, unread=()):
        return original(lambda *arguments: launched.append(scales(*arguments)), codes, names, quantized, size, unread)

    monkeypatch.setattr(backend, "blockwise_launch", spied)
    size = backend.PARALLEL_MIN + 300  # below PARALLEL_MIN both kernels run: the check would cost what it saves
    names, options, _ = OPTIMIZERS[name]
    rng = np.random.default_rng(5)
    param = rng.standard_normal(size).astype(np.float32)
    param[size // 2] = param_size
    states = _initial_states(names, size, rng, bits)
    grad = (rng.standard_normal(size) * 1e-2).astype(np.float32)
    grad[size // 3] = grad_size
    scales_ran = grad_size > 1 or (param_size > 1 and name == "sgd")
    if grad_size == math.inf:
        before = _snapshot(param, *(part for state in names for part in (states[state].codes, states[state].absmax)))
        with pytest.raises(ValueError, match="non-finite.*nothing was written"):
            _call(name, param, grad, states, options, 1, "cpu")
        after = [param, *(part for state in names for part in (states[state].codes, states[state].absmax))]
        for old, new in zip(before, after):
            np.testing.assert_array_equal(old, new)
    else:
        expected_param, expected = _reference(name, param, grad, states, options, 1)
        _call(name, param, grad, states, options, 1, "cpu")
        np.testing.assert_array_equal(param, expected_param)
        for state in names:
            absmax, y = expected[state]
            np.testing.assert_array_equal(states[state].absmax, absmax)
            assert_codes(quantization.element_codes(states[state]), y, states[state].host_map)
    assert bool(launched) == scales_ran


def test_rows_do_not_share_blocks(target):
    """A state of rows (N workers' [N, D]) quantizes each row's blocks on their own."""
    rows, length = 3, 300  # each row: a whole block and one of 44
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(rows * length) * np.repeat([1e-3, 1.0, 1e2], length)).astype(np.float32)
    state = quantization.quantize(values, row_length=length)
    assert state.absmax.shape == (6,)
    for row in range(rows):
        piece = values[row * length : (row + 1) * length]
        np.testing.assert_array_equal(
            state.absmax[2 * row : 2 * row + 2], [np.abs(piece[:256]).max(), np.abs(piece[256:]).max()]
        )
    per_element = np.concatenate([np.repeat(state.absmax[2 * row : 2 * row + 2], [256, 44]) for row in range(rows)])
    assert np.all(np.abs(quantization.dequantize(state) - values) <= 0.9 / 64 / 2 * per_element * 1.0001)


def test_4bit_rows_of_odd_length_each_start_a_byte():
    """Rows of 301: blocks of 128, 128 and 45, and 151 bytes a row whose last holds one code."""
    rows, length = 3, 301
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(rows * length) * np.repeat([1e-3, 1.0, 1e2], length)).astype(np.float32)
    state = quantization.quantize(values, row_length=length, bits=4)
    assert state.codes.shape == (3 * 151,) and state.absmax.shape == (9,) and state.size == 903
    codes = quantization.element_codes(state)
    for row in range(rows):
        piece = values[row * length : (row + 1) * length]
        absmax = [np.abs(piece[start : start + 128]).max() for start in (0, 128, 256)]
        np.testing.assert_array_equal(state.absmax[3 * row : 3 * row + 3], absmax)
        scale = np.repeat(absmax, [128, 128, 45])
        np.testing.assert_array_equal(
            codes[row * length : (row + 1) * length], exact_nearest(piece / scale, state.host_map)
        )
        assert state.codes[151 * row + 150] & 15 == 0  # the row's last byte: one code, in its high nibble
    np.testing.assert_array_equal(quantization.packed(codes, length), state.codes)
    np.testing.assert_array_equal(quantization.unpacked(state.codes, length), codes)


@pytest.mark.parametrize("bits", BITS)
def test_stochastic_rounding_of_states_is_unbiased_and_takes_a_neighbouring_code(bits, target):
    size = 512 if SIMULATOR else 4096
    rng = np.random.default_rng(4)
    start = quantization.quantize((rng.standard_normal(size) * 1e-2).astype(np.float32), signed=True, bits=bits)
    grad = (rng.standard_normal(size) * 1e-2).astype(np.float32)
    options = dict(lr=0.0, momentum=0.9)
    _, expected = _reference("sgd", np.zeros(size, np.float32), grad, {"momentum_buffer": start}, options, 2)
    absmax, y = expected["momentum_buffer"]
    qmap = start.host_map
    lower = np.clip(np.searchsorted(qmap, y, side="right") - 1, 0, qmap.size - 2)
    runs = 8 if SIMULATOR else 64
    totals = np.zeros(size)
    for seed in range(runs):
        momentum = quantization.QuantizedState(start.codes.copy(), start.absmax.copy(), qmap.copy(), rounding_seed=seed)
        optim.sgd(np.zeros(size, np.float32), grad, momentum, step=2, **options, target=target)
        np.testing.assert_array_equal(momentum.absmax, absmax)
        codes = quantization.element_codes(momentum).astype(np.int64)
        assert np.all((codes == lower) | (codes == lower + 1))
        totals += qmap[codes]
    # each draw lies within one spacing of y, and their mean within a few standard errors of it
    spacing = qmap[lower + 1].astype(np.float64) - qmap[lower]
    assert np.abs(totals / runs - y).mean() < 3 * 0.5 * spacing.mean() / math.sqrt(runs)
    # the same seed draws the same codes; the state counts the steps that stored it
    again = quantization.QuantizedState(start.codes.copy(), start.absmax.copy(), qmap.copy(), rounding_seed=runs - 1)
    optim.sgd(np.zeros(size, np.float32), grad, again, step=2, **options, target=target)
    np.testing.assert_array_equal(again.codes, momentum.codes)
    assert again.updates == 1


# -- bad input: refused, nothing written ---------------------------------------------------------


def _adamw_arrays(size=SIZE, bits=8):
    rng = np.random.default_rng(5)
    param = rng.standard_normal(size).astype(np.float32)
    grad = rng.standard_normal(size).astype(np.float32)
    exp_avg = quantization.quantize(rng.standard_normal(size).astype(np.float32) * 1e-2, signed=True, bits=bits)
    exp_avg_sq = quantization.quantize(
        np.abs(rng.standard_normal(size)).astype(np.float32) * 1e-4, signed=False, bits=bits
    )
    return param, grad, exp_avg, exp_avg_sq


def _snapshot(*arrays):
    return [np.array(array, copy=True) for array in arrays]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("special", [math.nan, math.inf, 3e22])  # (1 − β2)·g² overflows float32
def test_a_step_that_would_make_a_state_non_finite_is_refused_and_writes_nothing(special, bits, target):
    param, grad, exp_avg, exp_avg_sq = _adamw_arrays(bits=bits)
    grad[SIZE * 7 // 8] = special  # in a block of the middle
    before = _snapshot(param, exp_avg.codes, exp_avg.absmax, exp_avg_sq.codes, exp_avg_sq.absmax)
    with pytest.raises(ValueError, match="non-finite.*nothing was written"):
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, target=target)
    for old, new in zip(before, [param, exp_avg.codes, exp_avg.absmax, exp_avg_sq.codes, exp_avg_sq.absmax]):
        np.testing.assert_array_equal(old, new)
    grad[SIZE * 7 // 8] = 0.0  # and the next step runs
    optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, target=target)
    assert not np.array_equal(param, before[0])


@pytest.mark.parametrize("bits", BITS)
def test_found_inf_skips_the_step_with_codes_and_scales_unchanged(bits, target):
    param, grad, exp_avg, exp_avg_sq = _adamw_arrays(bits=bits)
    grad[7] = math.inf
    before = _snapshot(param, exp_avg.codes, exp_avg.absmax, exp_avg_sq.codes)
    optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, found_inf=np.ones(1, np.float32), target=target)
    for old, new in zip(before, [param, exp_avg.codes, exp_avg.absmax, exp_avg_sq.codes]):
        np.testing.assert_array_equal(old, new)


def test_bad_states_are_refused_with_the_argument_named(target):
    param, grad, exp_avg, exp_avg_sq = _adamw_arrays()
    before = _snapshot(param, exp_avg.codes)
    with pytest.raises(TypeError, match="exp_avg_sq is a float array but exp_avg is 8-bit"):
        optim.adamw(param, grad, exp_avg, np.zeros_like(param), step=1, target=target)
    short = quantization.quantize(np.ones(4000, np.float32), signed=True)
    with pytest.raises(ValueError, match="one size"):
        optim.adamw(param, grad, short, exp_avg_sq, step=1, target=target)
    with pytest.raises(ValueError, match="exp_avg holds values of either sign"):
        optim.adamw(param, grad, exp_avg_sq, exp_avg_sq, step=1, target=target)
    with pytest.raises(TypeError, match="8-bit states serve float32, bfloat16 and float16"):
        optim.adamw(param.astype(np.float64), grad.astype(np.float64), exp_avg, exp_avg_sq, step=1, target=target)
    with pytest.raises(TypeError, match="step must be an int"):
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=np.zeros(1, np.float32), target=target)
    with pytest.raises(TypeError, match="no 8-bit form"):
        optim.adamw(param, grad, exp_avg, exp_avg_sq, np.zeros_like(param), amsgrad=True, step=1, target=target)
    _, _, exp_avg4, exp_avg_sq4 = _adamw_arrays(bits=4)
    with pytest.raises(ValueError, match="one width; got exp_avg 8-bit, exp_avg_sq 4-bit"):
        optim.adamw(param, grad, exp_avg, exp_avg_sq4, step=1, target=target)
    with pytest.raises(ValueError, match=f"the 4-bit states hold {SIZE} elements but param has {SIZE - 1}"):
        optim.adamw(param[:-1], grad[:-1], exp_avg4, exp_avg_sq4, step=1, target=target)
    with pytest.raises(ValueError, match=f"the 8-bit states hold 4000 elements but param has {SIZE}"):
        optim.adamw(param, grad, short, quantization.zeros(4000, signed=False), step=1, target=target)
    for old, new in zip(before, [param, exp_avg.codes]):
        np.testing.assert_array_equal(old, new)


def test_a_state_that_does_not_fit_is_refused_when_made():
    codes, absmax, qmap = np.zeros(5000, np.uint8), np.zeros(20, np.float32), quantization.dynamic_map(True).copy()
    quantization.QuantizedState(codes, absmax, qmap)
    with pytest.raises(ValueError, match="absmax must be a float32 array of 20 values"):
        quantization.QuantizedState(codes, np.zeros(19, np.float32), qmap)  # another block size
    with pytest.raises(ValueError, match="absmax must be a float32 array"):
        quantization.QuantizedState(codes, np.zeros(20, np.float64), qmap)
    with pytest.raises(ValueError, match="absmax must hold finite values"):
        quantization.QuantizedState(codes, np.full(20, np.inf, np.float32), qmap)
    with pytest.raises(TypeError, match="codes must be a uint8 array"):
        quantization.QuantizedState(codes.astype(np.int8), absmax, qmap)
    with pytest.raises(ValueError, match="qmap must be increasing"):
        quantization.QuantizedState(codes, absmax, qmap[::-1].copy())
    with pytest.raises(ValueError, match="qmap must hold 256 \\(8-bit codes\\) or 16"):
        quantization.QuantizedState(codes, absmax, qmap[:255].copy())
    with pytest.raises(ValueError, match="in \\[-1, 1\\]"):
        quantization.QuantizedState(codes, absmax, qmap * 2)
    crowded = np.linspace(-1, 1, 256).astype(np.float32)
    crowded[128:136] = np.float32(1e-3) * (1 + np.arange(8) * 1e-4)  # neighbours 0.01% apart
    with pytest.raises(ValueError, match="closer than the code lookup resolves"):
        quantization.QuantizedState(codes, absmax, np.sort(crowded))
    with pytest.raises(ValueError, match=r"qmap has a decision midpoint within 2\*\*-32 of 0 \(0.0, between"):
        quantization.QuantizedState(codes, absmax, np.linspace(-1, 1, 256).astype(np.float32))  # ±1/255, no 0
    # 4 bits: two codes a byte, blocks of 128; a row of odd length ends in a byte of one code
    qmap4 = quantization.linear_map().copy()
    state = quantization.QuantizedState(codes[:2500], np.zeros(40, np.float32), qmap4)
    assert (state.bits, state.size) == (4, 5000)
    with pytest.raises(ValueError, match="absmax must be a float32 array of 40 values .* for 4-bit codes"):
        quantization.QuantizedState(codes[:2500], absmax, qmap4)  # the 8-bit block
    odd = quantization.QuantizedState(codes[:2049], np.zeros(33, np.float32), qmap4, row_length=4097)
    assert odd.size == 4097
    rows = quantization.QuantizedState(codes[: 3 * 151], np.zeros(9, np.float32), qmap4, row_length=301)
    assert rows.size == 903
    with pytest.raises(ValueError, match="row_length must be a positive int whose rows fill the state's 2500 bytes"):
        quantization.QuantizedState(codes[:2500], np.zeros(40, np.float32), qmap4, row_length=4097)
    with pytest.raises(ValueError, match="bits is 8"):
        quantization.quantize(np.ones(10, np.float32), qmap=qmap4, bits=8)


@settings(max_examples=5 if SIMULATOR else 30, deadline=None, derandomize=True)
@given(
    size=st.integers(1, 700),
    scale=st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e15]),
    special=st.sampled_from([None, 0.0, -0.0, 1e-45]),
    bits=st.sampled_from(BITS),
)
def test_any_size_and_magnitude_steps_as_the_reference(size, scale, special, bits, target):
    """Sizes from one element, blocks of zeros (absmax 0), subnormal and huge moments."""
    rng = np.random.default_rng(size)
    param = rng.standard_normal(size).astype(np.float32)
    grad = (rng.standard_normal(size) * scale).astype(np.float32)
    if special is not None:
        grad[: size // 2] = special
    states = {
        "exp_avg": quantization.zeros(size, signed=True, bits=bits),
        "exp_avg_sq": quantization.zeros(size, signed=False, bits=bits),
    }
    expected_param, expected = _reference("adamw", param, grad, states, dict(lr=1e-2, weight_decay=0.1), 1)
    _call("adamw", param, grad, states, dict(lr=1e-2, weight_decay=0.1), 1, target)
    np.testing.assert_array_equal(param, expected_param)
    for state, (absmax, y) in expected.items():
        np.testing.assert_array_equal(states[state].absmax, absmax)
        assert_codes(quantization.element_codes(states[state]), y, states[state].host_map)
    assert widened(narrowed(expected_param, BFLOAT16_BITS), BFLOAT16_BITS).dtype == np.float32


# -- the N-worker step with 8-bit moments -----------------------------------------------------------


def _decentral_reference(decentral, topology, order, params, grads, state, options, target):
    """The float32 step of the N workers from the dequantized moments (the same gossip and
    worker update, in one launch), and per block of each row its absmax and m/absmax."""
    workers, width = params.shape
    moments = [quantization.dequantize(moment).reshape(workers, width) for moment in (state.exp_avg, state.exp_avg_sq)]
    if params.dtype == np.float32:  # the fused float32 step: the same arithmetic in one launch
        reference = decentral.DecentralizedAdamW(
            params.copy(),
            topology=topology,
            order=order,
            target=target,  # its clip factors come from the same sums of squares
            **options,
        )
        dispatch.copy_into(reference.exp_avg, moments[0])
        dispatch.copy_into(reference.exp_avg_sq, moments[1])
        reference.t = state.t
        reference.step(
            grads,
        )
        rows = dispatch.host_array(reference.params)
        moments = [dispatch.host_array(reference.exp_avg), dispatch.host_array(reference.exp_avg_sq)]
    else:  # half-precision rows are rounded after each of the two launches: gossip, then local step (AWC)
        rows = params.astype(np.float32)

        def gossip(rows):
            mixing = decentral.DecentralizedAdamW(rows, topology=topology, order="awc", lr=0.0)
            mixing.t = state.t
            mixing.step(np.zeros_like(rows))
            return widened(narrowed(mixing.params, BFLOAT16_BITS), BFLOAT16_BITS)

        def local(rows):
            for worker in range(workers):
                optim.adamw(
                    rows[worker],
                    grads[worker].astype(np.float32),
                    moments[0][worker],
                    moments[1][worker],
                    step=state.t + 1,
                    lr=options["lr"],
                    weight_decay=options["weight_decay"],
                    decay_mask=options["decay_mask"],
                )
            return widened(narrowed(rows, BFLOAT16_BITS), BFLOAT16_BITS)

        rows = local(gossip(rows)) if order == "awc" else gossip(local(rows))
    expected = []
    block = quantization.BLOCK_SIZES[state.state_bits]
    for moment in moments:
        per_row = -(-width // block)
        padded = np.zeros((workers, per_row * block), np.float32)
        padded[:, :width] = np.abs(moment)
        absmax = padded.reshape(workers, per_row, block).max(axis=2)
        scale = np.repeat(absmax, block, axis=1)[:, :width]
        with np.errstate(invalid="ignore", divide="ignore"):
            expected.append((absmax.reshape(-1), np.where(scale > 0, moment / scale, np.float32(0)).reshape(-1)))
    return rows, expected


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", ["ring", "complete", "one_peer_exponential", "base_graph"])
def test_the_decentralized_step_with_quantized_moments_equals_the_reference(topology, order, dtype, bits, target):
    from steadystep import decentral

    # each case compiles its own gossip and blockwise kernels: every kind and order once (4 bits:
    # the same gossip, so two of them)
    chosen_cases = {("ring", "awc"), ("complete", "atc"), ("base_graph", "atc")}
    if (topology, order) not in chosen_cases or (dtype == "bfloat16" and topology != "ring"):
        pytest.skip("each kind of mixing and each order once (bfloat16 rows on the ring)")
    if bits == 4 and topology == "complete":
        pytest.skip("4-bit moments on two of the cases (the gossip is the 8-bit cases')")
    if target == "cuda" and dtype == "bfloat16":
        pytest.skip("host bfloat16 rows cannot become Numba device arrays")
    if SIMULATOR and (topology, order) not in (("ring", "awc"), ("base_graph", "atc")):
        pytest.skip("the simulator checks two of the cases")
    # rows of whole blocks and a shorter one; for 4 bits of odd length, each row ending in half a byte
    workers, width = 4, (300 if SIMULATOR else 1000) + (1 if bits == 4 else 0)
    rng = np.random.default_rng(6)
    params = rng.standard_normal((workers, width)).astype(np.float32)
    if dtype == "bfloat16":
        params = params.astype(ml_dtypes.bfloat16)
    mask = (np.arange(width) % 3 != 0).astype(np.float32)
    options = dict(lr=1e-2, weight_decay=0.1, decay_mask=mask)
    if dtype == "float32":
        options["max_norm"] = 5.0  # the fused reference clips as the 8-bit step does
    chosen = decentral.base_graph(2) if topology == "base_graph" else decentral.TOPOLOGIES[topology]()  # dense W
    state = decentral.DecentralizedAdamW(
        params, topology=chosen, order=order, state_bits=bits, target=target, **options
    )
    for step in range(STEPS):
        grads = (rng.standard_normal((workers, width)) * 10.0 ** rng.uniform(-2, 0, (workers, width))).astype(
            params.dtype
        )
        rows = dispatch.host_array(state.params).astype(params.dtype)  # on the simulator the rows live there
        expected_params, expected = _decentral_reference(decentral, chosen, order, rows, grads, state, options, target)
        state.step(grads)
        if dtype == "bfloat16":
            np.testing.assert_array_equal(params.view(np.uint16), narrowed(expected_params, BFLOAT16_BITS))
        else:
            np.testing.assert_array_equal(dispatch.host_array(state.params), expected_params)
        for moment, (absmax, y) in zip((state.exp_avg, state.exp_avg_sq), expected):
            np.testing.assert_array_equal(dispatch.host_array(moment.absmax), absmax)
            assert_codes(quantization.element_codes(moment), y, moment.host_map)


def test_an_8bit_decentralized_step_is_prepared_once_for_the_same_gradient_buffer(target, monkeypatch):
    """A training loop writes each step's gradients into one buffer: the 8-bit step then
    launches what it prepared at the first step (it prepared anew every step, from a new flat
    view and a new clip array, 207 µs a step of 4 × 8,192 instead of 145), and gives the bits
    of an optimizer handed a fresh array every step."""
    from steadystep import decentral

    prepared = []  # a preparation makes the step's launch once: counted there
    backend = dispatch.backend(target)
    launch = backend.blockwise_launch
    monkeypatch.setattr(backend, "blockwise_launch", lambda *a, **k: prepared.append(1) or launch(*a, **k))
    rng = np.random.default_rng(8)
    params = rng.standard_normal((4, 600)).astype(np.float32)
    options = dict(topology=decentral.one_peer_exponential(), lr=1e-2, max_norm=2.0, state_bits=8, target=target)
    reused, fresh = (decentral.DecentralizedAdamW(params.copy(), **options) for _ in range(2))
    place = to_device if target == "cuda" else np.array
    buffer = place(np.zeros_like(params))
    for step in range(4):
        grads = (rng.standard_normal(params.shape) * 10.0 ** rng.uniform(-2, 1, params.shape)).astype(np.float32)
        dispatch.backend(target).write(buffer, classify("grads", grads))  # the loop's one buffer
        before = len(prepared)
        reused.step(buffer)
        assert len(prepared) == (1 if step == 0 else before)
        fresh.step(place(grads))
        np.testing.assert_array_equal(dispatch.host_array(reused.params), dispatch.host_array(fresh.params))
        np.testing.assert_array_equal(
            dispatch.host_array(reused.exp_avg.codes), dispatch.host_array(fresh.exp_avg.codes)
        )


# held exactly, and with the step's scratch (one float32 a block of each moment: 0.03 or 0.06 bytes)
@pytest.mark.parametrize("bits, bound, exact", [(8, 6.1, 6 + 8 / 256), (4, 5.13, 5 + 8 / 128)])
def test_64_workers_of_bfloat16_rows_with_quantized_moments_hold_6_03_or_5_06_bytes_a_parameter(
    bits, bound, exact, tmp_path
):
    """The layout that lets one GPU simulate 64 workers of a GPT-2-small-sized model: rows,
    gradients, codes and scales, measured from the buffers (and the step's scratch)."""
    from steadystep import decentral

    if SIMULATOR:
        pytest.skip("CPU-only test")
    workers, width = 64, 1 << 20
    params = np.zeros((workers, width), ml_dtypes.bfloat16)
    grads = np.full((workers, width), 1e-3, ml_dtypes.bfloat16)
    state = decentral.DecentralizedAdamW(params, topology=decentral.one_peer_exponential(), lr=1e-3, state_bits=bits)
    held = sum(buffer.nbytes for buffer in state.buffers.values()) + grads.nbytes
    scratch = state.exp_avg.scratch(2)["new_absmax"].nbytes  # what a step adds (benchmarks.low_bit_cpu steps it)
    per_parameter = (held + scratch) / (workers * width)
    assert per_parameter <= bound, per_parameter
    assert held / (workers * width) == exact


@pytest.mark.parametrize("bits", BITS)
def test_a_quantized_decentralized_state_saves_and_continues_bit_for_bit(bits, tmp_path):
    from steadystep import decentral

    if SIMULATOR:
        pytest.skip("CPU-only test")
    rng = np.random.default_rng(7)
    params = rng.standard_normal((3, 700)).astype(np.float32)
    state = decentral.DecentralizedAdamW(params, topology=decentral.ring(), lr=1e-2, state_bits=bits)
    grads = [rng.standard_normal((3, 700)).astype(np.float32) for _ in range(4)]
    for grad in grads[:2]:
        state.step(grad)
    state.save(tmp_path / "state.npz")
    for grad in grads[2:]:
        state.step(grad)
    resumed = decentral.DecentralizedAdamW.load(tmp_path / "state.npz")
    assert resumed.state_bits == bits and resumed.exp_avg.bits == bits
    for grad in grads[2:]:
        resumed.step(grad)
    np.testing.assert_array_equal(resumed.params, state.params)
    np.testing.assert_array_equal(resumed.exp_avg_sq.codes, state.exp_avg_sq.codes)
    with pytest.raises(ValueError, match="state_bits must be 32"):
        decentral.DecentralizedAdamW(params, topology=decentral.ring(), state_bits=2)
    with pytest.raises(ValueError, match=f"{bits}-bit states take plain gossip"):
        decentral.DecentralizedAdamW(params, topology=decentral.ring(), state_bits=bits, outer=decentral.DiLoCo(4))
    with pytest.raises(TypeError, match=f"{bits}-bit states serve float32"):
        decentral.DecentralizedAdamW(params.astype(np.float64), topology=decentral.ring(), state_bits=bits)
    other = quantization.zeros(3 * 700, signed=True, bits=12 - bits, row_length=700)
    with pytest.raises(ValueError, match=f"exp_avg must be a {bits}-bit QuantizedState"):
        decentral.DecentralizedAdamW(params, topology=decentral.ring(), state_bits=bits, exp_avg=other)


@pytest.mark.parametrize("bits", BITS)
def test_the_trainer_with_quantized_moments_takes_the_float32_first_step_and_quantizes_its_moments(bits, target):
    torch = pytest.importorskip("torch")
    from steadystep import decentral
    from steadystep.torch.decentral import DecentralizedTrainer

    torch.manual_seed(0)
    device = "cuda" if target == "cuda" and not SIMULATOR else "cpu"  # on a GPU the module lives there
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).to(device)
    # one way for both: vmap="auto" times vmap and a loop, and could choose apart (another rounding)
    options = dict(topology=decentral.ring(), lr=1e-2, weight_decay=0.1, target=target, vmap=True)
    ours = DecentralizedTrainer(module, 4, state_bits=bits, **options)
    reference = DecentralizedTrainer(module, 4, **options)
    x, y = torch.randn(4, 8, 16).to(device), torch.randint(0, 3, (4, 8)).to(device)
    ours.step(x, y)
    reference.step(x, y)
    # from zero moments: equal
    np.testing.assert_array_equal(ours.params.cpu().numpy(), reference.params.cpu().numpy())
    (optimizer,) = ours.optimizers
    (float32,) = reference.optimizers
    for moment, exact in zip((optimizer.exp_avg, optimizer.exp_avg_sq), (float32.exp_avg, float32.exp_avg_sq)):
        exact = dispatch.host_array(exact).reshape(4, -1)
        block = quantization.BLOCK_SIZES[bits]
        per_row = -(-exact.shape[1] // block)
        padded = np.zeros((4, per_row * block), np.float32)
        padded[:, : exact.shape[1]] = np.abs(exact)
        absmax = padded.reshape(4, per_row, block).max(axis=2)
        np.testing.assert_array_equal(dispatch.host_array(moment.absmax).reshape(4, -1), absmax)
        scale = np.repeat(absmax, block, axis=1)[:, : exact.shape[1]]
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(scale > 0, exact / scale, np.float32(0)).reshape(-1)
        assert_codes(quantization.element_codes(moment), y, moment.host_map)


@pytest.mark.parametrize("module", ["optim", "decentral"])
def test_every_blockwise_step_says_truly_whether_its_moments_read_the_parameter(module):
    """Blockwise.reads_param lets the CPU's bound check leave the parameter out; the formulas
    themselves, run in plain Python at a few points, show each declaration true: where it says
    no, the moments are the same bits for any parameter; where yes, some parameter moves them."""
    import importlib
    import inspect

    kernels = importlib.import_module(f"steadystep.kernels.{module}")
    for blockwise in kernels.BLOCKWISE:
        step = blockwise.step
        formula = getattr(kernels, step.formula)
        arguments = dict.fromkeys(inspect.signature(formula).parameters, 0.3)
        arguments.update({name: value for name, value in (("grad", 0.7), ("gradient_sign", 1.0)) if name in arguments})

        def moments(param: float) -> list:
            outputs = formula(**{**arguments, "param": param})
            return [outputs[step.updates.index(name)] for name in blockwise.quantized if name in step.updates]

        seen = {repr(moments(param)) for param in (0.5, -3.0, 1e30)}
        assert (len(seen) > 1) == blockwise.reads_param, (module, step.name, seen)
