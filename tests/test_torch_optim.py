"""steadystep.torch optimizers as drop-ins for torch.optim on a small model (CPU tensors)."""

from __future__ import annotations

import collections
import copy
import io

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.conftest import SIMULATOR
from tests.helpers import import_error_without, run_python

pytestmark = pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
torch = pytest.importorskip("torch")
fused = pytest.importorskip("steadystep.torch")
import steadystep.torch.optim as fused_optim  # noqa: E402  (after the skip: it imports torch)

PAIRS = [
    (fused.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    (fused.SGD, torch.optim.SGD, dict(lr=0.1)),
    (fused.Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=1e-3)),
    (fused.AdamW, torch.optim.AdamW, dict(lr=1e-2)),
    (fused.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, momentum=0.5, centered=True)),
    (fused.Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (fused.Adam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True)),
    (fused.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    (fused.RMSprop, torch.optim.RMSprop, dict(lr=1e-2)),
]


def model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def data(dtype):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(64, 6, generator=generator, dtype=dtype), torch.randint(0, 4, (64,), generator=generator)


def train(network, optimizer, dtype, steps):
    inputs, targets = data(dtype)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(network(inputs), targets).backward()
        optimizer.step()


def max_relative_difference(a, b):
    return max(((pa - pb).abs().max() / pb.abs().max()).item() for pa, pb in zip(a.parameters(), b.parameters()))


def difference_on_the_model_scale(a, b):
    """The largest difference of any parameter, relative to the largest parameter of ``b``."""
    differences = [(pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters())]
    return max(differences) / max(pb.abs().max().item() for pb in b.parameters())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("ours, theirs, options", PAIRS, ids=lambda v: getattr(v, "__name__", None))
def test_trains_to_the_same_parameters_as_torch(ours, theirs, options, dtype, tolerance):
    a, b = model(dtype), model(dtype)
    train(a, ours(a.parameters(), **options), dtype, 100)
    train(b, theirs(b.parameters(), **options), dtype, 100)
    assert max_relative_difference(a, b) <= tolerance


@pytest.mark.parametrize(
    "ours",
    [fused.SGD, fused.Adam, fused.AdamW, fused.RMSprop, fused.Adagrad, fused.LARS, fused.Lion],
    ids=lambda v: v.__name__,
)
def test_a_graph_built_before_the_step_is_refused_as_torch_refuses_it(ours):
    """The classic GAN mistake: the generator's loss, computed through the discriminator before
    the discriminator stepped, back-propagated after. torch's in-place step bumps each
    parameter's version, so autograd refuses; the kernel's writes bumped nothing, and the
    gradient silently went through the new weights."""
    results = {}
    for optimizer_class in (torch.optim.SGD, ours):
        discriminator = model(torch.float64)
        optimizer = optimizer_class(discriminator.parameters(), lr=0.1)
        fake = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)  # a generator's output
        generator_loss = discriminator(fake).sum()  # saves the discriminator's weights
        discriminator(fake.detach()).pow(2).sum().backward()
        optimizer.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as error:
            generator_loss.backward()
        results[optimizer_class] = str(error.value).split("[")[0]
    assert results[ours] == results[torch.optim.SGD]


SCHEDULERS = {
    "StepLR": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5),
    # cycles Adam's β1 (SGD's momentum) through group["betas"] every step, as well as the rate
    "OneCycleLR": lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=40),
    "CosineAnnealingWarmRestarts": lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        optimizer, 10
    ),
}


@pytest.mark.filterwarnings("error")  # e.g. the scheduler's "lr_scheduler.step() before optimizer.step()"
@pytest.mark.parametrize("schedule", sorted(SCHEDULERS))
@pytest.mark.parametrize(
    "ours, theirs, options", [PAIRS[0], PAIRS[3], PAIRS[6]], ids=lambda v: getattr(v, "__name__", None)
)
def test_learning_rate_schedulers_hooks_and_clipping_work_as_with_torch(ours, theirs, options, schedule):
    """What a training script wraps around the optimizer: an LR scheduler rewriting the
    groups after each step (and noting that the optimizer stepped first), step hooks, and
    torch.nn.utils.clip_grad_norm_ on the gradients (arena views) before it."""
    networks, calls = [], []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make(network.parameters(), **options)
        scheduler = SCHEDULERS[schedule](optimizer)
        called = []
        optimizer.register_step_pre_hook(lambda *_: called.append("pre"))
        optimizer.register_step_post_hook(lambda *_: called.append("post"))
        inputs, targets = data(torch.float64)
        for _ in range(40):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), max_norm=0.5)
            optimizer.step()
            scheduler.step()
        networks.append(network)
        calls.append(called)
    assert calls[0] == calls[1] == ["pre", "post"] * 40
    assert max_relative_difference(*networks) <= 1e-12


def loss_closure(network, optimizer):
    """The closure torch's step(closure) takes: gradients zeroed, the loss computed and backpropagated."""
    inputs, targets = data(torch.float64)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(network(inputs), targets)
        loss.backward()
        return loss

    return closure


