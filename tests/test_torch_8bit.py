"""The 8-bit and 4-bit drop-ins: each against torch.optim's float32 step on the dequantized
state, the 8-bit AdamW against bitsandbytes' own from the same state and gradients, and their
state_dict both ways."""

import copy
import math

import numpy as np
import pytest
import torch

import steadystep.torch
from steadystep import quantization
from steadystep.torch import low_bit
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="CPU torch drop-ins; the simulator process runs the target tests")


def assert_codes_near(codes, y, qmap, ulps=4):
    """Codes equal the exact nearest to y, except within ``ulps`` float32 ulps of a midpoint
    (the reference's float32 moments may differ from ours by an ulp: torch's own order)."""
    codes = np.asarray(codes).reshape(-1).astype(np.int64)
    y = np.asarray(y, np.float32).reshape(-1)
    exact = np.argmin(np.abs(y.astype(np.float64)[:, None] - qmap.astype(np.float64)[None, :]), axis=1)
    differ = np.flatnonzero(codes != exact)
    if differ.size:
        midpoint = (qmap[codes[differ]].astype(np.float64) + qmap[exact[differ]]) / 2
        assert np.all(np.abs(codes[differ] - exact[differ]) == 1)
        assert np.all(np.abs(y[differ] - midpoint) <= ulps * np.spacing(np.abs(y[differ]))), differ[:5]


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4)
    ).to(dtype)


def _gradients(model, seed, scaler=None):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 64, generator=generator).to(next(model.parameters()).dtype)
    model.zero_grad()
    loss = model(x).square().mean()
    (loss if scaler is None else scaler.scale(loss)).backward()


# (drop-in, its torch.optim counterpart with the same options, the options, the state names)
PAIRS = {
    "AdamW8bit": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), ("exp_avg", "exp_avg_sq")),
    "Adam8bit": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1), ("exp_avg", "exp_avg_sq")),
    "SGD8bit": (torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01), ("momentum_buffer",)),
    "RMSprop8bit": (torch.optim.RMSprop, dict(lr=1e-3, weight_decay=0.01), ("square_avg",)),
    "Adagrad8bit": (torch.optim.Adagrad, dict(lr=1e-2, weight_decay=0.01), ("sum",)),
}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", list(PAIRS))
def test_each_drop_in_equals_torch_on_the_dequantized_state(name, bits):
    """A few steps; before each, torch's optimizer gets our state dequantized: its float32 step
    then gives our parameters (to rounding) and, quantized, our codes and scales."""
    reference_class, options, torch_names = PAIRS[name]
    model = _model()
    ours = getattr(steadystep.torch, name.replace("8bit", f"{bits}bit"))(model.parameters(), **options)
    block = quantization.BLOCK_SIZES[bits]
    for step in range(1, 3):
        _gradients(model, step)
        twin = copy.deepcopy(model)
        reference = reference_class(twin.parameters(), **options)
        for mine, theirs in zip(model.parameters(), twin.parameters()):
            theirs.grad = mine.grad.clone()
            state = ours.state.get(mine)
            if state:  # torch's state from ours: step count and dequantized moments
                torch_state = {"step": torch.tensor(float(state["step"]))}
                for index, torch_name in enumerate(torch_names, start=1):
                    torch_state[torch_name] = _dequantized(state, index).reshape(mine.shape)
                reference.state[theirs] = torch_state
        ours.step()
        reference.step()
        for mine, theirs in zip(model.parameters(), twin.parameters()):
            np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=2e-6, atol=1e-8)
            state = ours.state[mine]
            for index, torch_name in enumerate(torch_names, start=1):
                moment = reference.state[theirs][torch_name].reshape(-1).numpy()
                if state[f"state{index}"].dtype == torch.uint8:
                    absmax = state[f"absmax{index}"].numpy()
                    np.testing.assert_allclose(absmax, _block_max(moment, block), rtol=2e-6)
                    scale = np.repeat(absmax, block)[: moment.size]
                    codes = quantization.element_codes(_state(state, index))
                    assert_codes_near(codes, moment / scale, state[f"qmap{index}"].numpy())
                else:
                    np.testing.assert_allclose(
                        state[f"state{index}"].reshape(-1).numpy(), moment, rtol=2e-6, atol=1e-10
                    )
    assert ours.state[model[0].weight]["state1"].dtype == torch.uint8  # 6144 elements: 8-bit
    assert ours.state[model[0].bias]["state1"].dtype == torch.float32  # 96: float32


