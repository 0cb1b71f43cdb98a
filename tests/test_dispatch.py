"""Where calls run, what they accept, and how they fail (before writing anything)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

import steadystep
from tests.conftest import SIMULATOR
from tests.helpers import ROOT, SimulatedDeviceArray, run_python, to_device, to_host

sgd_update = steadystep.gradient_descent.sgd_update
grad_mul = steadystep.autograd_ops.grad_mul
ns = steadystep.numerical_stability


# -- torch CPU tensors ---------------------------------------------------------------------

torch = pytest.importorskip("torch") if not SIMULATOR else None


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
def test_a_torch_dtype_numpy_cannot_view_is_named_with_advice():
    with pytest.raises(TypeError, match="x has dtype torch.float8_e4m3fn, which NumPy cannot view .*cast it to"):
        ns.softplus(torch.ones(3, dtype=torch.float8_e4m3fn))
    # a float32 tensor NumPy cannot view for another reason gets no advice to cast it to float32
    with pytest.raises(TypeError, match="x \\(Tensor\\) cannot be viewed as a NumPy array: .*meta"):
        ns.softplus(torch.empty(3, device="meta"))


def _softmax_into(rows):
    ns.softmax(rows, out=rows)


def _decentralized_step(params):
    steadystep.decentral.DecentralizedAdamW(params, topology=steadystep.decentral.ring(), lr=0.1).step(
        torch.ones_like(params)
    )


def _functional_decentralized_step(params):
    steadystep.decentral.step(
        params,
        torch.ones_like(params),
        torch.zeros_like(params),
        torch.zeros_like(params),
        t=0,
        topology=steadystep.decentral.ring(),
    )


def _model_gradient_into(out):
    model = steadystep.models.softmax_regression(features=2, classes=2)
    model.loss_and_grad(torch.zeros(2, model.dim, dtype=out.dtype), np.eye(2), np.array([0, 1]), out=out)


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
@pytest.mark.parametrize(
    "write, shape",
    [
        (lambda y: ns.softplus(y, out=y), (4,)),
        (_softmax_into, (2, 3)),
        (lambda flag: steadystep.optim.found_nonfinite(torch.ones(5, dtype=flag.dtype), out=flag), (1,)),
        (_decentralized_step, (2, 5)),
        (_functional_decentralized_step, (2, 5)),
        (_model_gradient_into, (2, 128)),
    ],
    ids=[
        "elementwise out",
        "row out",
        "found_nonfinite out",
        "DecentralizedAdamW",
        "decentral.step",
        "model gradient out",
    ],
)
def test_every_write_into_a_torch_tensor_counts_as_its_in_place_change(write, shape):
    """As torch's own in-place ops (and the optimizer steps here) do: autograd refuses a graph
    that saved the tensor before the write, instead of silently using the new values."""
    written = torch.randn(*shape, dtype=torch.float64)
    weight = torch.ones_like(written, requires_grad=True)
    graph = (weight * written).sum()  # saves ``written`` for weight's gradient
    write(written)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        graph.backward()


@pytest.mark.skipif(SIMULATOR, reason="the CPU target's launch policy")
def test_large_elementwise_and_row_calls_run_in_parallel_with_the_whole_loops_results(monkeypatch):
    from steadystep.cpu import backend as launch
    from steadystep.cpu import parallel

    parallel_launches = []
    monkeypatch.setattr(  # the parts of a kernel's loop at once
        launch,
        "in_parallel",
        lambda address, *arguments: (parallel_launches.append(address), parallel.in_parallel(address, *arguments)),
    )
    x = np.random.default_rng(4).standard_normal(2 * launch.PARALLEL_MIN)
    results = [ns.softplus(x), ns.logsumexp(x.reshape(-1, 512)), sgd_update(x, x, 0.1, out=np.empty_like(x))]
    assert len(parallel_launches) == 3
    ns.softplus(x[: launch.PARALLEL_MIN - 1])
    assert len(parallel_launches) == 3  # small calls skip the threads' start-up
    monkeypatch.setattr(launch, "PARALLEL_MIN", 1 << 62)
    serial = [ns.softplus(x), ns.logsumexp(x.reshape(-1, 512)), sgd_update(x, x, 0.1, out=np.empty_like(x))]
    assert len(parallel_launches) == 3
    assert all(a.tobytes() == b.tobytes() for a, b in zip(results, serial))


@pytest.mark.skipif(SIMULATOR, reason="the CPU target's parallel kernels")
@pytest.mark.parametrize("entry", steadystep.catalog(), ids=lambda entry: f"{entry['module']}.{entry['function']}")
def test_every_cpu_kernel_gives_the_same_bits_in_parts_as_whole(entry, monkeypatch):
    """Large calls run the parts of a kernel's loop at once (cpu/parallel.py), small ones the
    whole loop in one call: each formula must run both ways (a user would meet a failure of
    the parallel launch only with a large array) and give the same bits. Row formulas in
    float32 only: their float64 kernels come from the same template, and each takes seconds to
    compile."""
    from steadystep.cpu import backend as launch

    function = getattr(getattr(steadystep, entry["module"]), entry["function"])
    rng = np.random.default_rng(0)
    for dtype in (np.float32,) if entry["kind"] == "row" else (np.float32, np.float64):
        if entry["kind"] == "row":
            arguments = [rng.standard_normal((launch.PARALLEL_MIN // 256, 512)).astype(dtype)]
        else:
            arguments = [rng.standard_normal(launch.PARALLEL_MIN).astype(dtype) for _ in entry["parameters"]]
        with np.errstate(all="ignore"):
            parallel = np.asarray(function(*arguments))
            monkeypatch.setattr(launch, "PARALLEL_MIN", 1 << 62)
            serial = np.asarray(function(*arguments))
        monkeypatch.undo()
        assert parallel.dtype == dtype and parallel.tobytes() == serial.tobytes()


@pytest.mark.skipif(SIMULATOR, reason="the CPU target's parallel launch")
def test_parallel_launches_compiled_in_one_process_run_from_the_cache_in_the_next(tmp_path):
    """The launch of a kernel's parts (cpu/parallel.py) is compiled per kind of arguments and
    cached; the loop it hands the parts to is compiled once and cached apart, and called by
    address. A launch compiled in a process that loaded that loop from the cache must run from
    the cache in a later one, with the same bits as the whole loop. Three fresh processes on an
    empty cache: float32 (compiles the loop), float64 (loads it), float64 again (loads both)."""
    code = (
        "import sys; import numpy as np\n"
        "from steadystep import numerical_stability as ns\n"
        "from steadystep.cpu import backend\n"
        "x = np.linspace(-30, 30, 3 * backend.PARALLEL_MIN).astype(sys.argv[1])\n"
        "parts = ns.softplus(x)\n"
        "backend.PARALLEL_MIN = 1 << 62\n"
        "print(parts.tobytes() == ns.softplus(x).tobytes())\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for dtype in ("float32", "float64", "float64"):
        done = subprocess.run([sys.executable, "-c", code, dtype], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0 and done.stdout.split() == ["True"], (dtype, done.returncode, done.stderr[-2000:])


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
def test_torch_cpu_tensors_are_updated_in_place():
    param = torch.linspace(-1, 1, 10)
    grad = torch.full((10,), 0.5)
    expected = param - 0.25 * grad
    alias = param
    sgd_update(param, grad, 0.25, out=param)
    assert alias.data_ptr() == param.data_ptr()
    assert torch.equal(param, expected)


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
def test_torch_inputs_give_torch_outputs_of_the_same_dtype():
    result = grad_mul(torch.ones(3, dtype=torch.float32), 2.5)
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    assert result.tolist() == [2.5, 2.5, 2.5]


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda weight: ns.softplus(weight), "x"),
        (lambda weight: grad_mul(torch.ones(4), weight), "upstream"),
        (lambda weight: ns.logsumexp(weight.reshape(2, 2)), "xs"),
        (lambda weight: ns.softmax(torch.ones(2, 2), out=weight.reshape(2, 2)), "out"),
        (lambda weight: sgd_update(weight, torch.ones(4), 0.1, out=weight), "param"),
        (lambda weight: steadystep.optim.sum_of_squares(weight), "x"),
    ],
    ids=["elementwise", "second operand", "row", "row out", "in-place update", "sum of squares"],
)
def test_torch_tensors_that_require_grad_are_refused_while_autograd_records(call, name):
    """A result would carry no gradient back (a penalty built from it would silently train
    nothing), so, as torch's numpy() and out= ops, a tracked tensor is refused by name while
    grad mode is on; under torch.no_grad() or detached it is read in place, without copies."""
    weight = torch.ones(4, requires_grad=True)
    with pytest.raises(TypeError, match=f"^{name} is a torch tensor that requires grad.*{name}.detach()"):
        call(weight)
    assert weight.tolist() == [1.0] * 4 and weight.grad_fn is None

    def outcome(weight):
        result = call(weight)
        return torch.as_tensor(result).detach().clone(), weight.detach().clone()

    with torch.no_grad():
        tracked = outcome(torch.ones(4, requires_grad=True))
    assert all(map(torch.equal, tracked, outcome(torch.ones(4))))


# -- rejected input: each error names the argument and leaves out untouched -----------------


def assert_untouched(out, before):
    np.testing.assert_array_equal(to_host(out), before)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ((np.ones(3), np.ones(3), 1j), TypeError, "lr is complex"),
        ((np.ones(3), np.ones(3, np.complex128), 0.1), TypeError, "grad is complex"),
        ((np.ones(3, np.longdouble), np.ones(3), 0.1), TypeError, "param has dtype float(128|96)"),
        ((np.ones(3), np.array(["a", "b", "c"]), 0.1), TypeError, "grad has unsupported dtype <U1"),
        ((np.ones(3), None, 0.1), TypeError, "grad is None"),
        (
            (np.ones(3), [np.ones(3), np.ones(2)], 0.1),
            TypeError,
            "grad is a list of 2 items that do not form one array .*Arena.pack puts many tensors in one buffer",
        ),
        (
            (np.ones(3), np.ma.masked_array(np.ones(3), mask=[0, 1, 0]), 0.1),
            TypeError,
            "grad is a masked array, whose mask steadystep would ignore",
        ),
        # a model's parameters() or gradients as a generator: NumPy made a 0-d array of the generator
        ((np.ones(3), (g for g in [np.ones(3)]), 0.1), TypeError, "grad is a generator; pass an array .*Arena.pack"),
        ((np.ones(3), np.ones(4), 0.1), ValueError, "shapes do not broadcast: param \\(3,\\), grad \\(4,\\)"),
        ((np.ones(3), np.ones(3), -(10**400)), OverflowError, "lr is an integer beyond float64's range .* -math.inf"),
    ],
)
def test_bad_arguments_are_named(arguments, error, message, target):
    out = np.full(3, 7.0)
    with pytest.raises(error, match=message):
        sgd_update(*arguments, out=out, target=target)
    assert_untouched(out, np.full(3, 7.0))


@pytest.mark.parametrize(
    "out, error, message",
    [
        (np.zeros(4), ValueError, "out has shape \\(4,\\); the result of shape \\(3,\\)"),
        (np.zeros(3, np.float32), TypeError, "out has dtype float32; the result is float64"),
        (1.0, TypeError, "out must be an array"),
        ([0.0, 0.0, 0.0], TypeError, "out is a list, which can only be read as a copy"),
        ([0.0, 0.0], TypeError, "out is a list, which can only be read as a copy"),  # not its shape
    ],
)
def test_bad_out_is_rejected_before_any_write(out, error, message, target):
    before = np.array(out, copy=True)
    with pytest.raises(error, match=message):
        sgd_update(np.ones(3), np.ones(3), 0.1, out=out, target=target)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("case", ["column", "transposed rows", "every other, overlapping an input"])
def test_a_strided_out_gets_numpys_result_on_the_cpu(case):
    """As a NumPy ufunc writes a strided out (a column of a matrix, a transposed view); the
    GPU kernels write contiguous memory only, and say so."""
    rng = np.random.default_rng(7)
    if case == "column":
        out, expected = np.zeros((5, 3)), np.zeros((5, 3))
        x = rng.normal(size=5)
        sgd_update(x, x, 0.1, out=out[:, 1])
        expected[:, 1] = x - 0.1 * x
    elif case == "transposed rows":
        out, expected = np.zeros((3, 4)), np.zeros((3, 4))
        rows = rng.normal(size=(4, 3))
        ns.softmax(rows, out=out.T)
        expected.T[...] = special.softmax(rows, axis=-1)
    else:
        out = rng.normal(size=8)
        expected = out.copy()
        expected[::2] = out[::2] - 1.0 * out[1::2]
        sgd_update(out[::2], out[1::2], 1.0, out=out[::2])
    np.testing.assert_allclose(out, expected, rtol=1e-15, atol=0)


def test_read_only_out_is_rejected(target):
    out = np.zeros(3)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        sgd_update(np.ones(3), np.ones(3), 0.1, out=out, target=target)
    assert_untouched(out, np.zeros(3))


def _overlapping(line):
    """(input, out) pairs over one buffer whose kernels, without a copy, would read values
    they had already overwritten."""
    return {
        "shifted up": (line[:-1], line[1:]),
        "shifted down": (line[1:], line[:-1]),
        "reversed": (line[::-1], line),
        "broadcast": (line[:1], line),
    }


@pytest.mark.parametrize("case", ["shifted up", "shifted down", "reversed", "broadcast"])
def test_out_overlapping_an_input_gives_numpys_result(case, target):
    line = np.linspace(-1.0, 1.0, 40)
    param, out = _overlapping(line)[case]
    grad = np.arange(out.size, dtype=np.float64)
    expected = np.copy(param) - 0.5 * grad  # NumPy copies an overlapping input first
    sgd_update(param, grad, 0.5, out=out, target=target)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("case", ["shifted up", "shifted down"])
def test_a_repeated_call_whose_out_overlaps_an_input_gives_numpys_result(case, target):
    """The first call prepares the path of its arguments' kinds on views of separate buffers; the
    second, of the same kinds on one buffer, takes that path, which must still see the overlap."""
    line = np.linspace(-1.0, 1.0, 40)
    param, out = _overlapping(line)[case]
    grad = np.arange(out.size, dtype=np.float64)
    first, second = np.zeros((2, 40))
    sgd_update(first[1:], grad, 0.5, out=second[1:], target=target)
    expected = np.copy(param) - 0.5 * grad
    sgd_update(param, grad, 0.5, out=out, target=target)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("case", ["shifted up", "shifted down"])
def test_gpu_out_overlapping_an_input_gives_numpys_result(case, gpu):
    line = np.linspace(-1.0, 1.0, 40)
    param, out = _overlapping(line)[case]
    expected = np.copy(param) - 0.5
    sgd_update(SimulatedDeviceArray(param), 1.0, 0.5, out=SimulatedDeviceArray(out))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_row_out_overlapping_its_input_gives_the_rows_of_a_copy(device, target):
    if device and target != "cuda":
        pytest.skip("device arrays run on target cuda")
    grid = np.random.default_rng(5).normal(size=(6, 9))
    xs, out = grid[:-1], grid[1:]
    expected = special.softmax(xs, axis=-1)
    wrap = SimulatedDeviceArray if device else (lambda array: array)
    ns.softmax(wrap(xs), out=wrap(out), target=target)
    np.testing.assert_allclose(out, expected, rtol=1e-14)


@pytest.mark.parametrize("function", ["softmax", "log_softmax", "normalize_probs"])
def test_row_functions_in_place(function, target):
    xs = np.abs(np.random.default_rng(6).normal(size=(4, 33)))
    expected = getattr(ns, function)(xs, target=target)
    assert getattr(ns, function)(xs, out=xs, target=target) is xs
    np.testing.assert_array_equal(xs, expected)


def test_wrong_argument_count_is_a_type_error():
    with pytest.raises(TypeError, match="lr"):
        sgd_update(1.0, 2.0)
    with pytest.raises(TypeError):
        sgd_update(1.0, 2.0, 3.0, 4.0)


def test_unknown_target_is_rejected():
    with pytest.raises(ValueError, match="target must be one of"):
        sgd_update(1.0, 2.0, 0.1, target="tpu")
    with pytest.raises(ValueError, match="target must be one of"):
        with steadystep.use_target("gpu"):
            pass


def test_host_and_device_arrays_mixed_are_rejected_without_copying():
    device = SimulatedDeviceArray(np.ones(3))
    out = np.full(3, 5.0)
    with pytest.raises(
        TypeError, match="different devices: grad on the GPU, param, out|different devices: grad on the GPU, param"
    ):
        sgd_update(np.ones(3), device, 0.1, out=out)
    assert_untouched(out, np.full(3, 5.0))


class OnGpu(SimulatedDeviceArray):
    """A GPU array that says which device it lives on, as a torch tensor does (device.index)."""

    def __init__(self, array: np.ndarray, index: int):
        super().__init__(array)
        self.device = type("Device", (), {"type": "cuda", "index": index})()


@pytest.mark.skipif(
    not SIMULATOR, reason="its GPU arrays are host memory, which only the simulator reads as device memory"
)
def test_arrays_on_another_gpu_are_refused_before_anything_is_written(target):
    # Numba would fail inside with CUDA_ERROR_INVALID_VALUE (numba issue 4092), or worse
    # reach another GPU's memory from kernels and buffers of this one.
    param, grad, buffer = OnGpu(np.ones(8), 1), OnGpu(np.ones(8), 1), OnGpu(np.zeros(8), 1)
    with pytest.raises(
        ValueError,
        match=r"param lives on cuda:1, but steadystep launches on this thread's CUDA "
        r"device, cuda:0.*torch.cuda.set_device\(1\)",
    ):
        steadystep.optim.sgd(param, grad, buffer, step=1, lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="different GPUs: param on cuda:0, grad on cuda:1"):
        sgd_update(OnGpu(np.ones(8), 0), grad, 0.1)
    sgd_update(OnGpu(np.ones(8), 0), OnGpu(np.ones(8), 0), 0.1, out=OnGpu(np.ones(8), 0))  # the current device is fine
    assert_untouched(param.array, np.ones(8))
    assert_untouched(buffer.array, np.zeros(8))


def test_cpu_target_refuses_gpu_arrays():
    with pytest.raises(TypeError, match="target='cpu' but param live on the GPU"):
        sgd_update(SimulatedDeviceArray(np.ones(3)), 1.0, 0.1, target="cpu")


def test_dlpack_only_gpu_objects_are_rejected_with_advice():
    class DLPackOnly:
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(TypeError, match="only exposes DLPack"):
        sgd_update(DLPackOnly(), 1.0, 0.1)


def test_use_target_context_forces_and_restores(target):
    with steadystep.use_target(target):
        assert sgd_update(1.0, 0.5, 0.1) == 0.95
    assert sgd_update(1.0, 0.5, 0.1) == 0.95


# -- the GPU path: zero-copy, in place, no casts --------------------------------------------


@pytest.fixture
def gpu(target):
    if target != "cuda":
        pytest.skip("runs on target cuda (the simulator, or a GPU)")


def test_gpu_arrays_are_updated_in_place(gpu):
    param = to_device(np.linspace(-1, 1, 12))
    grad = to_device(np.full(12, 0.5))
    expected = np.linspace(-1, 1, 12) - 0.1 * 0.5
    returned = sgd_update(param, grad, 0.1, out=param)
    assert returned is param
    np.testing.assert_array_equal(to_host(param), expected)


class RequiresGrad:
    """Stands in for a torch CUDA tensor that requires grad: torch refuses such a tensor the
    __cuda_array_interface__ (RuntimeError) and hands it out through ``detach()``."""

    def __init__(self, device_array):
        self.device_array = device_array

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    def detach(self):
        return self.device_array


def test_gpu_tensors_that_require_grad_are_read_through_detach(gpu):
    from steadystep import decentral, optim

    param = SimulatedDeviceArray(np.linspace(-1, 1, 12))
    returned = sgd_update(RequiresGrad(param), to_device(np.full(12, 0.5)), 0.1, out=RequiresGrad(param))
    assert isinstance(returned, RequiresGrad)
    np.testing.assert_array_equal(param.array, np.linspace(-1, 1, 12) - 0.05)
    state = [SimulatedDeviceArray(np.zeros(12)) for _ in range(2)]
    optim.adamw(RequiresGrad(param), to_device(np.ones(12)), *state, step=1, lr=0.1, weight_decay=0.0)
    np.testing.assert_allclose(param.array, np.linspace(-1, 1, 12) - 0.05 - 0.1 / (1 + 1e-8), rtol=1e-12)
    np.testing.assert_array_equal(steadystep.dispatch.host_array(RequiresGrad(param)), param.array)
    np.testing.assert_allclose(decentral.mean_model(RequiresGrad(SimulatedDeviceArray(np.ones((2, 3))))), np.ones(3))


def test_gpu_single_element_operands_broadcast(gpu):
    result = grad_mul(to_device(np.arange(6.0)), to_device(np.array([3.0])))
    np.testing.assert_array_equal(to_host(result), np.arange(6.0) * 3.0)


def test_gpu_partial_broadcasting_is_refused(gpu):
    with pytest.raises(ValueError, match="other has shape \\(3, 1\\); on the GPU"):
        grad_mul(to_device(np.ones((3, 1))), to_device(np.ones((1, 4))))


def test_gpu_dtype_mismatch_is_refused_not_cast(gpu):
    out = to_device(np.zeros(3, np.float64))
    with pytest.raises(TypeError, match="other is float32 on the GPU but the call computes in float64"):
        grad_mul(to_device(np.ones(3, np.float32)), to_device(np.ones(3, np.float64)), out=out)
    np.testing.assert_array_equal(to_host(out), np.zeros(3))


def test_gpu_strided_out_is_refused(gpu):
    memory = np.zeros(6)
    with pytest.raises(ValueError, match="out must be C-contiguous to be written in place"):
        grad_mul(to_device(np.ones(3)), 2.0, out=SimulatedDeviceArray(memory[::2]))
    np.testing.assert_array_equal(memory, np.zeros(6))


def test_gpu_read_only_out_is_refused(gpu):
    out = SimulatedDeviceArray(np.zeros(3), readonly=True)
    with pytest.raises(ValueError, match="out is read-only"):
        grad_mul(to_device(np.ones(3)), 2.0, out=out)
    np.testing.assert_array_equal(out.array, np.zeros(3))


def test_gpu_arrays_are_synchronised_only_for_a_user_stream(gpu, monkeypatch):
    """An interface-v3 array (CuPy) names the stream it was written on; our kernels run on the
    default stream, which already waits for the two default streams (1, 2), so only a user
    stream costs a host synchronisation. Checked on the real-GPU branch with a stand-in."""
    from types import SimpleNamespace

    from steadystep.cuda import backend as launch

    synchronised = []
    monkeypatch.setattr(launch.config, "ENABLE_CUDASIM", False)
    monkeypatch.setattr(
        launch,
        "cuda",
        SimpleNamespace(from_cuda_array_interface=lambda interface, owner, sync: synchronised.append(sync)),
    )
    for stream in (None, 1, 2, 0x7F3A2C001230):
        interface = {"shape": (3,), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3, "stream": stream}
        launch._as_device_array(SimpleNamespace(__cuda_array_interface__=interface))
    assert synchronised == [False, False, False, True]


@pytest.mark.skipif(not SIMULATOR, reason="counts the reads of a simulated GPU array (host memory)")
def test_a_gpu_call_reads_each_arrays_cuda_interface_once(gpu):
    """A torch CUDA tensor builds its __cuda_array_interface__ anew at every read (µs each):
    classification reads it once and the launch reuses that (a call read it 8 to 13 times)."""
    reads = []

    class Counted(SimulatedDeviceArray):
        @property
        def __cuda_array_interface__(self):
            reads.append(self)
            return SimulatedDeviceArray.__cuda_array_interface__.fget(self)

    rng = np.random.default_rng(3)
    x, g, out = (Counted(rng.standard_normal(1000).astype(np.float32)) for _ in range(3))
    sgd_update(x, g, 0.1, out=out)
    assert len(reads) == 3  # x, g and out, once each
    np.testing.assert_array_equal(out.array, x.array - np.float32(0.1) * g.array)
    rows, written = Counted(rng.standard_normal((4, 50)).astype(np.float32)), Counted(np.empty((4, 50), np.float32))
    reads.clear()
    ns.softmax(rows, out=written)
    assert len(reads) == 2
    np.testing.assert_allclose(written.array, ns.softmax(rows.array), rtol=1e-6)


def test_a_gpu_launch_is_configured_once_without_numbas_occupancy_warning(gpu, monkeypatch):
    """Numba warns at configuring a launch of under 128 blocks, which every small tensor's is
    (an H200 run printed it from every demo and benchmark): the package configures each launch
    once, with that warning silenced, and other warnings still shown."""
    import warnings

    from numba.cuda.core.errors import NumbaPerformanceWarning  # numba-cuda's (tests/test_ptx.py checks)

    from steadystep.cuda import backend as launch

    configured = []

    class Kernel:
        def __getitem__(self, dimensions):
            warnings.warn(NumbaPerformanceWarning("Grid size 1 will likely result in GPU under-utilization"))
            configured.append(dimensions)
            return lambda *arguments: dimensions

    monkeypatch.setattr(launch, "_CONFIGURED", {})
    monkeypatch.setattr(launch.config, "ENABLE_CUDASIM", False)  # the real GPU's branch (see _configured)
    kernel = Kernel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = launch._configured(kernel, 1, 256)
        assert launch._configured(kernel, 1, 256) is first
        assert launch._configured(kernel, 2, 256, 4096)() == (2, 256, 0, 4096)
    assert configured == [(1, 256, 0, 0), (2, 256, 0, 4096)]

    class Other(Kernel):
        def __getitem__(self, dimensions):
            warnings.warn(UserWarning("not Numba's occupancy"))
            return super().__getitem__(dimensions)

    with pytest.warns(UserWarning, match="not Numba's"):
        launch._configured(Other(), 1, 256)

    monkeypatch.undo()
    # and a real small launch through it gives the kernel's result
    param = to_device(np.linspace(-1, 1, 12))
    sgd_update(param, to_device(np.full(12, 0.5)), 0.1, out=param)
    np.testing.assert_array_equal(to_host(param), np.linspace(-1, 1, 12) - 0.1 * 0.5)


def test_a_remembered_gpu_step_holds_no_reference_to_the_callers_arrays(gpu, monkeypatch):
    """The views a remembered step keeps must not keep the caller's GPU arrays alive (the
    step is forgotten when one of them dies; dispatch._watch). Checked on the real-GPU
    branch with a stand-in, as the simulator takes another path."""
    from types import SimpleNamespace

    from steadystep.cuda import backend as launch

    owners = []
    monkeypatch.setattr(launch.config, "ENABLE_CUDASIM", False)
    monkeypatch.setattr(
        launch, "cuda", SimpleNamespace(from_cuda_array_interface=lambda interface, owner, sync: owners.append(owner))
    )
    value = SimpleNamespace(
        __cuda_array_interface__={"shape": (3,), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3}
    )
    launch._as_device_array(value, owned=False)
    launch._as_device_array(value)
    assert owners == [None, value]


# -- imports ----------------------------------------------------------------------------------


@pytest.mark.slow  # starts processes of its own
@pytest.mark.skipif(SIMULATOR, reason="checks a plain import")
def test_import_needs_no_cuda_no_torch_no_cupy():
    code = (
        "import sys\n"
        "sys.modules['numba.cuda'] = None\n"  # as if numba-cuda and the CUDA runtime were missing
        "import steadystep\n"
        "assert steadystep.gradient_descent.sgd_update(1.0, 0.5, 0.1) == 0.95\n"
        "assert not {'torch', 'cupy'} & set(sys.modules), sorted({'torch', 'cupy'} & set(sys.modules))\n"
        "try:\n"
        "    steadystep.gradient_descent.sgd_update(1.0, 0.5, 0.1, target='cuda')\n"
        "except RuntimeError as error:\n"
        "    assert 'steadystep[cuda]' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('cuda without numba.cuda must fail')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- threads ----------------------------------------------------------------------------------


@pytest.mark.slow  # starts processes of its own
@pytest.mark.skipif(SIMULATOR, reason="runs the CPU kernels in a fresh process")
def test_python_threads_may_step_at_once_even_on_numbas_workqueue_layer():
    """Three failures, in a fresh process where the threads' first calls race: the first thread
    to need a kernel module is still importing it while the others find it half-built in
    sys.modules (AttributeError); Numba's workqueue threading layer (what pip gives on macOS)
    aborts the process when threads launch parallel kernels concurrently; and LARS's trust
    ratios, kept per layout, were one array for every thread."""
    code = """