def test_a_step_runs_without_autograd_and_restores_the_grad_mode():
    """As torch's steps: the closure computes gradients even under no_grad, the update records
    nothing for autograd, and the caller's grad mode is back afterwards, also after an error."""
    network = model(torch.float64)
    optimizer = fused.SGD(network.parameters(), lr=0.1, momentum=0.9)
    closure = loss_closure(network, optimizer)

    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            assert optimizer.step(closure).requires_grad
            assert torch.is_grad_enabled() == grad_mode
            with pytest.raises(ZeroDivisionError):
                optimizer.step(lambda: 1 / 0)
            assert torch.is_grad_enabled() == grad_mode
    assert all(p.is_leaf and p.grad_fn is None for p in network.parameters())
    assert all(optimizer.state[p]["momentum_buffer"].grad_fn is None for p in network.parameters())


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
def test_under_torch_compile_steps_run_as_they_are_and_train_as_torch(ours, theirs, options):
    """``torch.compile(optimizer.step)`` and a compiled training iteration: dynamo leaves the
    steps to run eagerly (it crashed tracing the dispatch before)."""
    networks = []
    for make, compile in ((theirs, lambda f: f), (ours, lambda f: torch.compile(f, backend="eager"))):
        network = model(torch.float64)
        optimizer = make(network.parameters(), **options)
        inputs, targets = data(torch.float64)

        def iteration():
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            optimizer.step()

        compiled_iteration, compiled_step = compile(iteration), compile(optimizer.step)
        for _ in range(3):
            compiled_iteration()
        for _ in range(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            compiled_step()
        networks.append(network)
    assert max_relative_difference(*networks) <= 1e-12


def test_importing_the_drop_ins_leaves_torchs_compiler_unloaded():
    """Marking the steps for torch.compile would import torch._dynamo (seconds at every import):
    the mark is made at the first step that finds it loaded (the test above steps compiled)."""
    result = run_python("import sys, torch, steadystep.torch; print('torch._dynamo' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


def test_a_step_no_hook_or_profiler_sees_skips_torchs_wrapper(monkeypatch):
    """torch wraps each optimizer's step in a profiler range and its hooks (~30 µs a step).
    The drop-ins go around it only when nothing would see it: a profiler then finds the step's
    range, global and per-optimizer hooks run (a pre-hook may replace the arguments), and
    without any of them the step runs without torch's wrapper."""
    network = model(torch.float64)
    optimizer = fused.AdamW(network.parameters())
    closure = loss_closure(network, optimizer)

    with monkeypatch.context() as patched:  # nothing observes: torch's wrapper must not run
        patched.setattr(fused_optim, "_TORCH_WRAPPED_STEP", None)
        assert optimizer.step(closure) is not None

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        optimizer.step(closure)
    assert "Optimizer.step#AdamW.step" in {event.name for event in profiler.events()}

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    seen = []
    replaced = lambda *_: seen.append("replaced")  # noqa: E731
    handles = [
        register_optimizer_step_pre_hook(lambda *_: seen.append("global pre")),
        register_optimizer_step_post_hook(lambda *_: seen.append("global post")),
        # torch hands the hooks the step's arguments with the optimizer first
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: ((opt, replaced), kwargs)),
        optimizer.register_step_post_hook(lambda opt, args, kwargs: seen.append(("post", args[1] is replaced))),
    ]
    try:
        optimizer.step(closure)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == ["global pre", "replaced", ("post", True), "global post"]
    assert not fused_optim._observed(optimizer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (ci/gpu_check.sh runs it)")
@pytest.mark.parametrize("ours, theirs, options", PAIRS[2:4], ids=lambda v: getattr(v, "__name__", None))
def test_trains_on_cuda_to_the_same_parameters_as_torch(ours, theirs, options):
    a, b = model(torch.float64).cuda(), model(torch.float64).cuda()
    optimizer = ours(a.parameters(), **options)
    inputs, targets = (value.cuda() for value in data(torch.float64))
    for network, stepper in ((a, optimizer), (b, theirs(b.parameters(), **options))):
        for _ in range(20):
            stepper.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            stepper.step()
    assert max_relative_difference(a, b) <= 1e-12
    assert optimizer._packed(optimizer.param_groups[0])[0].buffer.is_cuda


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (ci/gpu_check.sh runs it)")
@pytest.mark.parametrize("name", ["LARS", "Lion"])
def test_lars_and_lion_on_cuda_train_as_on_the_cpu(name):
    runs = []
    for device in ("cpu", "cuda"):
        network = model(torch.float64).to(device)
        optimizer = getattr(fused, name)(network.parameters(), lr=0.05, weight_decay=0.01)
        inputs, targets = (value.to(device) for value in data(torch.float64))
        for _ in range(10):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            optimizer.step()
        runs.append(network.cpu())
    assert max_relative_difference(*runs) <= 1e-12


@pytest.mark.slow  # starts processes of its own
@pytest.mark.parametrize("bucket_view", [False, True], ids=["copied", "bucket_views"])
def test_distributed_data_parallel_trains_as_with_torch(bucket_view):
    """DistributedDataParallel (one gloo process) writes its reduced gradients into p.grad: by
    copying into the arena views, or, with gradient_as_bucket_view, by making p.grad views of its
    own buckets, which a step brings back into the arena.

    In a process of its own: torch's gloo process groups, collected after the test, now and
    then hung the process that held them (seen in this sandbox), which must not be the suite's."""
    distributed = pytest.importorskip("torch.distributed")
    if not distributed.is_available() or not distributed.is_gloo_available():
        pytest.skip("torch built without gloo")
    code = f"""
import os, torch
import torch.distributed as distributed
import steadystep.torch as fused
from tests.test_torch_optim import max_relative_difference, model, train
# one process: no rendezvous
distributed.init_process_group("gloo", store=distributed.HashStore(), rank=0, world_size=1)
networks = []
for make in (fused.AdamW, torch.optim.AdamW):
    network = model(torch.float64)
    wrapped = torch.nn.parallel.DistributedDataParallel(network, gradient_as_bucket_view={bucket_view})
    train(wrapped, make(wrapped.parameters(), lr=1e-2), torch.float64, 20)
    networks.append(network)
print(max_relative_difference(*networks), flush=True)
os._exit(0)  # the answer is out; skip the teardown
"""
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert float(result.stdout.strip()) <= 1e-12


@pytest.mark.slow  # starts processes of its own
def test_fsdp2_parameters_are_refused_by_name_before_anything_is_packed():
    """FSDP2 (fully_shard) makes each parameter a DTensor shard, which no arena can hold:
    refused by name (torch's own error came from deep inside a copy), the model untouched."""
    distributed = pytest.importorskip("torch.distributed")
    if not distributed.is_available() or not distributed.is_gloo_available():
        pytest.skip("torch built without gloo")
    code = """
import os, torch
import torch.distributed as distributed
from torch.distributed.fsdp import fully_shard
import steadystep.torch as fused
distributed.init_process_group("gloo", store=distributed.HashStore(), rank=0, world_size=1)
network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
fully_shard(network)
places = [p.to_local().data_ptr() for p in network.parameters()]
try:
    fused.AdamW(network.parameters())
except TypeError as error:
    print(error)
print(places == [p.to_local().data_ptr() for p in network.parameters()], flush=True)
os._exit(0)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    message, untouched = result.stdout.strip().splitlines()
    assert message.startswith("parameter 0 of a group is a DTensor; steadystep optimizers step plain tensors"), message
    assert "use torch.optim for FSDP2 or tensor-parallel models" in message
    assert untouched == "True"


def test_parameters_in_shared_memory_are_refused_before_anything_is_packed():
    """Hogwild-style training (model.share_memory(), one optimizer per process): packing moved
    each process's parameters into an arena of its own, so the processes silently trained
    private copies and the shared model never changed. Refused instead, the model untouched."""
    network = model(torch.float64)
    network.share_memory()
    places = [p.data_ptr() for p in network.parameters()]
    with pytest.raises(ValueError, match="parameter 0 of a group lives in shared memory.*or use torch.optim"):
        fused.SGD(network.parameters(), lr=0.1)
    assert places == [p.data_ptr() for p in network.parameters()]


@pytest.mark.slow  # starts processes of its own
@pytest.mark.skipif(SIMULATOR, reason="CPU processes")
# Python ≥ 3.12 warns about forking a process with threads (OpenMP's, torch's); the reader only
# waits and reads 64 numbers (a forked child sees the parent's later writes only in shared memory)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_model_shared_after_the_optimizer_is_built_trains_in_shared_memory_where_a_reader_sees_it(monkeypatch):
    """The learner of an actor-learner setup: sharing moves the arena (the parameters' storage)
    into shared memory as a whole, the parameters stay its views, and steps keep writing
    there, as torch's, where a process reading the model sees them. The arena's places used
    to be stale from then on: every step took each parameter for moved and copied it onto
    itself (300 tensors: 85 µs a step became 1.4 ms)."""
    import multiprocessing

    networks = [model(torch.float64) for _ in range(2)]
    optimizers = [fused.AdamW(networks[0].parameters(), lr=0.01), torch.optim.AdamW(networks[1].parameters(), lr=0.01)]
    train(networks[0], optimizers[0], torch.float64, 2)
    train(networks[1], optimizers[1], torch.float64, 2)
    networks[0].share_memory()
    context = multiprocessing.get_context("fork")
    trained, seen = context.Event(), context.Queue()
    reader = context.Process(target=_read_when_trained, args=(networks[0], trained, seen))
    reader.start()
    version = networks[0][0].weight._version  # shared by the arena's views: one count per write into it
    for network, optimizer in zip(networks, optimizers):
        train(network, optimizer, torch.float64, 3)
    trained.set()
    assert networks[0][0].weight._version == version + 3  # the three steps, and no copy of a parameter onto itself
    weights = seen.get(timeout=60)
    reader.join(timeout=60)
    assert weights == networks[0][0].weight.tolist()
    assert all(p.is_shared() for p in networks[0].parameters())
    assert len({p.untyped_storage().data_ptr() for p in networks[0].parameters()}) == 1  # views of one arena
    assert max_relative_difference(networks[0], networks[1]) <= 1e-12
    copies, copy_ = [], torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda tensor, *args: copies.append(tensor) or copy_(tensor, *args))
    optimizers[0].step()
    assert not copies


def _read_when_trained(network, trained, seen):
    trained.wait(timeout=60)
    seen.put(network[0].weight.tolist())


@pytest.mark.slow  # starts processes of its own
def test_without_torch_the_import_says_what_to_install():
    error = import_error_without("torch", "steadystep.torch")
    assert error.startswith("steadystep.torch needs torch: pip install 'steadystep[torch]'"), error


def test_parameters_and_gradients_live_in_one_arena():
    network = model(torch.float32)
    optimizer = fused.AdamW(network.parameters())
    arena, grads = optimizer._packed(optimizer.param_groups[0])
    start, end = arena.buffer.data_ptr(), arena.buffer.data_ptr() + arena.buffer.numel() * 4
    for parameter in network.parameters():
        assert start <= parameter.data_ptr() < end
    train(network, optimizer, torch.float32, 2)
    assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(network.parameters(), grads.views))


def _twenty_steps_and_a_checkpoint_at_ten(ours, options):
    """A model trained 20 steps without a break, and a checkpoint (model and optimizer, through
    torch.save/torch.load) of the same training after 10."""
    uninterrupted = model(torch.float64)
    train(uninterrupted, ours(uninterrupted.parameters(), **options), torch.float64, 20)
    first = model(torch.float64)
    optimizer = ours(first.parameters(), **options)
    train(first, optimizer, torch.float64, 10)
    saved = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    saved.seek(0)
    return uninterrupted, torch.load(saved)


@pytest.mark.parametrize("ours, theirs, options", PAIRS[::2], ids=lambda v: getattr(v, "__name__", None))
def test_state_dict_round_trip_continues_identically(ours, theirs, options):
    uninterrupted, checkpoint = _twenty_steps_and_a_checkpoint_at_ten(ours, options)
    resumed = model(torch.float64)
    resumed.load_state_dict(checkpoint["model"])
    optimizer = ours(resumed.parameters(), **options)
    optimizer.load_state_dict(checkpoint["optimizer"])
    train(resumed, optimizer, torch.float64, 10)
    assert max_relative_difference(resumed, uninterrupted) == 0.0


@pytest.mark.parametrize(
    "ours, theirs, options",
    PAIRS[::2]
    + [(fused.LARS, None, dict(lr=0.1, weight_decay=1e-3)), (fused.Lion, None, dict(lr=1e-3, weight_decay=0.1))],
    ids=lambda v: getattr(v, "__name__", None),
)
@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copy_of_the_model_and_optimizer_objects_continues_identically(ours, theirs, options, how):
    """copy.deepcopy, or torch.save and torch.load of the objects themselves (not their state
    dicts), mid-run: the copy continues as the original would, and the original as if it had
    never been copied (the two share no memory)."""
    uninterrupted = model(torch.float64)
    train(uninterrupted, ours(uninterrupted.parameters(), **options), torch.float64, 20)
    original = model(torch.float64)
    optimizer = ours(original.parameters(), **options)
    train(original, optimizer, torch.float64, 10)
    if how == "deepcopy":
        copied, copied_optimizer = copy.deepcopy((original, optimizer))
    else:
        saved = io.BytesIO()
        torch.save((original, optimizer), saved)
        saved.seek(0)
        copied, copied_optimizer = torch.load(saved, weights_only=False)
    train(copied, copied_optimizer, torch.float64, 10)
    train(original, optimizer, torch.float64, 10)
    assert max_relative_difference(copied, uninterrupted) == 0.0
    assert max_relative_difference(original, uninterrupted) == 0.0


@pytest.mark.parametrize("ours, theirs, options", PAIRS[::2], ids=lambda v: getattr(v, "__name__", None))
def test_loading_into_an_optimizer_that_has_stepped_replaces_its_state(ours, theirs, options):
    # The optimizer remembers its checked state between steps; a load must replace it.
    uninterrupted, checkpoint = _twenty_steps_and_a_checkpoint_at_ten(ours, options)
    resumed = model(torch.float64)
    optimizer = ours(resumed.parameters(), **options)
    train(resumed, optimizer, torch.float64, 3)  # a state of its own, checked and remembered
    resumed.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    train(resumed, optimizer, torch.float64, 10)
    assert max_relative_difference(resumed, uninterrupted) == 0.0


@pytest.mark.parametrize("ours, theirs, options", PAIRS[::2], ids=lambda v: getattr(v, "__name__", None))
def test_torch_state_dicts_load_into_ours_and_back(ours, theirs, options):
    reference = model(torch.float64)
    reference_optimizer = theirs(reference.parameters(), **options)
    train(reference, reference_optimizer, torch.float64, 20)

    network = model(torch.float64)
    optimizer = theirs(network.parameters(), **options)
    train(network, optimizer, torch.float64, 10)
    switched = ours(network.parameters(), **options)
    switched.load_state_dict(optimizer.state_dict())
    train(network, switched, torch.float64, 10)
    assert max_relative_difference(network, reference) <= 1e-12
    back = theirs(network.parameters(), **options)  # torch continues from our state, step counts included
    back.load_state_dict(switched.state_dict())
    train(network, back, torch.float64, 5)
    train(reference, reference_optimizer, torch.float64, 5)
    assert max_relative_difference(network, reference) <= 1e-12


def _layout_of(state_dict):
    """A state_dict's structure: per parameter index, each entry's key, kind, shape and dtype."""

    def kind(value):
        return (
            (type(value).__name__, tuple(value.shape), str(value.dtype))
            if isinstance(value, torch.Tensor)
            else repr(value)
        )

    return {
        index: {key: kind(value) for key, value in sorted(entry.items())}
        for index, entry in sorted(state_dict["state"].items())
    }


@pytest.mark.parametrize("ours, theirs, options", PAIRS, ids=lambda v: getattr(v, "__name__", None))
def test_the_state_dict_has_torchs_layout_key_for_key(ours, theirs, options):
    """Built, then after steps, with a frozen parameter: the same entries as torch's (SGD kept a
    'step' torch's has not; Adagrad made its state at the first step, torch at construction)."""
    layouts = []
    for optimizer_class in (ours, theirs):
        network = model(torch.float64)
        network[2].bias.requires_grad_(False)
        optimizer = optimizer_class(network.parameters(), **options)
        seen = [_layout_of(optimizer.state_dict())]
        train(network, optimizer, torch.float64, 2)
        seen.append(_layout_of(optimizer.state_dict()))
        layouts.append(seen)
    assert layouts[0] == layouts[1]


def test_an_sgd_checkpoint_from_torch_and_back_keeps_no_count():
    network = model(torch.float64)
    optimizer = fused.SGD(network.parameters(), lr=0.1, momentum=0.9)
    train(network, optimizer, torch.float64, 3)
    assert all("step" not in entry for entry in optimizer.state_dict()["state"].values())
    reference = model(torch.float64)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    train(reference, reference_optimizer, torch.float64, 3)
    back = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9)
    back.load_state_dict(optimizer.state_dict())
    train(network, back, torch.float64, 3)
    train(reference, reference_optimizer, torch.float64, 3)
    assert max_relative_difference(network, reference) <= 1e-12


def test_another_models_state_dict_is_refused_naming_the_state_and_nothing_is_written():
    """Same number of tensors, other shapes: torch's copy error ('The size of tensor a (2)
    must match...') named neither the state nor the parameter."""
    other = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    source = torch.optim.AdamW(other.parameters())
    other(torch.ones(2, 5, dtype=torch.float64)).sum().backward()
    source.step()
    network, optimizer = _stepped_in_two_groups(fused.AdamW)
    optimizer.load_state_dict({**source.state_dict(), "param_groups": optimizer.state_dict()["param_groups"]})
    _assert_the_step_fails_with_nothing_written(
        network,
        optimizer,
        ValueError,
        "the state's exp_avg of parameter 0 in a group has shape \\(16, 5\\), "
        "the parameter \\(16, 6\\): the loaded state_dict is another model's",
    )


@pytest.mark.parametrize("name", ["LARS", "Lion"])
def test_lars_and_lion_match_the_functional_steps(name):
    from steadystep import optim
    from steadystep.arena import Arena

    network = model(torch.float64)
    reference = [p.detach().clone() for p in network.parameters()]
    options = dict(lr=0.05, weight_decay=0.01)
    optimizer = getattr(fused, name)(network.parameters(), **options)
    train(network, optimizer, torch.float64, 1)

    replay = model(torch.float64)
    inputs, targets = data(torch.float64)
    torch.nn.functional.cross_entropy(replay(inputs), targets).backward()
    arena = Arena.pack([p.detach().numpy() for p in reference])
    grads = Arena.pack([p.grad.numpy() for p in replay.parameters()])
    state = arena.zeros_like().buffer
    if name == "LARS":
        optim.lars(
            arena.buffer,
            grads.buffer,
            state,
            layout=arena.layout,
            momentum=0.9,
            decay_mask=arena.layout.mask(dtype=np.float64),
            **options,
        )
    else:
        optim.lion(arena.buffer, grads.buffer, state, **options)
    for parameter, expected in zip(network.parameters(), arena.views):
        np.testing.assert_array_equal(parameter.detach().numpy(), expected)


@pytest.mark.parametrize("ours, theirs, options", PAIRS[2:4], ids=lambda v: getattr(v, "__name__", None))
def test_a_torch_state_with_a_parameter_that_never_had_a_gradient_continues_as_torch(ours, theirs, options):
    # torch keeps no count for a parameter without a gradient; if that parameter came last,
    # its count of 0 used to become the whole group's, restarting every bias correction.
    def network_with_an_unused_head():
        network = model(torch.float64)
        network.append(torch.nn.Linear(4, 4).double())  # last parameters; the forward below skips them
        return network

    def train_skipping_head(network, optimizer, steps):
        inputs, targets = data(torch.float64)
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network[:3](inputs), targets).backward()
            optimizer.step()

    reference = network_with_an_unused_head()
    reference_optimizer = theirs(reference.parameters(), **options)
    train_skipping_head(reference, reference_optimizer, 20)

    network = network_with_an_unused_head()
    optimizer = theirs(network.parameters(), **options)
    train_skipping_head(network, optimizer, 10)
    switched = ours(network.parameters(), **options)
    switched.load_state_dict(optimizer.state_dict())
    train_skipping_head(network, switched, 10)
    assert max_relative_difference(network[:3], reference[:3]) <= 1e-12
    assert [float(switched.state[p]["step"]) for p in network[:3].parameters()] == [20.0] * 4


def test_a_torch_adam_state_with_decoupled_weight_decay_continues_as_adamw():
    # torch.optim.Adam(decoupled_weight_decay=True) is AdamW; its state used to continue as
    # Adam's L2 decay here (35% apart after 10 steps).
    options = dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)
    reference = model(torch.float64)
    train(reference, torch.optim.Adam(reference.parameters(), **options), torch.float64, 20)
    network = model(torch.float64)
    theirs = torch.optim.Adam(network.parameters(), **options)
    train(network, theirs, torch.float64, 10)
    ours = fused.Adam(network.parameters(), lr=1e-2, weight_decay=0.1)
    ours.load_state_dict(theirs.state_dict())
    train(network, ours, torch.float64, 10)
    assert max_relative_difference(network, reference) <= 1e-12