def _state(state, index):
    """A drop-in's state ``index`` as a QuantizedState (a view of its tensors)."""
    codes, absmax, qmap = (state[f"{part}{index}"] for part in ("state", "absmax", "qmap"))
    size = codes.numel() if qmap.numel() == 256 else None  # 4 bits: the even sizes of these models
    return quantization.QuantizedState(codes.reshape(-1), absmax, qmap, row_length=size)


def _dequantized(state, index):
    values = state[f"state{index}"]
    if values.dtype != torch.uint8:
        return values.clone()
    return torch.from_numpy(quantization.dequantize(_state(state, index)).reshape(-1))


def _block_max(values, block=256):
    padded = np.zeros(-(-values.size // block) * block, np.float32)
    padded[: values.size] = np.abs(values)
    return padded.reshape(-1, block).max(axis=1)


@pytest.mark.parametrize("bits", [8, 4])
def test_lion_equals_the_functional_lion_on_the_dequantized_state(bits):
    from steadystep import optim

    model = _model()
    ours = getattr(steadystep.torch, f"Lion{bits}bit")(model.parameters(), lr=1e-3, weight_decay=0.1)
    block = quantization.BLOCK_SIZES[bits]
    _gradients(model, 1)
    ours.step()
    _gradients(model, 2)
    weight = model[0].weight
    state = ours.state[weight]
    expected = weight.detach().clone().reshape(-1)
    exp_avg = _dequantized(state, 1)
    optim.lion(expected, weight.grad.reshape(-1).clone(), exp_avg, lr=1e-3, weight_decay=0.1)
    ours.step()
    np.testing.assert_array_equal(weight.detach().reshape(-1).numpy(), expected.numpy())
    scale = np.repeat(state["absmax1"].numpy(), block)[: exp_avg.numel()]
    codes = quantization.element_codes(_state(state, 1))
    assert_codes_near(codes, exp_avg.numpy() / scale, state["qmap1"].numpy(), ulps=1)


def _quantized_weights(optimizer):
    return [state for state in optimizer.state.values() if state["state1"].dtype == torch.uint8]


def test_adamw8bit_agrees_with_bitsandbytes_over_100_steps_both_ways():
    """From the same state and gradients at every step (each optimizer's state loaded from the
    other's, alternately): parameters within float32 rounding, and the codes equal in ≥ 99.9%
    of the elements where bitsandbytes' CPU quantization finds the nearest code. Its CPU build
    looks codes up in 65,536 uniform bins of [−1, 1]: below ~1e−4 of a block's absmax a bin is
    wider than the dynamic map's codes, and it returns the bin's code, not the value's; every
    such difference is checked to be that bin's code."""
    bnb = pytest.importorskip("bitsandbytes")
    functional = pytest.importorskip("bitsandbytes.functional")
    model = _model(seed=1)
    twin = copy.deepcopy(model)
    ours = steadystep.torch.AdamW8bit(model.parameters(), lr=1e-3)
    theirs = bnb.optim.AdamW8bit(twin.parameters(), lr=1e-3)
    luts = {}
    for step in range(100):
        if step % 2:
            ours.load_state_dict(theirs.state_dict())
        else:
            theirs.load_state_dict(ours.state_dict())
        with torch.no_grad():
            for mine, other in zip(model.parameters(), twin.parameters()):
                mine.copy_(other)
        _gradients(twin, step)
        moments = {}
        for mine, other in zip(model.parameters(), twin.parameters()):
            mine.grad = other.grad.clone()
            state = theirs.state.get(other)
            if (
                state and state["state1"].dtype == torch.uint8
            ):  # bitsandbytes' float32 moments, as its CPU step makes them
                m = functional.dequantize_blockwise(
                    state["state1"], absmax=state["absmax1"], code=state["qmap1"], blocksize=256
                ).float()
                v = functional.dequantize_blockwise(
                    state["state2"], absmax=state["absmax2"], code=state["qmap2"], blocksize=256
                ).float()
                m.mul_(0.9).add_(other.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(other.grad, other.grad, value=1 - 0.999)
                moments[other] = (m.reshape(-1).numpy(), v.reshape(-1).numpy())
        before = [other.detach().clone() for other in twin.parameters()]
        ours.step()
        theirs.step()
        for mine, other, start in zip(model.parameters(), twin.parameters(), before):
            a, b = mine.detach().numpy(), other.detach().numpy()
            update = np.abs(b - start.numpy())
            # the two evaluate m in another order (torch's lerp; m·β1 + (1 − β1)·g), an ulp apart,
            # which is more of a small m where its terms cancel
            assert np.all(np.abs(a - b) <= 2 * np.spacing(np.abs(b)) + 1e-3 * update), (step, mine.shape)
            if other not in moments:
                continue
            for index in (1, 2):
                qmap = theirs.state[other][f"qmap{index}"].numpy()
                lut = luts.setdefault(index, _bitsandbytes_lut(qmap))
                values = moments[other][index - 1]
                absmax = theirs.state[other][f"absmax{index}"].numpy()
                scaled = values / np.repeat(absmax, 256)[: values.size]
                binned = _bitsandbytes_codes(values, absmax, lut)
                their_codes = theirs.state[other][f"state{index}"].reshape(-1).numpy().astype(np.int64)
                my_codes = ours.state[mine][f"state{index}"].reshape(-1).numpy().astype(np.int64)
                assert (binned == their_codes).mean() >= 0.999  # the model of their quantization holds
                nearest = np.argmin(np.abs(scaled.astype(np.float64)[:, None] - qmap[None, :]), axis=1)
                resolved = binned == nearest
                assert (my_codes[resolved] == their_codes[resolved]).mean() >= 0.999, (step, index)
                assert resolved.mean() > 0.9


def _bitsandbytes_lut(qmap):
    """bitsandbytes' CPU lookup (csrc/cpu_ops.cpp): 65,536 bins of [−1, 1], each the code of the
    first float32 midpoint not below the bin's value."""
    midpoints = (np.float32(0.5) * (qmap[:-1] + qmap[1:])).astype(np.float32)
    values = (np.float32(-1.0) + (np.float32(2.0) * np.arange(65536).astype(np.float32)) / np.float32(65535)).astype(
        np.float32
    )
    return np.searchsorted(midpoints, values, side="left")


def _bitsandbytes_codes(values, absmax, lut):
    inverse = (np.float32(1.0) / absmax).astype(np.float32)
    scaled = np.clip((values * inverse[np.arange(values.size) // 256]).astype(np.float32), -1, 1)
    index = ((scaled + np.float32(1)) * np.float32(0.5) * np.float32(65535) + np.float32(0.5)).astype(np.uint16)
    return lut[index].astype(np.int64)


def _snapshot(optimizer, model):
    return copy.deepcopy(optimizer.state_dict()), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit"])
def test_state_dict_round_trips_and_a_resumed_run_equals_the_uninterrupted_one(name):
    model = _model()
    optimizer = getattr(steadystep.torch, name)(model.parameters(), lr=1e-2)
    for step in range(3):
        _gradients(model, step)
        optimizer.step()
    saved, params = _snapshot(optimizer, model)
    assert set(saved["state"][0]) == {"step", low_bit.QUANT_STATE_KEY}
    for step in range(3, 6):
        _gradients(model, step)
        optimizer.step()
    resumed_model = _model()
    with torch.no_grad():
        for target, value in zip(resumed_model.parameters(), params):
            target.copy_(value)
    resumed = getattr(steadystep.torch, name)(resumed_model.parameters(), lr=1e-2)
    resumed.load_state_dict(saved)
    for step in range(3, 6):
        _gradients(resumed_model, step)
        resumed.step()
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    copied = copy.deepcopy(resumed)
    assert copied.state_dict()["state"][0]["step"] == 6


@pytest.mark.parametrize("bits", [8, 4])
def test_param_groups_schedulers_and_gradscaler_take_their_usual_paths(bits):
    from steadystep import optim

    model = _model()
    groups = [{"params": [model[0].weight], "lr": 1e-2}, {"params": list(model.parameters())[1:], "lr": 0.0}]
    optimizer = getattr(steadystep.torch, f"AdamW{bits}bit")(groups, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    frozen = [p.detach().clone() for p in list(model.parameters())[1:]]
    weight = model[0].weight
    expected = weight.detach().clone().reshape(-1)
    m = quantization.zeros(expected.numel(), signed=True, bits=bits)
    v = quantization.zeros(expected.numel(), signed=False, bits=bits)
    taken = 0
    for step in range(4):
        _gradients(model, step, scaler)
        if step == 2:
            weight.grad[0, 0] = math.inf  # skipped by the scaler: nothing changes
        before = weight.detach().clone()
        lr = optimizer.param_groups[0]["lr"]
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if step == 2:
            torch.testing.assert_close(weight.detach(), before, rtol=0, atol=0)
            continue
        taken += 1
        grad = weight.grad.reshape(-1).numpy().copy()  # unscaled in place by scaler.step
        optim.adamw(expected.numpy(), grad, m, v, step=taken, lr=lr, weight_decay=0.0)
        np.testing.assert_array_equal(weight.detach().reshape(-1).numpy(), expected.numpy())
    for p, value in zip(list(model.parameters())[1:], frozen):
        torch.testing.assert_close(p.detach(), value, rtol=0, atol=0)
    assert optimizer.state[weight]["step"] == 3


@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, 8), (torch.float16, 8), (torch.bfloat16, 4)])
def test_half_precision_parameters_step_in_float32_and_round_once(dtype, bits):
    from steadystep import optim

    model = _model(dtype)
    optimizer = getattr(steadystep.torch, f"AdamW{bits}bit")(model.parameters(), lr=1e-2)
    weight, bias = model[0].weight, model[0].bias
    _gradients(model, 0)
    wide = weight.detach().float().reshape(-1).numpy().copy()
    m = quantization.zeros(wide.size, signed=True, bits=bits)
    v = quantization.zeros(wide.size, signed=False, bits=bits)
    optim.adamw(wide, weight.grad.float().reshape(-1).numpy(), m, v, step=1, lr=1e-2)
    bias_wide = bias.detach().float().clone()
    reference = torch.optim.AdamW([bias_wide], lr=1e-2)
    bias_wide.grad = bias.grad.float()
    reference.step()
    optimizer.step()
    np.testing.assert_array_equal(weight.detach().reshape(-1).float().numpy(), torch.from_numpy(wide).to(dtype).float())
    torch.testing.assert_close(bias.detach(), bias_wide.detach().to(dtype), rtol=0, atol=0)
    np.testing.assert_array_equal(optimizer.state[weight]["state1"].reshape(-1).numpy(), m.codes)
    assert optimizer.state[bias]["state1"].dtype == torch.float32


@pytest.mark.parametrize("bits, expected, bound", [(8, 2 + 8 / 256, 2.04), (4, 1 + 8 / 128, 1.07)])
def test_state_memory_is_2_03_bytes_a_parameter_for_adamw_and_1_06_with_4_bits(bits, expected, bound):
    model = torch.nn.Linear(1024, 1024, bias=False)
    optimizer = getattr(steadystep.torch, f"AdamW{bits}bit")(model.parameters())
    model(torch.ones(2, 1024)).sum().backward()
    optimizer.step()
    state = optimizer.state[model.weight]
    per_parameter = sum(
        state[key].numel() * state[key].element_size() for key in ("state1", "state2", "absmax1", "absmax2")
    )
    assert per_parameter / model.weight.numel() == expected  # 2.03125, 1.0625
    assert low_bit.state_bytes(optimizer) / model.weight.numel() <= bound  # with the two shared maps


@pytest.mark.parametrize("bits", [8, 4])
def test_a_non_finite_gradient_is_refused_with_nothing_written(bits):
    model = _model()
    optimizer = getattr(steadystep.torch, f"AdamW{bits}bit")(model.parameters())
    _gradients(model, 0)
    optimizer.step()
    saved, params = _snapshot(optimizer, model)
    _gradients(model, 1)
    model[0].weight.grad[3, 3] = math.nan
    with pytest.raises(ValueError, match="nothing was written"):
        optimizer.step()
    state = optimizer.state[model[0].weight]
    torch.testing.assert_close(model[0].weight.detach(), params[0], rtol=0, atol=0)
    assert state["step"] == 1
    inner = saved["state"][0][low_bit.QUANT_STATE_KEY]
    torch.testing.assert_close(state["state1"], inner["state1"], rtol=0, atol=0)
    torch.testing.assert_close(state["absmax2"], inner["absmax2"], rtol=0, atol=0)


def _bad(saved, change):
    saved = copy.deepcopy(saved)
    change(saved["state"][0][low_bit.QUANT_STATE_KEY])
    return saved


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(state1=s["state1"][:-1]), "state1 must hold 6144 bytes of 8-bit codes"),
        (lambda s: s.update(absmax1=s["absmax1"][:-1]), "absmax must be a float32 array of 24 values"),
        (lambda s: s.update(absmax2=s["absmax2"].double()), "absmax must be a float32 array"),
        (lambda s: s["absmax1"].__setitem__(0, math.inf), "absmax must hold finite values"),
        (lambda s: s.update(qmap1=s["qmap1"].flip(0)), "qmap must be increasing"),
        (lambda s: s.update(qmap1=s["qmap2"]), "takes either sign but qmap1 starts at 0"),
        (lambda s: s.update(state2=torch.zeros(96, 64)), "mixes quantized and float32 states"),
        (lambda s: s.pop("absmax2"), "needs absmax2 and qmap2"),
    ],
)
def test_a_state_dict_that_does_not_fit_is_refused_and_changes_nothing(change, message):
    model = _model()
    optimizer = steadystep.torch.AdamW8bit(model.parameters())
    _gradients(model, 0)
    optimizer.step()
    saved, _ = _snapshot(optimizer, model)
    with pytest.raises(ValueError, match=message):
        optimizer.load_state_dict(_bad(saved, change))
    now = optimizer.state_dict()["state"][0][low_bit.QUANT_STATE_KEY]
    torch.testing.assert_close(now["state1"], saved["state"][0][low_bit.QUANT_STATE_KEY]["state1"], rtol=0, atol=0)


def test_a_state_dict_of_the_other_width_is_refused_and_changes_nothing():
    model = _model()
    eight, four = steadystep.torch.AdamW8bit(model.parameters()), steadystep.torch.AdamW4bit(model.parameters())
    _gradients(model, 0)
    eight.step()
    four.step()
    saved_eight, saved_four = copy.deepcopy(eight.state_dict()), copy.deepcopy(four.state_dict())
    with pytest.raises(ValueError, match="state1 must hold 3072 bytes of 4-bit codes .*AdamW4bit keeps 4-bit"):
        four.load_state_dict(saved_eight)
    with pytest.raises(ValueError, match="state1 must hold 6144 bytes of 8-bit codes"):
        eight.load_state_dict(saved_four)
    inner = dict(saved_four["state"][0][low_bit.QUANT_STATE_KEY])
    inner["qmap1"] = quantization.dynamic_map(True)  # 8-bit map beside 4-bit codes
    forged = copy.deepcopy(saved_four)
    forged["state"][0][low_bit.QUANT_STATE_KEY] = {**inner, "qmap1": torch.from_numpy(inner["qmap1"].copy())}
    with pytest.raises(ValueError, match="qmap1 must be a map of 16 values \\(AdamW4bit keeps 4-bit codes\\)"):
        four.load_state_dict(forged)
    now = four.state_dict()["state"][0][low_bit.QUANT_STATE_KEY]
    torch.testing.assert_close(now["state1"], saved_four["state"][0][low_bit.QUANT_STATE_KEY]["state1"], rtol=0, atol=0)