import threading
import numpy as np
from steadystep import decentral, optim
from steadystep.arena import Layout

def train(seed, results):
    rng = np.random.default_rng(seed)
    param, grad = rng.normal(size=300_000), rng.normal(size=300_000)
    exp_avg, exp_avg_sq = np.zeros_like(param), np.zeros_like(param)
    for step in range(1, 21):
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=step, lr=1e-2)
        optim.clip_grad_norm(grad, max_norm=1e3)
    layout = Layout.of([(1000, 100), (100_000,), (100_000,)])  # equal in every thread, ratios differ
    lars, lars_grad = rng.normal(size=layout.size), rng.normal(size=layout.size)
    for _ in range(20):
        optim.lars(lars, lars_grad, layout=layout, lr=0.1)
    workers = decentral.DecentralizedAdamW(rng.normal(size=(4, 20_000)), topology=decentral.ring())
    for _ in range(5):
        workers.step(np.ones((4, 20_000)))
    results[seed] = (param, lars, workers.params)

threaded, alone = {}, {}
threads = [threading.Thread(target=train, args=(seed, threaded)) for seed in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for seed in range(4):
    train(seed, alone)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(threaded[seed], alone[seed])), seed
print("same results")
"""
    environment = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environment)
    assert result.stdout.strip() == "same results", result.stdout + result.stderr


@pytest.mark.slow  # starts processes of its own
@pytest.mark.skipif(SIMULATOR or not hasattr(os, "fork"), reason="forks a fresh process that ran the CPU kernels")
def test_processes_forked_after_a_step_step_too():
    """GNU OpenMP is not fork-safe: after the parent had stepped, Numba terminated a forked
    child at its first parallel kernel, and a multiprocessing Pool then waited forever. A
    child now runs the serial twins of the kernels, with the parent's results to the bit."""
    code = """
import multiprocessing, numba
import numpy as np
from steadystep import decentral, models, optim
from steadystep.cpu import backend as launch

def train(seed):
    rng = np.random.default_rng(seed)
    param, grad = rng.normal(size=100_000), rng.normal(size=100_000)  # parallel: above launch.PARALLEL_MIN
    exp_avg, exp_avg_sq = np.zeros_like(param), np.zeros_like(param)
    for step in range(1, 4):
        optim.clip_grad_norm(grad, max_norm=1.0)
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=step, lr=1e-2)
    workers = decentral.DecentralizedAdamW(rng.normal(size=(4, 1000)), topology=decentral.ring(), max_norm=1.0)
    workers.step(rng.normal(size=(4, 1000)))
    model = models.mlp(features=5, hidden=4, classes=3)
    loss, gradient = model.loss_and_grad(model.init(workers=2), rng.normal(size=(20, 5)), rng.integers(0, 3, 20))
    return getattr(launch, "_FORKED_AFTER_OPENMP", None), [param, workers.params, loss, gradient]

if __name__ == "__main__":
    parent = [train(seed) for seed in range(2)]
    gnu_openmp = numba.threading_layer() == "omp" and numba.np.ufunc.omppool.openmp_vendor == "GNU"
    # one child for both seeds: it compiles the serial twins once (two would compile them side by side)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        children = pool.map_async(train, range(2)).get(timeout=240)
    for (_, expected), (serial, got) in zip(parent, children):
        assert serial == gnu_openmp
        assert all(a.tobytes() == b.tobytes() for a, b in zip(expected, got))
    print("same results")
"""
    result = run_python(code, timeout=300)
    assert result.stdout.strip() == "same results", result.stdout + result.stderr