@pytest.mark.parametrize("ours, theirs, options", PAIRS, ids=lambda v: getattr(v, "__name__", None))
def test_the_state_holds_the_buffers_torch_keeps_and_no_others(ours, theirs, options):
    # A buffer for an option that is off (SGD's momentum at 0, RMSprop's grad_avg when not
    # centered, max_exp_avg_sq without amsgrad) would cost a copy of the model for nothing.
    def buffers(optimizer, network):
        return [
            sorted(name for name, value in optimizer.state[p].items() if value is not None and name != "step")
            for p in network.parameters()
        ]

    a, b = model(torch.float64), model(torch.float64)
    mine, reference = ours(a.parameters(), **options), theirs(b.parameters(), **options)
    train(a, mine, torch.float64, 2)
    train(b, reference, torch.float64, 2)
    assert buffers(mine, a) == buffers(reference, b)


def through_the_scaler(optimizer_class):
    """``optimizer_class`` taking GradScaler's usual path (the scaler unscales the gradients and
    skips the step itself): the reference for the kernel's own handling of the scale and flag
    where torch has no such optimizer (LARS, Lion)."""
    return type(
        f"{optimizer_class.__name__}ThroughTheScaler", (optimizer_class,), {"_step_supports_amp_scaling": False}
    )


@pytest.mark.parametrize(
    "ours, theirs, options",
    PAIRS
    + [
        (fused.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5)),  # a buffer started late would differ
        (fused.Lion, through_the_scaler(fused.Lion), dict(lr=1e-3, weight_decay=0.1)),
        (fused.LARS, through_the_scaler(fused.LARS), dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="needs a CUDA device (ci/gpu_check.sh runs it)"
            ),
        ),
    ],
)
@pytest.mark.parametrize("clipped", [False, True], ids=["", "unscaled-and-clipped"])
def test_grad_scaler_skips_and_counts_steps_as_with_torch(ours, theirs, options, device, clipped):
    """Every drop-in takes GradScaler's scale and flag into its kernel. A skipped step
    changes nothing and does not count (Adam's bias corrections, Adagrad's decayed rate), and a
    first step skipped leaves SGD's momentum buffer to start at the first step taken.
    ``clipped``: the script unscales the gradients itself to clip them, so only the flag is
    handed over."""
    inputs, targets = (value.to(device) for value in data(torch.float64))
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64).to(device)
        optimizer = make(network.parameters(), **options)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        for step in range(8):
            optimizer.zero_grad()
            scaler.scale(torch.nn.functional.cross_entropy(network(inputs), targets)).backward()
            if step in (0, 2, 3, 6):  # an overflow
                network[0].weight.grad[0, 0] = float("inf")
            if clipped:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(network.parameters(), max_norm=0.5)
            scaler.step(optimizer)
            scaler.update()
        runs.append((network, optimizer, scaler.get_scale()))
    (mine, my_optimizer, my_scale), (reference, reference_optimizer, scale) = runs
    assert my_scale == scale
    assert max_relative_difference(mine, reference) <= 1e-12
    for p, q in zip(mine.parameters(), reference.parameters()):  # unscaled state too (Lion's sign is scale-free)
        for name, value in reference_optimizer.state[q].items():
            if name != "step" and value is not None:
                assert (my_optimizer.state[p][name] - value).abs().max() <= 1e-12 * value.abs().max(), name
    if ours is not fused.SGD:  # SGD keeps no count, as torch's
        assert [float(my_optimizer.state[p]["step"]) for p in mine.parameters()] == [4.0] * 4
        assert [float(reference_optimizer.state[p]["step"]) for p in reference.parameters()] == [4.0] * 4
    else:
        assert not any("step" in my_optimizer.state[p] for p in mine.parameters())


@pytest.mark.parametrize(
    "ours, theirs, options",
    [
        (fused.AdamW, torch.optim.AdamW, dict(lr=1e-2)),
        (fused.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5)),
        (fused.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, momentum=0.5, centered=True)),
        (fused.Adagrad, torch.optim.Adagrad, dict(lr=0.1)),  # with lr_decay it reads the count
        (fused.LARS, through_the_scaler(fused.LARS), dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_a_grad_scaler_step_reads_no_tensor_on_the_host(ours, theirs, options, monkeypatch):
    """The drop-ins take GradScaler's scale and flag into the kernel (as torch's fused
    optimizers): once the state is built, no tensor value is read on the host during the step,
    which on a GPU is a synchronisation. The parameters and the count still follow torch
    skipping the overflowing step."""
    inputs, targets = data(torch.float64)
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make(network.parameters(), **options)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step in range(6):
            optimizer.zero_grad()
            scaler.scale(torch.nn.functional.cross_entropy(network(inputs), targets)).backward()
            if step == 4:
                network[2].bias.grad[1] = float("nan")
            with monkeypatch.context() as patched:
                if make is ours and step >= 2:  # once the state is built
                    # (not numpy(): a zero-copy view of CPU memory, which NumPy < 2.2 needs for a
                    # writable view of a count, and which a CUDA tensor refuses anyway)
                    for read in ("item", "__float__", "__bool__", "tolist"):
                        patched.setattr(torch.Tensor, read, _host_read)
                scaler.step(optimizer)
            scaler.update()
        runs.append((network, optimizer))
    (mine, my_optimizer), (reference, reference_optimizer) = runs
    assert max_relative_difference(mine, reference) <= 1e-12
    if ours is not fused.SGD:  # SGD keeps no count, as torch's
        assert {float(my_optimizer.state[p]["step"]) for p in mine.parameters()} == {5.0}
        assert float(reference_optimizer.state[next(reference.parameters())]["step"]) == 5.0


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor was read on the host during the step")


@pytest.mark.parametrize("dampening", [0.0, 0.1])
def test_momentum_turned_on_mid_run_starts_its_buffer_as_torch(dampening):
    # torch starts a buffer it has not got from the step's own value, undampened
    a, b = model(torch.float64), model(torch.float64)
    mine, reference = (
        optimizer(network.parameters(), lr=0.1, dampening=dampening)
        for optimizer, network in ((fused.SGD, a), (torch.optim.SGD, b))
    )
    for network, optimizer in ((a, mine), (b, reference)):
        train(network, optimizer, torch.float64, 3)
        optimizer.param_groups[0]["momentum"] = 0.9
        train(network, optimizer, torch.float64, 5)
    assert max_relative_difference(a, b) <= 1e-12
    assert all(
        torch.allclose(mine.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"], rtol=1e-12)
        for p, q in zip(a.parameters(), b.parameters())
    )


def test_torch_implementation_flags_are_accepted_or_refused_by_name():
    parameters = [torch.nn.Parameter(torch.ones(3))]
    for optimizer in (fused.SGD, fused.Adam, fused.AdamW, fused.Adagrad):
        # code written for torch runs unchanged, and trains exactly as without the flags
        a, b = model(torch.float64), model(torch.float64)
        train(a, optimizer(a.parameters(), lr=0.01, foreach=True, fused=True), torch.float64, 3)
        train(b, optimizer(b.parameters(), lr=0.01), torch.float64, 3)
        assert max_relative_difference(a, b) == 0.0
        assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), model(torch.float64).parameters()))
    with pytest.raises(ValueError, match="capturable=True is not supported"):
        fused.AdamW(parameters, capturable=True)
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        fused.RMSprop(parameters, differentiable=True)


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
def test_frozen_parameters_are_never_stepped_as_in_torch(ours, theirs, options):
    # requires_grad=False used to put them in the arena with a zero gradient: weight decay
    # and momentum kept moving "frozen" weights.
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64)
        network[0].requires_grad_(False)
        frozen = [p.detach().clone() for p in network[0].parameters()]
        optimizer = make(
            network.parameters(), **options, **({"weight_decay": 0.1} if "momentum" not in options else {})
        )
        train(network, optimizer, torch.float64, 5)
        assert all(torch.equal(p, f) for p, f in zip(network[0].parameters(), frozen))
        network[0].requires_grad_(True)  # unfrozen: stepped from now on (re-packed)
        network[2].requires_grad_(False)  # frozen after training: left alone from now on
        head = [p.detach().clone() for p in network[2].parameters()]
        train(network, optimizer, torch.float64, 5)
        assert all(torch.equal(p, h) for p, h in zip(network[2].parameters(), head))
        assert all(p.grad is None for p in network[2].parameters())
        assert not all(torch.equal(p, f) for p, f in zip(network[0].parameters(), frozen))
        runs.append(network)
    assert max_relative_difference(*runs) <= 1e-12  # the unfrozen layer counts from its first step, as in torch


@pytest.mark.parametrize(
    "ours, theirs, options",
    [
        *(PAIRS[index] for index in (2, 3, 5, 7)),
        (fused.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5)),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
@pytest.mark.parametrize("scaled", [False, True], ids=["", "grad_scaler"])
def test_layers_unfrozen_one_by_one_count_from_their_own_first_step_as_in_torch(ours, theirs, options, scaled):
    """Gradual unfreezing: each parameter's count starts with its first step, so a group holds
    several counts, and each run of parameters sharing one steps with it (Adam's bias
    corrections, Adagrad's decayed rate; SGD's momentum buffer starting as b ← d for the
    unfrozen alone); under GradScaler too, where the counts live on the device and an
    overflowed step counts for none (and starts no buffer)."""
    inputs, targets = data(torch.float64)
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64)
        network[0].requires_grad_(False)
        optimizer = make(network.parameters(), **options)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2, enabled=scaled)
        for step in range(8):
            if step == 3:
                network[0].weight.requires_grad_(True)
            if step == 5:
                network[0].bias.requires_grad_(True)
            optimizer.zero_grad()
            scaler.scale(torch.nn.functional.cross_entropy(network(inputs), targets)).backward()
            if scaled and step in (3, 6):  # an overflow, the first in the unfrozen weight's first step
                network[2].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        runs.append((network, optimizer))
    assert max_relative_difference(runs[0][0], runs[1][0]) <= 1e-12
    if ours is fused.SGD:  # torch's SGD keeps no count
        return
    counts = [[float(optimizer.state[p]["step"]) for p in network.parameters()] for network, optimizer in runs]
    assert counts[0] == counts[1] == ([3.0, 2.0, 6.0, 6.0] if scaled else [5.0, 3.0, 8.0, 8.0])