def test_both_backends_offer_the_backend_interface_with_its_signatures():
    """cpu/backend.py and cuda/backend.py define every function dispatch.Backend lists, with
    the same parameters and hints, and no other public function: the layers above call either
    alike. Read from the source, so the CUDA backend need not import (no GPU, no simulator)."""
    import ast
    from pathlib import Path

    def signatures(nodes) -> dict[str, str]:
        functions = [node for node in nodes if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]
        return {
            node.name: ast.unparse(node.args).removeprefix("self, ") + f" -> {ast.unparse(node.returns)}"
            for node in functions
        }

    package = Path(steadystep.__file__).parent
    dispatch = ast.parse((package / "dispatch.py").read_text())
    protocol = next(node for node in dispatch.body if isinstance(node, ast.ClassDef) and node.name == "Backend")
    wanted = signatures(protocol.body)
    assert {"elementwise", "rows", "prepare_step", "run_grid", "run_mixing", "sum_squares", "to_host"} <= set(wanted)
    for target in ("cpu", "cuda"):
        assert signatures(ast.parse((package / target / "backend.py").read_text()).body) == wanted, target


def test_torch_cpu_tensors_are_read_as_dlpack_reads_them():
    """classify reads a plain torch CPU tensor directly (not through the CUDA interface and
    DLPack probes): the same view DLPack gives, of the same memory, writable (bfloat16 as its
    bits); anything else (a conjugate view) takes the general path, which names what it
    cannot read."""
    torch = pytest.importorskip("torch")
    from steadystep import _arrays

    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    cases = [
        base,
        base.float(),
        base.long(),
        base > 3,
        base[:, ::2],
        base.T,
        torch.nn.Parameter(base.clone()),
        torch.zeros(0),
    ]
    for tensor in cases:
        operand = _arrays.classify("x", tensor)
        reference = np.from_dlpack(tensor.detach())
        assert operand.kind == "host" and operand.source is tensor
        assert operand.value.dtype == reference.dtype and operand.value.strides == reference.strides
        np.testing.assert_array_equal(operand.value, reference)
        assert operand.value.flags.writeable and np.shares_memory(operand.value, reference) or not tensor.numel()
    # bfloat16, which NumPy has not: its bits, marked as bfloat16 (a uint16 tensor's are not)
    half = base.to(torch.bfloat16)
    operand = _arrays.classify("x", half)
    assert operand.storage == "bfloat16" and operand.dtype == np.uint16 and operand.source is half
    assert np.shares_memory(operand.value, half.view(torch.int16).numpy())
    assert _arrays.classify("x", half.view(torch.uint16)).storage is None
    assert _arrays._torch_cpu_view(base.to(torch.complex64).conj()) is None  # a conjugate view