@pytest.mark.parametrize(
    "ours, theirs, options",
    [
        *(PAIRS[index] for index in (0, 2, 3, 4, 5, 7)),
        (fused.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1)),
        (fused.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.5)),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
@pytest.mark.parametrize("scaled", [False, True], ids=["", "grad_scaler"])
@pytest.mark.parametrize("zeroing", ["by hand", "zero_grad(set_to_none=True)"])
def test_parameters_left_without_a_gradient_are_left_alone_as_in_torch(ours, theirs, options, scaled, zeroing):
    """Gradients set to None (``model.zero_grad()``, as Hugging Face's Trainer calls it, or
    the optimizer's ``zero_grad(set_to_none=True)``) and a module the loss does not use for a
    while: torch skips those parameters (no weight decay, no momentum, no count); they used
    to step with a zero gradient, so weight decay shrank an unused module. The whole group
    still steps in one launch, and the unused parameters' elements, counts and unstarted
    buffers are put back after it."""
    inputs, targets = data(torch.float64)
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64)
        torch.manual_seed(1)
        extra = torch.nn.Linear(4, 4).to(torch.float64)  # in the middle of the group: runs on both sides
        parameters = [*network[0].parameters(), *extra.parameters(), *network[2].parameters()]
        optimizer = make(parameters, **options)
        unchanged = [p._version for p in extra.parameters()]
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2, enabled=scaled)
        for step in range(9):
            if zeroing == "by hand":
                for parameter in parameters:
                    parameter.grad = None
            else:
                optimizer.zero_grad(set_to_none=True)
            logits = network(inputs)
            loss = torch.nn.functional.cross_entropy(logits, targets)
            if step >= 4 and step != 6:
                loss = loss + 0.1 * extra(logits).pow(2).mean()
            scaler.scale(loss).backward()
            if scaled and step in (2, 5):  # overflows, one in the extra module's first step
                network[2].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            if step == 3:
                assert all(p.grad is None for p in extra.parameters())
                assert [p._version for p in extra.parameters()] == unchanged  # not stepped, so not changed in place
        runs.append((network, extra, optimizer))
    (network, extra, optimizer), (reference, reference_extra, reference_optimizer) = runs
    assert (
        max_relative_difference(torch.nn.Sequential(network, extra), torch.nn.Sequential(reference, reference_extra))
        <= 1e-12
    )
    if ours is not fused.SGD:  # torch's SGD keeps no count
        counts = [[float(o.state[p]["step"]) for p in (*n.parameters(), *e.parameters())] for n, e, o in runs]
        assert counts[0] == counts[1]


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
def test_zero_grad_zeroes_in_place_by_default_as_torch_does_without_set_to_none(ours, theirs, options):
    """The default keeps every gradient a zero view of the arena (autograd adds into it; no
    copy at the step): a parameter that then gets no gradient steps with a zero one, exactly
    as under torch's ``zero_grad(set_to_none=False)``."""
    inputs, targets = data(torch.float64)
    runs = []
    for make in (ours, theirs):
        network = model(torch.float64)
        extra = torch.nn.Linear(4, 4).to(torch.float64)
        optimizer = make([*network.parameters(), *extra.parameters()], **options)
        for step in range(5):
            optimizer.zero_grad() if make is ours else optimizer.zero_grad(set_to_none=False)
            if step:
                assert all(
                    p.grad is not None and not p.grad.any() for p in (*network.parameters(), *extra.parameters())
                )
            loss = torch.nn.functional.cross_entropy(network(inputs), targets)
            if step < 2:  # then the extra module gets no gradient: it steps with a zero one
                loss = loss + 0.1 * extra(network(inputs)).pow(2).mean()
            loss.backward()
            optimizer.step()
        runs.append(torch.nn.Sequential(network, extra))
    assert max_relative_difference(*runs) <= 1e-12


@pytest.mark.parametrize("optimizer", [fused.LARS, fused.Lion], ids=lambda v: v.__name__)
def test_lars_and_lion_leave_parameters_without_a_gradient_as_they_were(optimizer):
    """No torch.optim to compare with: the parameters that get gradients train to the bits of
    an optimizer that never held the others, which stay as they were."""
    inputs, targets = data(torch.float64)
    runs = []
    for with_unused in (True, False):
        network = model(torch.float64)
        unused = torch.nn.Linear(3, 3).to(torch.float64)
        before = [p.detach().clone() for p in unused.parameters()]
        held = [*network[0].parameters(), *(unused.parameters() if with_unused else ()), *network[2].parameters()]
        stepper = optimizer(held, lr=0.01, weight_decay=0.1)
        for _ in range(4):
            network.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            stepper.step()
        assert all(torch.equal(p, b) for p, b in zip(unused.parameters(), before))
        runs.append(network)
    assert all(torch.equal(p, q) for p, q in zip(runs[0].parameters(), runs[1].parameters()))


def test_a_group_with_every_parameter_frozen_is_skipped():
    network = model(torch.float64).requires_grad_(False)
    before = [p.detach().clone() for p in network.parameters()]
    optimizer = fused.AdamW(network.parameters())
    optimizer.step()
    optimizer.zero_grad()
    assert all(torch.equal(p, b) for p, b in zip(network.parameters(), before))


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
def test_empty_parameter_groups_are_accepted_as_in_torch(ours, theirs, options):
    """An empty group (a "no decay" group of a model without biases, say), given to the
    constructor or added later, holds nothing to step; torch accepts both."""
    networks = []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make([{"params": list(network.parameters())}, {"params": [], "weight_decay": 0.0}], **options)
        optimizer.add_param_group({"params": []})
        train(network, optimizer, torch.float64, 5)
        state = optimizer.state_dict()
        assert [group["params"] for group in state["param_groups"]] == [[0, 1, 2, 3], [], []]
        resumed = make([{"params": list(network.parameters())}, {"params": []}, {"params": []}], **options)
        resumed.load_state_dict(state)  # a checkpoint with empty groups, into a new optimizer
        train(network, resumed, torch.float64, 5)
        networks.append(network)
    assert max_relative_difference(*networks) <= 1e-12


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
def test_named_parameters_train_and_save_their_names_as_in_torch(ours, theirs, options):
    networks, states = [], []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make(network.named_parameters(), **options)
        train(network, optimizer, torch.float64, 5)
        networks.append(network)
        states.append(optimizer.state_dict())
    assert max_relative_difference(*networks) <= 1e-12
    assert states[0]["param_groups"][0]["param_names"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert states[0]["param_groups"][0]["param_names"] == states[1]["param_groups"][0]["param_names"]


@pytest.mark.parametrize("named", [False, True])
def test_a_parameter_listed_twice_in_a_group_is_refused_before_anything_is_packed(named):
    """torch.optim steps such a parameter twice per step, warning that this will become an
    error; steadystep refuses it (it would get two places in the arena, one of them dead)."""
    network = model(torch.float32)
    listed = list(network.named_parameters() if named else network.parameters())
    with pytest.raises(ValueError, match=r"parameter 4 of a group is parameter 0 again \(shape \(16, 6\)\); pass each"):
        fused.AdamW(listed + [listed[0]])
    optimizer = fused.AdamW(listed[:2], lr=0.1)
    train(network, optimizer, torch.float32, 2)
    before = [p.detach().clone() for p in network.parameters()], copy.deepcopy(optimizer.state_dict())
    third = network[2].weight
    place = third.data_ptr()
    with pytest.raises(ValueError, match="parameter 1 of a group is parameter 0 again"):
        optimizer.add_param_group({"params": [listed[2], listed[2]]})
    assert len(optimizer.param_groups) == 1
    assert all(torch.equal(p, b) for p, b in zip(network.parameters(), before[0]))
    assert third.data_ptr() == place  # not packed into an arena
    assert str(optimizer.state_dict()) == str(before[1])


@pytest.mark.parametrize(
    "ours, theirs, options", [PAIRS[0], PAIRS[3], PAIRS[4], PAIRS[5]], ids=lambda v: getattr(v, "__name__", None)
)
def test_sparse_gradients_step_as_the_dense_embedding_does_with_torch(ours, theirs, options):
    tables = []
    for make, sparse in ((ours, True), (theirs, False)):
        torch.manual_seed(0)
        table = torch.nn.Embedding(10, 3, sparse=sparse, dtype=torch.float64)
        optimizer = make(table.parameters(), **options)
        for step in range(6):
            optimizer.zero_grad()
            table(torch.tensor([1, 2, 2, step])).pow(2).sum().backward()
            optimizer.step()
        tables.append(table)
    assert max_relative_difference(*tables) <= 1e-12


def _convolutional(memory_format):
    torch.manual_seed(0)
    network = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2)
    )
    return network.to(torch.float64, memory_format=memory_format)


@pytest.mark.parametrize("ours, theirs, options", PAIRS[2:4], ids=lambda v: getattr(v, "__name__", None))
@pytest.mark.parametrize("when", ["before", "after"])
def test_channels_last_parameters_stay_so_and_train_as_with_torch(ours, theirs, options, when):
    """A convolution kernel in channels_last format keeps it in the arena, with its gradient and
    state alike, whether the model was converted before the optimizer was built or after."""
    inputs = torch.randn(8, 3, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    networks, optimizers = [], []
    for make in (ours, theirs):
        network = _convolutional(torch.channels_last if when == "before" else torch.contiguous_format)
        optimizer = make(network.parameters(), **options)
        for step in range(6):
            if step == 3 and when == "after":
                network.to(memory_format=torch.channels_last)
            optimizer.zero_grad()
            network(inputs.to(memory_format=torch.channels_last)).pow(2).mean().backward()
            optimizer.step()
        networks.append(network)
        optimizers.append(optimizer)
    assert max_relative_difference(*networks) <= 1e-12
    kernel = networks[0][0].weight
    state = [value for name, value in optimizers[0].state[kernel].items() if name != "step"]
    assert all(
        t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
        for t in [kernel, kernel.grad, *state]
    )


@pytest.mark.parametrize("ours, theirs, options", PAIRS[2:4], ids=lambda v: getattr(v, "__name__", None))
@pytest.mark.parametrize(
    "edit",
    [
        lambda params, network: params.pop(0),
        lambda params, network: params.pop(),
        lambda params, network: params.append(torch.nn.Parameter(torch.ones(3, dtype=torch.float64))),
        lambda params, network: params.reverse(),
        lambda params, network: params.__setitem__(1, torch.nn.Parameter(torch.zeros(16, dtype=torch.float64))),
        lambda params, network: params.__delitem__(slice(1, 3)),
        "replace",
    ],
    ids=["pop_first", "pop_last", "append", "reverse", "set_item", "delete_slice", "replace"],
)
def test_a_groups_parameters_edited_in_place_train_as_with_torch(ours, theirs, options, edit):
    """torch reads group["params"] at every step; the drop-ins pack the group again when it changed."""
    networks = []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make(network.parameters(), **options)
        train(network, optimizer, torch.float64, 3)
        group = optimizer.param_groups[0]
        if edit == "replace":
            group["params"] = list(network[2].parameters())
        else:
            edit(group["params"], network)
        train(network, optimizer, torch.float64, 3)
        networks.append(network)
    assert max_relative_difference(*networks) <= 1e-12


def test_a_parameter_put_twice_into_a_group_later_is_refused_at_the_step():
    network = model(torch.float64)
    optimizer = fused.AdamW(network.parameters(), lr=0.1)
    train(network, optimizer, torch.float64, 2)
    optimizer.param_groups[0]["params"][1] = network[2].bias
    before = [p.detach().clone() for p in network.parameters()]
    with pytest.raises(ValueError, match="parameter 3 of a group is parameter 1 again"):
        optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(network.parameters(), before))


def _first_buffer(optimizer, network):
    state = optimizer.state[network[0].weight]
    return state, "momentum_buffer" if "momentum_buffer" in state else "exp_avg"


def _replace_a_buffer(optimizer, network):
    state, name = _first_buffer(optimizer, network)
    state[name] = torch.full_like(network[0].weight, 0.5)


def _zero_a_buffer_in_place(optimizer, network):
    state, name = _first_buffer(optimizer, network)
    state[name].zero_()


def _reset_every_parameter(optimizer, network):
    for parameter in network.parameters():
        optimizer.state[parameter] = {}


def _delete_one(optimizer, network):  # its count and buffers restart alone, as in torch
    del optimizer.state[network[0].weight]


def _set_every_count(optimizer, network):
    for parameter in network.parameters():
        optimizer.state[parameter]["step"] = torch.tensor(100.0)


@pytest.mark.parametrize("ours, theirs, options", [PAIRS[0], PAIRS[3]], ids=lambda v: getattr(v, "__name__", None))
@pytest.mark.parametrize(
    "edit",
    [
        _replace_a_buffer,
        _delete_one,
        _reset_every_parameter,
        _set_every_count,
        lambda optimizer, network: optimizer.state.clear(),
        lambda optimizer, network: setattr(optimizer, "state", collections.defaultdict(dict)),
        _zero_a_buffer_in_place,
    ],
    ids=[
        "replace_a_buffer",
        "delete_one",
        "reset_every_parameter",
        "set_every_count",
        "clear",
        "new_state",
        "zero_in_place",
    ],
)
def test_state_changed_by_the_user_steps_as_with_torch(ours, theirs, options, edit):
    """torch reads its state at every step: a buffer replaced, the state reset (as a restart
    does) or a count changed take effect at the next step (they raised KeyError, or were
    silently ignored, before); a checkpoint afterwards is torch's and loads weights-only."""
    if edit is _set_every_count and ours is fused.SGD:
        pytest.skip("torch's SGD keeps no count")
    networks, states = [], []
    for make in (ours, theirs):
        network = model(torch.float64)
        optimizer = make(network.parameters(), **options)
        train(network, optimizer, torch.float64, 3)
        edit(optimizer, network)
        train(network, optimizer, torch.float64, 3)
        networks.append(network)
        checkpoint = io.BytesIO()
        torch.save(optimizer.state_dict(), checkpoint)
        states.append(torch.load(io.BytesIO(checkpoint.getvalue()), weights_only=True)["state"])
    assert max_relative_difference(*networks) <= 1e-12
    assert states[0].keys() == states[1].keys()
    for index, theirs_state in states[1].items():
        for name, value in theirs_state.items():
            assert torch.allclose(states[0][index][name], value.to(states[0][index][name].dtype), rtol=1e-12), name


def _reinitialise(network):
    with torch.no_grad():
        for index, parameter in enumerate(network.parameters()):
            parameter.data = torch.full_like(parameter, 0.01 * (index + 1))


def _repoint_gradients(network):
    for parameter in network.parameters():
        parameter.grad.data = 2 * parameter.grad  # what Module.to does to a gradient it converts


@pytest.mark.parametrize("ours, theirs, options", PAIRS[2:4], ids=lambda v: getattr(v, "__name__", None))
@pytest.mark.parametrize("change", ["reinitialise", "convert", "repoint_gradients"])
def test_parameters_given_new_storage_train_as_with_torch(ours, theirs, options, change):
    # Such parameters are no longer views of the arena; stepping the arena alone would leave
    # the model untouched without a word.
    runs = []
    for make in (ours, theirs):
        network = model(torch.float32 if change == "convert" else torch.float64)
        optimizer = make(network.parameters(), **options)
        if change == "reinitialise":
            _reinitialise(network)
        elif change == "convert":
            network.double()
        inputs, targets = data(torch.float64)
        for _ in range(5):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(network(inputs), targets).backward()
            if change == "repoint_gradients":
                _repoint_gradients(network)
            optimizer.step()
        runs.append(network)
    assert all(p.dtype == torch.float64 for p in runs[0].parameters())
    assert max_relative_difference(*runs) <= 1e-12


def test_a_model_converted_after_stepping_keeps_its_state_in_the_new_dtype():
    # torch.optim refuses this (its state stays float32); ours converts the state, as
    # torch's load_state_dict would.
    ours = model(torch.float32)
    optimizer = fused.AdamW(ours.parameters(), lr=1e-2)
    train(ours, optimizer, torch.float32, 5)
    reference = model(torch.float32)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    train(reference, reference_optimizer, torch.float32, 5)
    state = reference_optimizer.state_dict()
    ours.double()
    reference.double()
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    reference_optimizer.load_state_dict(state)
    train(ours, optimizer, torch.float64, 5)
    train(reference, reference_optimizer, torch.float64, 5)
    assert optimizer.state[ours[0].weight]["exp_avg"].dtype == torch.float64
    assert max_relative_difference(ours, reference) <= 1e-5