# -- the prepared path of a repeated elementwise call ------------------------------------------


def _kinds_of_a_call(library, dtype, shape, lr, with_out):
    """sgd_update's arguments of one set of kinds, new arrays on every call."""
    rng = np.random.default_rng(abs(hash((library, dtype, shape))) % 2**32)
    param, grad = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    out = np.empty(shape, dtype) if with_out else None
    if library == "torch":
        param, grad = torch.from_numpy(param), torch.from_numpy(grad)
        out = None if out is None else torch.from_numpy(out)
    return param, grad, lr, out


def _sgd_reference(param, grad, lr, dtype):
    param, grad = (np.asarray(value, dtype) for value in (param, grad))
    return param - dtype(lr) * grad  # in dtype: float32 numbers stay float32 (NEP 50's scalar cast)


@pytest.mark.skipif(SIMULATOR, reason="a prepared call is the CPU target's (the GPU's takes the general path)")
@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize(
    "dtype, shape, lr, with_out",
    [
        (np.float32, (1000,), 0.1, True),
        (np.float32, (1000,), 0.1, False),
        (np.float64, (3, 7), 1, True),  # an int, and a flattened 2-D out
        (np.float32, (0,), np.float32(0.5), False),
        (np.float64, (5,), np.float64(2.5), True),
    ],
)
def test_a_repeated_call_skips_the_general_path_and_gives_its_bits(library, dtype, shape, lr, with_out, monkeypatch):
    from steadystep import dispatch

    general = []
    run = dispatch.run_elementwise
    monkeypatch.setattr(dispatch, "run_elementwise", lambda *arguments: (general.append(1), run(*arguments))[1])
    results = []
    for _ in range(3):  # new arrays of the same kinds each time
        param, grad, lr_, out = _kinds_of_a_call(library, dtype, shape, lr, with_out)
        result = sgd_update(param, grad, lr_, out=out)
        assert result is out if with_out else type(result) is type(param)
        assert np.asarray(result).dtype == dtype and tuple(result.shape) == shape
        assert np.asarray(result).tobytes() == _sgd_reference(param, grad, lr, dtype).tobytes()
        results.append(result)
    assert len(general) <= 1  # the first call of these kinds, unless an earlier test made them