def test_a_parameter_reshaped_after_stepping_is_refused_and_nothing_is_written():
    network = model(torch.float64)
    optimizer = fused.AdamW(network.parameters())
    train(network, optimizer, torch.float64, 2)
    network[0].weight.data = torch.ones(3, 3, dtype=torch.float64)
    before = [p.detach().clone() for p in network.parameters()]
    with pytest.raises(ValueError, match="parameter 0 of a group changed shape"):
        optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(network.parameters(), before))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_model_converted_to_half_precision_mid_run_steps_on_with_its_state_cast(dtype):
    """model.to(bfloat16) after some float32 steps: the next step packs the new parameters and
    casts the state to their dtype, as torch's load_state_dict casts a state to its parameters'
    (torch's fused step refuses the float32 state instead): close to torch's fused step loaded
    with the float32 state (a few ulps, at this large learning rate: the bit-level parity of the
    half-precision steps is test_half_steps.py's)."""
    network = model(torch.float32)
    optimizer = fused.AdamW(network.parameters(), lr=0.1)
    train(network, optimizer, torch.float32, 2)
    state = copy.deepcopy(optimizer.state_dict())
    network.to(dtype)
    reference = copy.deepcopy(network)
    theirs = torch.optim.AdamW(reference.parameters(), lr=0.1, fused=True)
    theirs.load_state_dict(state)
    for net in (network, reference):
        net.zero_grad()
        net(torch.ones(2, 6, dtype=dtype)).sum().backward()
    optimizer.step()
    theirs.step()
    for mine, expected in zip(network.parameters(), reference.parameters()):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine.detach().float(), expected.detach().float(), rtol=2**-6, atol=2**-9)
    assert all(
        value.dtype == dtype for entry in optimizer.state.values() for key, value in entry.items() if key != "step"
    )


def test_complex_parameters_are_refused_with_advice_that_fits():
    with pytest.raises(TypeError, match="are torch.complex64; .* use torch.optim for complex parameters$"):
        fused.AdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.complex64))])


def test_parameters_on_the_meta_device_are_refused_with_when_to_build_the_optimizer():
    """Deferred initialisation: NumPy cannot view a meta tensor, and the error told the user to
    cast a float32 parameter to float32."""
    with torch.device("meta"):
        network = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter 0 of a group is on the meta device; build the optimizer once"):
        fused.AdamW(network.parameters())
    network.to_empty(device="cpu")
    fused.AdamW(network.parameters())  # as the message says


# torch's Adagrad fills its state in the constructor, so it refuses lazy parameters (ours takes them)
@pytest.mark.parametrize(
    "ours, theirs, options",
    [pair for pair in PAIRS if pair[1] is not torch.optim.Adagrad],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_lazy_modules_built_before_their_first_forward_train_as_with_torch(ours, theirs, options):
    """nn.LazyLinear's parameters have no shape until the first forward: torch.optim takes them
    before it, and packing them raised torch's 'uninitialized parameter' error. The group is
    now packed at the first step that finds them materialised."""
    networks, optimizers = [], []
    for make in (ours, theirs):
        torch.manual_seed(0)
        network = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
        optimizer = make([{"params": network[0].parameters()}, {"params": network[2].parameters()}], **options)
        optimizer.zero_grad()
        optimizer.step()  # before any forward: nothing to step, as in torch
        networks.append(network)
        optimizers.append(optimizer)
    for network, optimizer in zip(networks, optimizers):
        torch.manual_seed(1)  # the lazy layer draws its initial weights at the first forward
        train(network, optimizer, torch.float64, 5)
    assert max_relative_difference(networks[0], networks[1]) <= 1e-12


def test_mixed_devices_or_dtypes_in_one_group_are_refused_naming_which_and_train_as_groups():
    singles = [torch.nn.Parameter(torch.ones(2)) for _ in range(7)]
    double = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    with pytest.raises(
        ValueError,
        match="one device with one dtype .* parameters 0, 1, 2, 3, 4, ... on cpu in float32; "
        "parameter 7 on cpu in float64. Give each kind a group of its own",
    ):
        fused.AdamW([*singles, double])
    optimizer = fused.AdamW([{"params": singles}, {"params": [double]}], lr=0.5, weight_decay=0.0)
    for parameter in (*singles, double):
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    assert all(p[0].item() == pytest.approx(0.5, abs=1e-6) for p in (*singles, double))  # Adam steps lr·sign(g) first


@pytest.mark.parametrize(
    "optimizer, options, message",
    [
        (fused.SGD, dict(lr=-0.1), "lr must be a finite number ≥ 0"),
        (fused.SGD, dict(lr=0.1, nesterov=True), "nesterov needs momentum > 0"),
        (fused.SGD, dict(lr=0.1, nesterov=True, momentum=0.9, dampening=0.1), "and dampening = 0"),
        (fused.AdamW, dict(eps=-1e-8), "eps must"),
        (fused.Adam, dict(betas=(0.9, 1.0)), "betas must"),
        (fused.RMSprop, dict(alpha=-0.1), "alpha must"),
        (fused.Adagrad, dict(initial_accumulator_value=-1.0), "initial_accumulator_value must"),
        (fused.LARS, dict(weight_decay=float("nan")), "weight_decay must"),
        (fused.Lion, dict(lr=-1e-4), "lr must"),
        # beyond torch's own checks: NaN, ranges, and flags that are not bools (float('yes') failed inside the step)
        (
            fused.SGD,
            dict(lr=0.1, momentum=0.9, dampening=float("nan")),
            "dampening must be a finite number in \\[0, 1\\]",
        ),
        (fused.SGD, dict(lr=0.1, maximize="yes"), "maximize must be True or False; got 'yes'"),
        (fused.SGD, dict(lr=0.1, momentum=0.9, nesterov="yes"), "nesterov must be True or False"),
        (fused.Adam, dict(amsgrad=None), "amsgrad must be True or False; got None"),
        (fused.RMSprop, dict(centered="no"), "centered must be True or False"),
        (fused.RMSprop, dict(alpha=1.5), "alpha must be a finite number in \\[0, 1\\]"),
        (fused.AdamW, dict(lr="1e-3"), "lr must be a real number; got '1e-3'"),
        (fused.Lion, dict(betas=(0.9, float("nan"))), "betas must be a pair of numbers in \\[0, 1\\)"),
        (fused.Adagrad, dict(lr_decay=float("inf")), "lr_decay must be a finite number"),
    ],
    ids=lambda case: getattr(case, "__name__", None),
)
def test_bad_hyperparameters_fail_at_construction_as_in_torch(optimizer, options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        optimizer([torch.nn.Parameter(torch.ones(3))], **options)


@pytest.mark.parametrize(
    "optimizer, edit, message",
    [
        (fused.AdamW, dict(lr=-0.1), "lr must"),
        (fused.Adam, dict(betas=(0.9, 1.5)), "betas must"),
        (fused.SGD, dict(nesterov=True), "nesterov needs momentum > 0"),
        (fused.RMSprop, dict(alpha=float("nan")), "alpha must"),
    ],
    ids=lambda case: getattr(case, "__name__", None),
)
def test_a_bad_number_put_into_a_group_mid_run_fails_the_step_with_nothing_written(optimizer, edit, message):
    """A group's number edited by hand (or by a scheduler gone wrong) is refused for the whole
    step, naming the group, before any group steps: it used to fail in the last group after the
    first had stepped, with the last group's counts advanced for a step never taken. A group
    added with such a number is refused as it is added."""
    network, optimizer = _stepped_in_two_groups(optimizer)
    optimizer.param_groups[1].update(edit)
    _assert_the_step_fails_with_nothing_written(network, optimizer, ValueError, f"^param_groups\\[1\\]: {message}")
    with pytest.raises(ValueError, match=f"^param_groups\\[2\\]: {message}"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], **edit})
    assert len(optimizer.param_groups) == 2


@pytest.mark.parametrize("ours, theirs, options", PAIRS, ids=lambda v: getattr(v, "__name__", None))
def test_numpy_numbers_as_hyperparameters_train_as_with_torch(ours, theirs, options):
    """Hyperparameters read from a config as NumPy scalars (RMSprop's momentum=np.float32(0.5)
    raised 'can't multiply sequence by non-int of type numpy.bool' while picking its buffers)."""
    options = {
        key: (np.float32(value) if type(value) is float else np.bool_(value) if type(value) is bool else value)
        for key, value in options.items()
    }
    networks = [model(torch.float64) for _ in range(2)]
    for network, make in zip(networks, (ours, theirs)):
        train(network, make(network.parameters(), **options), torch.float64, 3)
    assert max_relative_difference(networks[0], networks[1]) <= 1e-12


def test_group_numbers_replaced_by_new_arrays_each_step_train_as_with_torch():
    """A schedule that puts a new NumPy array of betas into the group every step (the lr, a
    tensor, too): comparing them with the numbers checked before raised NumPy's 'truth value
    of an array is ambiguous' from inside the step."""
    networks = [model(torch.float64) for _ in range(2)]
    optimizers = [fused.AdamW(networks[0].parameters()), torch.optim.AdamW(networks[1].parameters())]
    for step in range(4):
        for network, optimizer in zip(networks, optimizers):
            optimizer.param_groups[0].update(betas=np.array([0.9 - 0.05 * step, 0.99]), lr=torch.tensor(0.01))
            train(network, optimizer, torch.float64, 1)
    assert max_relative_difference(networks[0], networks[1]) <= 1e-12