@pytest.mark.skipif(SIMULATOR, reason="a prepared call is the CPU target's")
def test_a_prepared_call_runs_the_machine_code_it_found_only_for_arguments_of_its_kinds(monkeypatch):
    """After its first launch a prepared call runs the serial kernel's machine code, without
    Numba's dispatch on types: so an array of another alignment, a type of its own to Numba,
    is a kind of its own too; an integer is converted by NumPy, not by way of a double."""
    from steadystep import dispatch
    from steadystep.cpu import backend

    general, found = [], []
    run, machine_code = dispatch.run_elementwise, backend._machine_code
    monkeypatch.setattr(dispatch, "run_elementwise", lambda *arguments: (general.append(1), run(*arguments))[1])
    monkeypatch.setattr(backend, "_machine_code", lambda *given: found.append(machine_code(*given)) or found[-1])
    rng = np.random.default_rng(3)
    lr = 2**60 + 2**36 + 1  # float32 rounds it once; by way of a double, twice
    for aligned in (True, True, True, False, False):
        memory = np.zeros(3 * 4 * 257 + 1, np.uint8)
        param, grad, out = (
            np.frombuffer(memory, np.float32, 257, offset=k * 4 * 257 + (0 if aligned else 1)) for k in range(3)
        )
        assert param.flags.aligned == aligned and out.flags.writeable
        param[:], grad[:] = rng.standard_normal((2, 257)) * 1e-18
        assert sgd_update(param, grad, lr, out=out) is out
        assert out.tobytes() == (param - np.float32(lr) * grad).tobytes()
    assert len(general) == 2  # once for each alignment
    assert len(found) == 2 and all(callable(code) for code in found)
    for aligned in (True, True, True, False, False):  # torch tensors may be misaligned too
        memory = bytearray(3 * 4 * 257 + 1)
        param, grad, out = (
            torch.frombuffer(memory, dtype=torch.float32, count=257, offset=k * 4 * 257 + (0 if aligned else 1))
            for k in range(3)
        )
        param[:], grad[:] = (torch.from_numpy(rng.standard_normal(257) * 1e-18) for _ in range(2))
        assert sgd_update(param, grad, lr, out=out) is out
        assert out.numpy().tobytes() == (param.numpy() - np.float32(lr) * grad.numpy()).tobytes()
    assert len(general) == 4 and len(found) == 4


@pytest.mark.skipif(SIMULATOR, reason="a prepared call is the CPU target's")
def test_a_prepared_step_is_found_by_its_objects_and_checked_by_their_names():
    from steadystep import dispatch
    from steadystep.kernels.optim import STEPS

    step = next(step for step in STEPS if step.name == "sgd")
    param, grad = np.full(8, 2.0, np.float32), np.full(8, 3.0, np.float32)
    grad.flags.writeable = False
    scalars = {"lr": 0.5, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": 0.0}
    scalars.update(gradient_sign=1.0, first_step=1.0, rounding=0, decay=1.0)
    for _ in range(2):  # the second call is prepared
        dispatch.run_step("optim", step, {"param": param, "grad": grad, "momentum_buffer": None}, dict(scalars))
    assert param.tolist() == [2.0 - 2 * 0.5 * 3.0] * 8
    # the same objects in the same places, under each other's names: checked afresh
    with pytest.raises(ValueError, match="param is read-only"):
        dispatch.run_step("optim", step, {"grad": param, "param": grad, "momentum_buffer": None}, dict(scalars))
    assert param.tolist() == [-1.0] * 8 and grad.tolist() == [3.0] * 8


@pytest.mark.skipif(SIMULATOR, reason="a prepared call is the CPU target's")
def test_a_prepared_call_still_runs_the_checks_that_depend_on_values():
    buffer = np.arange(12, dtype=np.float32)
    grad = np.ones(11, np.float32)
    for _ in range(2):  # the second call of each is prepared
        sgd_update(np.ones(11, np.float32), grad, 0.5, out=np.empty(11, np.float32))
        expected = buffer[1:] - np.float32(0.5) * grad
        sgd_update(buffer[1:], grad, 0.5, out=buffer[:-1])  # out overlaps param: read as a copy
        assert buffer[:-1].tolist() == expected.tolist()
        buffer = np.arange(12, dtype=np.float32)
    param = np.ones(11, np.float32)
    sgd_update(param, grad, 0.5, out=param)  # exactly param's elements: in place
    assert param.tolist() == [0.5] * 11
    with pytest.raises(OverflowError, match="lr is an integer beyond float64's range"):
        sgd_update(param, grad, 10**400, out=param)
    read_only = np.empty(11, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        sgd_update(param, grad, 0.5, out=read_only)
    assert param.tolist() == [0.5] * 11

    weight = torch.nn.Parameter(torch.ones(11))
    with torch.no_grad():
        for _ in range(2):
            sgd_update(weight, torch.ones(11), 0.25, out=weight)
    assert weight.tolist() == [0.5] * 11 and weight._version == 2  # each write counted, as torch's own
    with pytest.raises(TypeError, match="param is a torch tensor that requires grad"):
        sgd_update(weight, torch.ones(11), 0.25, out=weight)
    assert weight.tolist() == [0.5] * 11
    with pytest.raises(TypeError, match="out has dtype float64; the result is float32"):
        sgd_update(weight.detach(), torch.ones(11), 0.25, out=torch.empty(11, dtype=torch.float64))