def test_a_group_that_cannot_be_packed_any_more_fails_the_step_before_any_group_steps():
    """Half of the last group's layer converted to half precision mid-run (its bias): one arena
    cannot hold two dtypes, so the step is refused, and the first group, which could step, is
    left as it was too."""
    network, optimizer = _stepped_in_two_groups(fused.AdamW)
    network[2].bias.data = network[2].bias.data.half()
    _assert_the_step_fails_with_nothing_written(network, optimizer, ValueError, "one device with one dtype")


def _stepped_in_two_groups(optimizer):
    network = model(torch.float64)
    optimizer = optimizer([{"params": network[0].parameters()}, {"params": network[2].parameters()}], lr=0.1)
    network(torch.ones(2, 6, dtype=torch.float64)).sum().backward()
    optimizer.step()
    return network, optimizer


def _assert_the_step_fails_with_nothing_written(network, optimizer, error, message):
    before = copy.deepcopy((network.state_dict(), optimizer.state_dict()))
    with pytest.raises(error, match=message):
        optimizer.step()
    after = (network.state_dict(), optimizer.state_dict())
    assert all(torch.equal(a.to(b.dtype), b) for a, b in zip(before[0].values(), after[0].values()))
    for index, state in before[1]["state"].items():
        assert all(torch.equal(value, after[1]["state"][index][name]) for name, value in state.items())


# -- random sessions: any sequence of what a training script does, against torch.optim -----------------

FUZZED = {
    "SGD": (fused.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "Adam-amsgrad": (fused.Adam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=1e-3)),
    "AdamW": (fused.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "RMSprop": (fused.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, centered=True)),
    "Adagrad": (fused.Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
}
ACTIONS = [
    "step",
    "step",
    "module_step",
    "amp_step",
    "amp_overflow",
    "learning_rate",
    "checkpoint",
    "switch",
    "restore",
    "reinitialise",
    "add_group",
    "copy",
    "reset_state",
    "reset_one",
    "reorder",
    "freeze_or_unfreeze",
    "unused_layer_step",
    "unused_layer_step_set_to_none",
]


@settings(max_examples=40, deadline=None, derandomize=True)
@example(name="Adam-amsgrad", actions=["step", "checkpoint", "step", "restore", "step"])  # into a stepped optimizer
@example(name="SGD", actions=["step", "add_group", "switch", "reinitialise", "step", "switch", "step"])
@example(name="AdamW", actions=["amp_step", "amp_overflow", "checkpoint", "step", "amp_step", "switch", "amp_step"])
@example(name="Adam-amsgrad", actions=["amp_overflow", "reinitialise", "step", "reinitialise"])  # a tensor cancels
@example(name="SGD", actions=["amp_overflow", "checkpoint"])  # a momentum buffer made, skipped, not handed on
@example(name="AdamW", actions=["amp_step", "copy", "amp_overflow", "amp_step", "add_group", "copy", "step"])
@example(
    name="RMSprop", actions=["step", "learning_rate", "step", "step", "step", "learning_rate", "step", "add_group"]
)
@example(name="SGD", actions=["unused_layer_step", "checkpoint"])  # a buffer not started is handed on as None
@example(name="SGD", actions=["unused_layer_step", "copy", "reset_one", "unused_layer_step", "step"])  # and copied so
@given(name=st.sampled_from(sorted(FUZZED)), actions=st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=10))
def test_random_training_sessions_match_torch(name, actions):
    """Steps (gradients zeroed by the optimizer or by the module; under GradScaler, some
    overflowing), learning-rate changes,
    checkpoints through state_dict (into a new optimizer of the same kind, or handing over:
    ours continues from torch's state and torch from ours), a roll back to the last
    checkpoint in the same optimizer, a deep copy of the objects that trains on, parameters given new
    storage and a parameter group
    added mid-run, the state reset (all or one parameter's) and a group's parameters reordered
    by hand, a weight frozen or unfrozen, in any order: the model ends where torch.optim
    takes it."""
    ours, theirs, options = FUZZED[name]
    networks, optimizers = [], []
    for make in (ours, theirs):
        network = model(torch.float64)
        network.append(torch.nn.Linear(4, 4).double())  # trained once its group is added
        network[3].requires_grad_(False)
        networks.append(network)
        optimizers.append(make(network[:3].parameters(), **options))
    checkpoints = [None, None]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3) for _ in networks]
    for batch, action in enumerate(actions):
        for side, network in enumerate(networks):
            optimizer = optimizers[side]
            if action in ("step", "module_step", "unused_layer_step"):
                _session_step(
                    network,
                    optimizer,
                    batch,
                    optimizer if action == "step" else network,
                    unused_first_layer=action == "unused_layer_step",
                )
            elif action == "unused_layer_step_set_to_none":
                _session_step(network, optimizer, batch, _SetToNone(optimizer), unused_first_layer=True)
            elif action in ("amp_step", "amp_overflow"):
                _session_step(network, optimizer, batch, scaler=scalers[side], overflow=action == "amp_overflow")
            elif action == "learning_rate":
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5
            elif action in ("checkpoint", "switch"):
                kind = type(optimizer)
                if action == "switch":
                    kind = theirs if issubclass(kind, fused_optim._FusedOptimizer) else ours
                groups = [{"params": list(group["params"])} for group in optimizer.param_groups]  # reordered too
                optimizers[side] = kind(groups, **options)
                optimizers[side].load_state_dict(optimizer.state_dict())
                checkpoints[side] = (
                    *copy.deepcopy((network.state_dict(), optimizer.state_dict())),
                    _order(network, optimizer),
                )
            elif action == "restore" and checkpoints[side] is not None:
                if checkpoints[side][2] != _order(network, optimizer):
                    continue  # a group was added or reordered since: torch cannot load it either
                network.load_state_dict(checkpoints[side][0])
                # a copy, as torch.load would give: torch.optim keeps the loaded tensors
                # themselves as its state, so stepping would change the checkpoint
                optimizer.load_state_dict(copy.deepcopy(checkpoints[side][1]))
            elif action == "copy":  # the objects themselves, GradScaler too; the copies train on
                networks[side], optimizers[side], scalers[side] = copy.deepcopy((network, optimizer, scalers[side]))
            elif action == "reinitialise":
                _reinitialise(network)
            elif action == "reset_state":  # a restart: every parameter's state dropped
                optimizer.state.clear()
            elif action == "reset_one":  # one parameter restarts alone (its count too)
                optimizer.state.pop(network[2].bias, None)
            elif action == "reorder":
                optimizer.param_groups[0]["params"].reverse()
            elif action == "freeze_or_unfreeze":  # an unfrozen weight counts its steps from its first
                network[0].weight.requires_grad_(not network[0].weight.requires_grad)
            elif action == "add_group" and len(optimizer.param_groups) == 1:
                network[3].requires_grad_(True)
                optimizer.add_param_group({"params": list(network[3].parameters()), "lr": 0.02})
    for side, network in enumerate(networks):
        _session_step(network, optimizers[side], len(actions))
    # On the model's scale, not each tensor's: after "reinitialise" a step can cancel a whole
    # tensor to ~1e-5 of what it was, and under GradScaler Adam's count moves beside the
    # parameters, whose bias corrections are exact to an ulp where torch's float64 1 − β2ᵗ is
    # off by up to ~7e-15 (30 ulp at t = 2): 7e-17 on a 0.01-sized step, 7e-12 of such a tensor.
    # And at 1e-10, not 1e-12: rounding differences of an ulp in the parameters (evaluation
    # order) reach a gradient element that cancels to 1e-7 of its terms as a relative 6e-11,
    # which RMSprop's first step, dividing by |g|·0.1 + ε, passes on (3.8e-12 measured). A
    # state handled wrongly is off by far more (a missed step, a count off by one: > 1e-4).
    assert difference_on_the_model_scale(*networks) <= 1e-10


def _order(network, optimizer):
    """Where each parameter of each group sits in the network (a checkpoint fits only that order)."""
    positions = {id(parameter): index for index, parameter in enumerate(network.parameters())}
    return [[positions[id(parameter)] for parameter in group["params"]] for group in optimizer.param_groups]


class _SetToNone:
    """Zeroes an optimizer's gradients as torch's default does, by setting them to None."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)


def _session_step(network, optimizer, batch, zeroing=None, scaler=None, overflow=False, unused_first_layer=False):
    """One training step; ``zeroing``: network (Module.zero_grad sets gradients to None, so
    autograd makes new ones outside the arena) or the optimizer (the default); with a
    GradScaler, the loss scaled and, on ``overflow``, a gradient made infinite. With
    ``unused_first_layer`` no gradient reaches the first layer (left None after the network's
    zero_grad: that layer is not stepped)."""
    generator = torch.Generator().manual_seed(batch)
    inputs = torch.randn(16, 6, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 4, (16,), generator=generator)
    (zeroing or optimizer).zero_grad()
    features = network[:2](inputs)
    logits = network[2:](features.detach() if unused_first_layer else features)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    if overflow:
        network[2].weight.grad[0, 0] = float("inf")
    scaler.step(optimizer)
    scaler.update()
