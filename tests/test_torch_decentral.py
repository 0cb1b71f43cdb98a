"""The decentralized trainer for torch modules against what the source project does by hand:
N module copies with torch.optim.AdamW(foreach=False), clip_grad_norm_ per worker, and the
dense W_t applied to the parameters (tests/torch_reference.py)."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from steadystep import compress, decentral  # noqa: E402
from steadystep.decentral import AdaptiveConsensus, NonFiniteGradientError, TokenSchedule  # noqa: E402
from steadystep.lm import ByteTransformer  # noqa: E402
from steadystep.torch.decentral import DecentralizedTrainer, cross_entropy  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402
from tests.helpers import all_pairs, pairs_met  # noqa: E402
from tests.torch_reference import ReferenceWorkers  # noqa: E402

WORKERS = 4
STEPS = 20
EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23}


def stochastic_matrix(workers: int) -> np.ndarray:
    weights = np.random.default_rng(3).random((workers, workers)) * (
        np.random.default_rng(4).random((workers, workers)) < 0.6
    )
    weights += np.eye(workers)
    return weights / weights.sum(axis=1, keepdims=True)


TOPOLOGIES = {
    "complete": decentral.complete,
    "one_peer_exponential": decentral.one_peer_exponential,
    "ring": decentral.ring,
    "matrix": lambda: decentral.from_matrix(stochastic_matrix(WORKERS), "random"),
}


# -- models and their batches ----------------------------------------------------------------------------


class SmallCNN(torch.nn.Module):
    """Convolutions with BatchNorm: per-worker running statistics under vmap."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, bias=False)  # a bias before BatchNorm has only rounding noise for gradient
        self.norm = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.nn.functional.max_pool2d(x, 1).flatten(-3))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def transformer():
    return ByteTransformer(context=8, width=16, layers=1, heads=2)


MODELS = {"mlp": mlp, "cnn": SmallCNN, "transformer": transformer}


def batches(kind: str, dtype, steps: int, workers: int = WORKERS, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if kind == "mlp":
            yield (
                torch.randn(workers, 10, 6, generator=generator, dtype=dtype),
                torch.randint(0, 3, (workers, 10), generator=generator),
            )
        elif kind == "cnn":
            yield (
                torch.randn(workers, 5, 1, 6, 6, generator=generator, dtype=dtype),
                torch.randint(0, 3, (workers, 5), generator=generator),
            )
        else:
            tokens = torch.randint(0, 256, (workers, 3, 9), generator=generator)
            targets = tokens[..., 1:].clone()
            targets[0, 0, :2] = -100  # ignored: worker 0's loss is its mean over fewer targets
            yield tokens[..., :-1], targets


def template(kind: str, dtype):
    torch.manual_seed(0)
    return MODELS[kind]().to(dtype)


def schedule(step: int) -> float:
    return 2e-2 * (0.3 + 0.7 * math.cos(math.pi * step / (2 * STEPS)))


def reference_gamma(consensus, step: int) -> float:
    """γ_t written out: (lr_t / max lr)^p from start·T on, 1 before."""
    if not isinstance(consensus, AdaptiveConsensus):
        return consensus
    if step < consensus.start * STEPS:
        return 1.0
    return (schedule(step) / max(schedule(s) for s in range(STEPS + 1))) ** consensus.power


def run_both(
    kind,
    dtype,
    topology,
    order,
    max_norm,
    consensus,
    implementations=({"foreach": False},),
    steps=STEPS,
    target=None,
    vmap=True,
    **options,
):
    # one way of taking the gradients, not vmap="auto"'s timed choice: a loaded machine may
    # choose the loop, whose float64 rounding sits farther from the copies' (2.6e-12 against
    # 9.3e-13 for the transformer on a ring, ATC, clipped, adaptive)
    model = template(kind, dtype)
    trainer = DecentralizedTrainer(
        model,
        WORKERS,
        topology=TOPOLOGIES[topology](),
        order=order,
        lr=schedule,
        weight_decay=0.1,
        max_norm=max_norm,
        consensus=consensus,
        total_steps=STEPS,
        target=target,
        vmap=vmap,
        **options,
    )
    references = [
        ReferenceWorkers(
            model,
            WORKERS,
            topology=TOPOLOGIES[topology](),
            order=order,
            lr=schedule(0),
            weight_decay=0.1,
            max_norm=max_norm,
            implementation=implementation,
        )
        for implementation in implementations
    ]
    for step, (inputs, targets) in enumerate(batches(kind, dtype, steps)):
        ours = trainer.step(inputs, targets)
        for reference in references:
            theirs = reference.step(
                inputs, targets, cross_entropy, lr=schedule(step), gamma=reference_gamma(consensus, step)
            )
        torch.testing.assert_close(ours.losses, theirs, rtol=1e3 * EPS[dtype], atol=0)
    return trainer, references


def relative_difference(ours: dict, theirs: dict) -> float:
    """Normwise: max |ours − theirs| / max |theirs| over every parameter of every worker."""
    largest = max(float(theirs[name].abs().max()) for name in theirs)
    return max(float((ours[name].double() - theirs[name].double()).abs().max()) for name in theirs) / largest


def side_by_side(model, data, workers=WORKERS, lr=1e-2, **options):
    """The trainer and the reference, built with the same options, after both stepped through ``data``."""
    trainer = DecentralizedTrainer(model, workers, lr=lr, **options)
    reference = ReferenceWorkers(model, workers, lr=lr, **options)
    step_both(trainer, reference, data, lr)
    return trainer, reference


def step_both(trainer, reference, data, lr):
    for inputs, targets in data:
        trainer.step(inputs, targets)
        reference.step(inputs, targets, cross_entropy, lr=lr)


CONSENSUS = {"fixed": 0.7, "adaptive": AdaptiveConsensus(power=1.5, start=0.3)}
OPTIONS = (MODELS, TOPOLOGIES, ("awc", "atc"), (None, 0.05), CONSENSUS)
CASES = list(itertools.product(*OPTIONS))
# The float32 test runs three trainers more than the float64 one: every pair of options, where
# the float64 test takes every combination (the mixing's options meet in every combination on
# flat rows, tests/test_decentral.py; here each is the trainer's plumbing around them)
PAIRED_CASES = all_pairs(*OPTIONS)


# -- parity ------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(SIMULATOR, reason="CPU: 20 steps of three models against torch.optim")
@pytest.mark.parametrize("kind, topology, order, max_norm, consensus", CASES)
def test_float64_trajectory_equals_module_copies_with_torch_adamw(kind, topology, order, max_norm, consensus):
    trainer, (reference,) = run_both(kind, torch.float64, topology, order, max_norm, CONSENSUS[consensus])
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-12
    for name, stacked in trainer.buffers.items():  # BatchNorm's statistics, each worker's own
        expected = torch.stack([dict(model.named_buffers())[name] for model in reference.models])
        torch.testing.assert_close(stacked, expected, rtol=1e-12, atol=0)


@pytest.mark.skipif(SIMULATOR, reason="CPU: 20 steps of three models against torch.optim")
@pytest.mark.parametrize("kind", MODELS)
def test_float64_trajectory_by_the_loop_over_workers_equals_module_copies(kind):
    """The other way of taking the gradients (vmap=False, and what vmap="auto" may choose): one
    worker's module at a time. Its float64 rounding sits farther from the copies' than vmap's
    (2.6e-12 measured for the transformer on a ring, ATC, clipped, adaptive), within 1e-11."""
    trainer, (reference,) = run_both(kind, torch.float64, "ring", "atc", 0.05, CONSENSUS["adaptive"], vmap=False)
    assert trainer.gradients_by["way"] == "loop"
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-11


def test_the_float32_table_meets_every_pair_of_options():
    assert pairs_met(PAIRED_CASES) == pairs_met(CASES) and len(PAIRED_CASES) < len(CASES) / 4


@pytest.mark.skipif(SIMULATOR, reason="CPU: 20 steps of three models against torch.optim")
@pytest.mark.parametrize("kind, topology, order, max_norm, consensus", PAIRED_CASES)
def test_float32_trajectory_is_as_close_to_the_exact_one_as_torchs_own(kind, topology, order, max_norm, consensus):
    """float32 rounding is amplified along a trajectory (AdamW normalises small gradients, as
    of rare bytes' embedding rows), so "a few ulp" is measured where it can be: the distance
    to the float64 trajectory from the same start, against that of torch's own float32 AdamW
    (foreach=False and fused=True; foreach=True steps to foreach=False's bits on the CPU, the
    test below), whose spread is printed on failure."""
    trainer, references = run_both(
        kind,
        torch.float32,
        topology,
        order,
        max_norm,
        CONSENSUS[consensus],
        implementations=({"foreach": False}, {"fused": True}),
    )
    exact = ReferenceWorkers(
        template(kind, torch.float32).double(),
        WORKERS,
        topology=TOPOLOGIES[topology](),
        order=order,
        lr=schedule(0),
        weight_decay=0.1,
        max_norm=max_norm,
    )
    for step, (inputs, targets) in enumerate(batches(kind, torch.float32, STEPS)):
        exact.step(
            inputs.double() if inputs.is_floating_point() else inputs,
            targets,
            cross_entropy,
            lr=schedule(step),
            gamma=reference_gamma(CONSENSUS[consensus], step),
        )
    truth = exact.stacked()
    theirs = [relative_difference(reference.stacked(), truth) for reference in references]
    ours = relative_difference(trainer.stacked_parameters(), truth)
    spread = max(relative_difference(reference.stacked(), references[0].stacked()) for reference in references[1:])
    assert ours <= max(4 * max(theirs), 16 * EPS[torch.float32]), (ours, theirs, spread)


@pytest.mark.skipif(SIMULATOR, reason="CPU: torch.optim against itself")
@pytest.mark.parametrize("kind", MODELS)
def test_torchs_foreach_adamw_steps_to_its_single_tensor_bits_on_the_cpu(kind):
    """Why the float32 test above measures torch's spread without foreach=True: on the CPU it
    gives the bits of foreach=False along a whole trajectory, clipped and mixed (if a torch
    version changes that, this fails, and foreach=True goes back into that test)."""
    _, (single, foreach) = run_both(
        kind,
        torch.float32,
        "ring",
        "atc",
        0.05,
        CONSENSUS["adaptive"],
        implementations=({"foreach": False}, {"foreach": True}),
    )
    for name, stacked in single.stacked().items():
        assert torch.equal(stacked, foreach.stacked()[name]), name


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_clipping_uses_each_workers_norm_before_clipping_and_reports_it():
    model = template("mlp", torch.float64)
    trainer = DecentralizedTrainer(model, WORKERS, topology=decentral.ring(), lr=1e-2, max_norm=0.01)
    inputs, targets = next(batches("mlp", torch.float64, 1))
    result = trainer.step(inputs, targets)
    for worker in range(WORKERS):
        replica = template("mlp", torch.float64)
        cross_entropy(replica(inputs[worker]), targets[worker]).backward()
        norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in replica.parameters()]))
        assert float(result.grad_norms[worker]) == pytest.approx(float(norm), rel=1e-13)
        assert float(result.losses[worker]) == pytest.approx(
            float(cross_entropy(replica(inputs[worker]), targets[worker]).detach()), rel=1e-14
        )


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_one_worker_is_torch_adamw():
    trainer, reference = side_by_side(
        template("cnn", torch.float64),
        batches("cnn", torch.float64, 6, workers=1),
        workers=1,
        topology=decentral.one_peer_exponential(),
        weight_decay=0.1,
        max_norm=0.05,
    )
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-13
    assert trainer.consensus_distance() == 0.0


# -- what the trainer holds --------------------------------------------------------------------------------------


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_workers_start_from_the_template_in_an_arena_of_64_padded_rows_and_the_template_is_never_changed():
    model = template("mlp", torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = DecentralizedTrainer(model, WORKERS, topology=decentral.complete(), lr=1e-2)
    (rows,) = trainer.rows
    assert rows.shape == (WORKERS, 5 * 64) and rows.dtype == torch.float32  # 72, 12, 36, 3 elements padded to 64s
    for name, stacked in trainer.stacked_parameters().items():
        assert stacked.data_ptr() >= rows.data_ptr() and torch.equal(stacked, before[name].expand_as(stacked))
    for inputs, targets in batches("mlp", torch.float32, 3):
        trainer.step(inputs, targets)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert torch.count_nonzero(rows[:, 72:128]) == 0  # padding stays zero


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_weight_decay_predicate_and_groups_with_their_own_lr_scale_and_weight_decay():
    model = template("mlp", torch.float64)
    groups = [{"params": model[2].parameters(), "lr_scale": 0.5, "weight_decay": 0.3}]
    trainer = DecentralizedTrainer(
        model,
        WORKERS,
        topology=decentral.one_peer_exponential(),
        lr=1e-2,
        weight_decay=0.1,
        decay=lambda name, p: name == "0.weight",
        groups=groups,
    )
    assert len(trainer.rows) == 2  # group 2 (scale 0.5, decay 0.3) is a launch of its own

    def group_of(name, p):
        return (0.5, 0.3) if name.startswith("2.") else (1.0, 0.1 if name == "0.weight" else 0.0)

    reference = ReferenceWorkers(model, WORKERS, topology=decentral.one_peer_exponential(), lr=1e-2, group_of=group_of)
    for inputs, targets in batches("mlp", torch.float64, 8):
        trainer.step(inputs, targets)
        reference.step(inputs, targets, cross_entropy, lr=1e-2)
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-12
    assert trainer.params.shape == (WORKERS, sum(rows.shape[1] for rows in trainer.rows))


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_groups_that_differ_only_by_no_weight_decay_share_one_tensor():
    model = template("mlp", torch.float32)
    biases = [model[0].bias, model[2].bias]
    trainer = DecentralizedTrainer(
        model, WORKERS, topology=decentral.ring(), weight_decay=0.1, groups=[{"params": biases, "weight_decay": 0.0}]
    )
    assert len(trainer.rows) == 1


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_frozen_parameters_stay_frozen_and_identical_across_workers():
    model = template("mlp", torch.float64)
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    trainer, reference = side_by_side(
        model, batches("mlp", torch.float64, 5), topology=decentral.ring(), weight_decay=0.1
    )
    assert "0.weight" not in trainer.stacked_parameters()
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-12
    for worker in range(WORKERS):
        assert torch.equal(trainer.worker_model(worker)[0].weight, frozen)
    assert torch.equal(trainer.mean_model()[0].weight, frozen)


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_learning_rate_number_callable_token_schedule_and_partial_token_lr_agree():
    settings = dict(workers=WORKERS, batch=10, context=1, warmup_tokens=80, total_tokens=400, base_lr=1e-2, min_lr=1e-3)
    schedule = TokenSchedule(**settings)
    trainers = [  # one way for all (vmap="auto" times both, and may choose apart: another rounding)
        DecentralizedTrainer(template("mlp", torch.float64), WORKERS, topology=decentral.ring(), lr=lr, vmap=True)
        for lr in (
            schedule,
            functools.partial(decentral.token_lr, **settings),
            lambda step: decentral.token_lr(step, **settings),
        )
    ]
    assert trainers[0].total_steps == trainers[1].total_steps == 10 and trainers[2].total_steps is None
    for inputs, targets in batches("mlp", torch.float64, 4):
        for trainer in trainers:
            trainer.step(inputs, targets)
    assert all(torch.equal(trainer.params, trainers[0].params) for trainer in trainers[1:])
    assert trainers[0].learning_rate(3) == decentral.token_lr(3, **settings)
    with pytest.raises(ValueError, match="total_steps"):
        DecentralizedTrainer(
            template("mlp", torch.float64), WORKERS, topology=decentral.ring(), lr=1e-3, consensus=AdaptiveConsensus()
        )
    with pytest.raises(ValueError, match=r"lr\(0\)"):
        DecentralizedTrainer(
            template("mlp", torch.float64), WORKERS, topology=decentral.ring(), lr=lambda step: -1.0
        ).step(*next(batches("mlp", torch.float64, 1)))


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_mean_model_consensus_distance_and_errors_against_the_module_copies():
    trainer, (reference,) = run_both("cnn", torch.float64, "ring", "awc", 0.05, 0.7, steps=4)
    mean = trainer.mean_model()
    for name, p in mean.named_parameters():
        expected = torch.stack([dict(model.named_parameters())[name].detach() for model in reference.models]).mean(0)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=1e-15)
    expected_buffer = torch.stack([model.norm.running_var for model in reference.models]).mean(0)
    torch.testing.assert_close(mean.norm.running_var, expected_buffer, rtol=1e-12, atol=0)
    stacked = reference.stacked()
    flat = torch.cat([stacked[name].flatten(1) for name in stacked], dim=1)
    distance = float(((flat - flat.mean(0)) ** 2).sum(1).mean())
    assert trainer.consensus_distance() == pytest.approx(distance, rel=1e-9)
    errors = trainer.consensus_errors()
    assert errors.shape == trainer.params.shape and float(errors.sum(0).abs().max()) < 1e-15
    assert trainer.mean_model(into=mean) is mean
    worker = trainer.worker_model(2)
    torch.testing.assert_close(
        worker.conv.weight.detach(), reference.models[2].conv.weight.detach(), rtol=1e-12, atol=0
    )


@pytest.mark.skipif(SIMULATOR, reason="CPU")
@pytest.mark.parametrize("groups, compression", [(False, None), (True, None), (True, "int8"), (True, "outer")])
def test_save_and_load_continue_bit_for_bit(tmp_path, groups, compression):
    def build():
        model = template("cnn", torch.float32)
        options = {"groups": [{"params": model.head.parameters(), "lr_scale": 0.5}]} if groups else {}
        if compression == "int8":
            options |= {"compression": compress.int8(), "seed": 3}
        elif compression == "outer":  # rounds of 3 steps: saved mid-round, with int8 error feedback
            options |= {"outer": decentral.DiLoCo(every=3), "compression": compress.int8()}
        return DecentralizedTrainer(
            model,
            WORKERS,
            topology=decentral.one_peer_exponential(),
            order="atc",
            lr=schedule,
            weight_decay=0.1,
            max_norm=0.05,
            consensus=1.0 if compression == "outer" else AdaptiveConsensus(start=0.1),
            total_steps=STEPS,
            **options,
        )

    data = list(batches("cnn", torch.float32, 8))
    straight = build()
    for step, (inputs, targets) in enumerate(data):
        straight.step(inputs, targets)
        if step == 3:
            halfway = straight
            halfway.save(tmp_path / "run.npz", extra={"epoch": 1})
    resumed = build()
    assert resumed.load(tmp_path / "run.npz") == {"epoch": 1}
    assert resumed.t == 4
    for inputs, targets in data[4:]:
        resumed.step(inputs, targets)
    assert torch.equal(resumed.params, straight.params)
    assert all(torch.equal(resumed.buffers[name], straight.buffers[name]) for name in straight.buffers)
    for ours, theirs in zip(resumed.optimizers, straight.optimizers):
        assert torch.equal(ours.exp_avg_sq, theirs.exp_avg_sq)
        for name, buffer in theirs.buffers.items():
            assert torch.equal(ours.buffers[name], buffer), name
    np.testing.assert_array_equal(resumed.bytes_sent, straight.bytes_sent)
    flat = decentral.DecentralizedAdamW.load(tmp_path / "run.npz")  # a decentral checkpoint underneath
    assert flat.t == 4 and flat.params.shape[0] == WORKERS
    other = DecentralizedTrainer(
        template("mlp", torch.float32), WORKERS, topology=decentral.one_peer_exponential(), order="atc"
    )
    with pytest.raises(ValueError, match="other parameters"):
        other.load(tmp_path / "run.npz")


class TiedEmbedding(torch.nn.Module):
    """The output layer shares the embedding's weight (as language models often do)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mid(self.embed(tokens))))


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_tied_weights_are_one_parameter_in_the_arena_and_stay_tied():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    data = [tuple(torch.randint(0, 20, (WORKERS, 6), generator=generator) for _ in range(2)) for _ in range(5)]
    trainer, reference = side_by_side(TiedEmbedding().double(), data, topology=decentral.ring(), weight_decay=0.1)
    assert list(trainer.stacked_parameters()) == ["embed.weight", "mid.weight", "mid.bias"]
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-12
    mean = trainer.mean_model()
    assert mean.head.weight is mean.embed.weight


# -- failures leave everything as it was -----------------------------------------------------------------------------


def snapshot(trainer):
    return (
        [t.clone() for t in trainer.rows],
        [o.exp_avg.clone() for o in trainer.optimizers],
        {name: b.clone() for name, b in trainer.buffers.items()},
        trainer.t,
    )


def unchanged(trainer, before):
    rows, moments, buffers, t = before
    return (
        all(torch.equal(a, b) for a, b in zip(trainer.rows, rows))
        and trainer.t == t
        and all(torch.equal(o.exp_avg, m) for o, m in zip(trainer.optimizers, moments))
        and all(torch.equal(trainer.buffers[name], b) for name, b in buffers.items())
    )


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_a_non_finite_loss_names_the_workers_and_writes_nothing_buffers_included():
    trainer = DecentralizedTrainer(template("cnn", torch.float32), WORKERS, topology=decentral.ring(), lr=1e-2)
    data = list(batches("cnn", torch.float32, 2))
    trainer.step(*data[0])
    before = snapshot(trainer)
    inputs, targets = data[1]
    inputs = inputs.clone()
    inputs[1, 0, 0, 0, 0] = float("nan")
    inputs[3, 2, 0, 1, 1] = float("inf")
    with pytest.raises(NonFiniteGradientError, match=r"loss on worker\(s\) \[1, 3\] at step 1") as raised:
        trainer.step(inputs, targets)
    assert raised.value.workers == [1, 3] and raised.value.what == "loss"
    assert unchanged(trainer, before)


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_a_non_finite_gradient_with_a_finite_loss_names_the_worker_and_writes_nothing():
    model = torch.nn.Linear(2, 1, bias=False).double()
    trainer = DecentralizedTrainer(model, 3, topology=decentral.complete(), lr=1e-2)
    before = snapshot(trainer)
    inputs = torch.ones(3, 1, 2, dtype=torch.float64)
    inputs[2] = 0.0  # output exactly 0: the gradient of sqrt(|y|) there is inf·0 = NaN, the loss 0

    def loss_fn(outputs, targets):
        return outputs.abs().sqrt().sum()

    with pytest.raises(NonFiniteGradientError, match=r"gradient on worker\(s\) \[2\]"):
        trainer.step(inputs, torch.zeros(3, 1), loss_fn)
    assert unchanged(trainer, before)


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_bad_input_is_refused_by_name_before_anything_is_written():
    trainer = DecentralizedTrainer(template("mlp", torch.float32), WORKERS, topology=decentral.ring(), lr=1e-2)
    inputs, targets = next(batches("mlp", torch.float32, 1))
    before = snapshot(trainer)
    with pytest.raises(ValueError, match=r"inputs must have a leading axis of 4.*\(3, 10, 6\)"):
        trainer.step(inputs[:3], targets)
    with pytest.raises(ValueError, match="targets must have a leading axis of 4"):
        trainer.step(inputs, targets[:2])
    with pytest.raises(TypeError, match="targets must hold tensors"):
        trainer.step(inputs, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="loss_fn must return one scalar tensor per worker"):
        trainer.step(
            inputs,
            targets,
            lambda outputs, targets: torch.nn.functional.cross_entropy(outputs, targets, reduction="none"),
        )
    assert unchanged(trainer, before)
    mixed = mlp()
    mixed[2].double()
    with pytest.raises(
        ValueError, match=r"one device and dtype.*'0.weight' is torch.float32.*'2.weight' is torch.float64"
    ):
        DecentralizedTrainer(mixed, WORKERS, topology=decentral.ring())
    with pytest.raises(TypeError, match="module's parameters are torch.complex64"):
        DecentralizedTrainer(mlp().to(torch.complex64), WORKERS, topology=decentral.ring())
    with pytest.raises(ValueError, match=r"must be \(4, 4\)"):
        DecentralizedTrainer(mlp(), WORKERS, topology=decentral.from_matrix(np.full((3, 3), 1 / 3)))
    with pytest.raises(ValueError, match="consensus must be a number in"):
        DecentralizedTrainer(mlp(), WORKERS, topology=decentral.ring(), consensus="0.5")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        DecentralizedTrainer(lambda x: x, WORKERS, topology=decentral.ring())
    with pytest.raises(ValueError, match="workers must be a whole number"):
        DecentralizedTrainer(mlp(), 0, topology=decentral.ring())
    model = mlp()
    with pytest.raises(ValueError, match="in two groups"):
        DecentralizedTrainer(
            model,
            WORKERS,
            topology=decentral.ring(),
            groups=[{"params": [model[0].weight]}, {"params": [model[0].weight]}],
        )
    with pytest.raises(ValueError, match="not a parameter of module"):
        DecentralizedTrainer(model, WORKERS, topology=decentral.ring(), groups=[{"params": [torch.zeros(2)]}])
    with pytest.raises(ValueError, match="unknown keys"):
        DecentralizedTrainer(model, WORKERS, topology=decentral.ring(), groups=[{"params": [model[0].weight], "lr": 1}])


class DataDependent(torch.nn.Module):
    """Control flow on a tensor's value: vmap cannot batch it."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.layer(x) if x.sum() > 0 else -self.layer(x)


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_a_module_vmap_cannot_batch_is_stepped_one_worker_at_a_time_with_a_warning():
    torch.manual_seed(0)
    data = list(batches("mlp", torch.float64, 3))
    model, options = DataDependent().double(), dict(topology=decentral.ring(), lr=1e-2, weight_decay=0.1)
    trainer = DecentralizedTrainer(model, WORKERS, vmap=True, **options)
    reference = ReferenceWorkers(model, WORKERS, **options)
    with pytest.warns(RuntimeWarning, match="DataDependent cannot be vmapped.*one at a time"):
        step_both(trainer, reference, data[:1], 1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        step_both(trainer, reference, data[1:], 1e-2)
    assert not trainer.vmap
    assert relative_difference(trainer.stacked_parameters(), reference.stacked()) < 1e-12
    # chosen rather than asked for: the loop, without a warning, and the reason reported
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = DecentralizedTrainer(model, WORKERS, **options)
        for inputs, targets in data:
            chosen.step(inputs, targets)
    assert chosen.gradients_by["way"] == "loop" and chosen.gradients_by["why"].startswith("vmap cannot batch it")
    assert relative_difference(chosen.stacked_parameters(), reference.stacked()) < 1e-12


class Regularized(torch.nn.Module):
    """BatchNorm's running statistics (buffers) and dropout (random numbers): what timing the
    two ways on the first batch could leave behind."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(6, 12),
            torch.nn.BatchNorm1d(12),
            torch.nn.Dropout(0.3),
            torch.nn.Tanh(),
            torch.nn.Linear(12, 3),
        )

    def forward(self, x):
        return self.layers(x)


@pytest.mark.skipif(SIMULATOR, reason="CPU: timing the two ways")
@pytest.mark.parametrize("slower", ["_looped", "_vmapped"])
def test_auto_keeps_the_faster_way_and_steps_as_if_it_had_been_fixed(slower, monkeypatch, tmp_path):
    slow = getattr(DecentralizedTrainer, slower)

    def slowed(self, *arguments):
        result = slow(self, *arguments)
        time.sleep(0.05)  # far beyond the margin, whatever the machine's noise
        return result

    monkeypatch.setattr(DecentralizedTrainer, slower, slowed)
    data = list(batches("mlp", torch.float64, 3))
    chosen = "vmap" if slower == "_looped" else "loop"
    runs = {}
    for vmap in ("auto", chosen == "vmap"):
        torch.manual_seed(5)  # dropout's draws: the same for both runs
        trainer = DecentralizedTrainer(Regularized().double(), WORKERS, topology=decentral.ring(), lr=1e-2, vmap=vmap)
        assert trainer.gradients_by["way"] == (None if vmap == "auto" else chosen)
        for inputs, targets in data:
            trainer.step(inputs, targets)
        runs[vmap] = trainer
    auto, fixed = runs["auto"], runs[chosen == "vmap"]
    report = auto.gradients_by
    assert report["way"] == chosen and set(report["seconds"]) == {"vmap", "loop"}
    assert report["seconds"][chosen] * 1.5 < report["seconds"]["loop" if chosen == "vmap" else "vmap"]
    assert report["why"].startswith(f"timed on the first batch: {chosen}")
    # the timing left no trace: the same parameters and running statistics, bit for bit
    for name, stacked in fixed.stacked_parameters().items():
        assert torch.equal(auto.stacked_parameters()[name], stacked), name
    for name, stacked in fixed.buffers.items():
        assert torch.equal(auto.buffers[name], stacked), name
    # a checkpoint keeps the choice: the resumed run continues as it ran, without timing again
    auto.save(tmp_path / "run.npz")
    resumed = DecentralizedTrainer(Regularized().double(), WORKERS, topology=decentral.ring(), lr=1e-2)
    resumed.load(tmp_path / "run.npz")
    assert resumed.gradients_by == {"way": chosen, "seconds": None, "why": "as the run that saved the checkpoint chose"}


def test_vmap_takes_true_false_or_auto():
    with pytest.raises(ValueError, match="vmap must be True, False or 'auto'; got 'yes'"):
        DecentralizedTrainer(mlp(), WORKERS, topology=decentral.ring(), vmap="yes")


# -- both targets ----------------------------------------------------------------------------------------------------


def test_both_targets_agree_and_the_views_stay_live(target):
    """The kernel steps the workers in place on both targets: the views the module is called
    with, and the models built from them, read the one buffer after every step."""
    model = template("mlp", torch.float32)
    results = {}
    for where in dict.fromkeys([target, "cpu"]):
        # a GPU: the module and its batches there; the simulator: the CPU module, target forced
        device = "cuda" if where == "cuda" and not SIMULATOR else "cpu"
        trainer = DecentralizedTrainer(
            copy.deepcopy(model).to(device),
            2,
            topology=decentral.one_peer_exponential(),
            order="atc",
            lr=1e-2,
            max_norm=0.05,
            weight_decay=0.1,
            target=where if SIMULATOR else None,
        )
        places = []
        for step, (inputs, targets) in enumerate(batches("mlp", torch.float32, 3, workers=2)):
            trainer.step(inputs.to(device), targets.to(device))
            (rows,) = trainer.rows
            places.append(rows.data_ptr())
            for name, view in trainer.stacked_parameters().items():
                assert view.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()
            mean = trainer.mean_model()
            torch.testing.assert_close(mean[0].bias.detach(), trainer.stacked_parameters()["0.bias"].mean(0))
        results[where] = trainer.params.cpu()
        assert len(set(places)) == 1
    torch.testing.assert_close(results[target], results["cpu"], rtol=2e-6, atol=1e-7)


# -- curvature at the mean model ---------------------------------------------------------------------------------------


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_hvp_and_gradient_at_the_mean_model_against_torch_autograd():
    model = template("mlp", torch.float64)
    trainer = DecentralizedTrainer(model, WORKERS, topology=decentral.ring(), lr=1e-2)
    data = list(batches("mlp", torch.float64, 3))
    for inputs, targets in data[:2]:
        trainer.step(inputs, targets)
    inputs, targets = data[2][0][0], data[2][1][0]
    mean = trainer.mean_model()
    params = list(mean.parameters())
    loss = cross_entropy(mean(inputs), targets)
    gradients = torch.autograd.grad(loss, params, create_graph=True)
    vector = torch.randn(trainer.params.shape[1], dtype=torch.float64)
    vector[np.setdiff1d(np.arange(vector.numel()), trainer.parameter_indices)] = 0.0
    pieces = [
        vector[trainer.parameter_indices][start : start + p.numel()].view_as(p)
        for start, p in zip(np.cumsum([0] + [p.numel() for p in params]), params)
    ]
    products = torch.autograd.grad(sum((g * v).sum() for g, v in zip(gradients, pieces)), params)
    expected = torch.cat([p.flatten() for p in products])
    ours = trainer.hvp(inputs, targets)(vector[None].numpy())[0]
    np.testing.assert_allclose(ours[trainer.parameter_indices], expected.numpy(), rtol=1e-10, atol=1e-14)
    assert np.count_nonzero(np.delete(ours, trainer.parameter_indices)) == 0
    flat_gradient = torch.cat([g.flatten() for g in gradients]).detach()
    np.testing.assert_allclose(
        trainer.gradient(inputs, targets)[trainer.parameter_indices].numpy(),
        flat_gradient.numpy(),
        rtol=1e-12,
        atol=1e-15,
    )


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_the_trainers_hessian_streams_batches_in_its_packed_layout():
    """trainer.hessian over batches of 3, 5 and 4 samples is the loss of their concatenation
    (ḡ, H·v, the loss), in float64 for a float32 trainer when asked; padding has no curvature."""
    from steadystep.torch.curvature import ModuleHessian

    model = template("mlp", torch.float32)
    trainer = DecentralizedTrainer(model, WORKERS, topology=decentral.ring(), lr=1e-2)
    for inputs, targets in list(batches("mlp", torch.float32, 2)):
        trainer.step(inputs, targets)
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randn(12, *next(iter(batches("mlp", torch.float32, 1)))[0].shape[2:], generator=generator)
    targets = torch.randint(0, 3, (12,), generator=generator)
    parts = [(inputs[:3], targets[:3]), (inputs[3:8], targets[3:8]), (inputs[8:], targets[8:])]
    streamed = trainer.hessian(parts, dtype=torch.float64)
    whole = trainer.hessian([(inputs, targets)], dtype=torch.float64)
    assert isinstance(streamed, ModuleHessian) and streamed.dim == trainer.params.shape[1]
    vectors = np.random.default_rng(0).normal(size=(3, streamed.dim))
    products = streamed(vectors)
    np.testing.assert_allclose(products, whole(vectors), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(streamed.gradient(), whole.gradient(), rtol=1e-12, atol=1e-15)
    assert streamed.loss() == pytest.approx(whole.loss(), rel=1e-13)
    padding = np.setdiff1d(np.arange(streamed.dim), trainer.parameter_indices)
    assert np.count_nonzero(products[:, padding]) == 0
    single = trainer.hvp(inputs, targets)(vectors.astype(np.float32))  # the trainer's dtype: float32
    np.testing.assert_allclose(single, products, rtol=1e-4, atol=1e-5 * np.abs(products).max())
    assert trainer.gradient(inputs, targets).dtype == torch.float32


@pytest.mark.skipif(SIMULATOR, reason="CPU")
@pytest.mark.parametrize("order", ["awc", "atc"])
def test_compressed_gossip_trains_modules_as_it_trains_flat_rows(order):
    """Identity compression is the plain trainer within rounding; int8's two classes of
    parameters each keep public copies, count their bytes, and agree more the more they gossip."""
    data = list(batches("mlp", torch.float64, 6))

    def run(**options):
        model = template("mlp", torch.float64)
        groups = [{"params": model[-1].parameters(), "lr_scale": 0.5}]
        trainer = DecentralizedTrainer(
            model, WORKERS, topology=decentral.ring(), order=order, lr=1e-2, groups=groups, **options
        )
        for inputs, targets in data:
            trainer.step(inputs, targets)
        return trainer

    plain, identity = run(), run(compression=compress.identity())
    torch.testing.assert_close(identity.params, plain.params, rtol=0, atol=1e-14)
    quantized = run(compression=compress.int8(), seed=1)
    assert len(quantized.optimizers) == 2 and all(o.public is not None for o in quantized.optimizers)
    width = sum(rows.shape[1] for rows in quantized.rows)
    assert quantized.bytes_sent[0] < plain.bytes_sent[0] / 3.5 and plain.bytes_sent[0] == len(data) * width * 8
    assert not torch.equal(quantized.params, plain.params)
    torch.testing.assert_close(quantized.params, plain.params, rtol=0, atol=1e-2)


@pytest.mark.skipif(SIMULATOR, reason="CPU")
def test_the_outer_step_of_modules_with_lr_one_and_no_momentum_every_step_is_complete_atc():
    data = list(batches("mlp", torch.float64, 5))

    def run(**options):
        model = template("mlp", torch.float64)
        groups = [{"params": model[-1].parameters(), "lr_scale": 0.5}]
        trainer = DecentralizedTrainer(
            model, WORKERS, topology=decentral.complete(), order="atc", lr=1e-2, groups=groups, **options
        )
        for inputs, targets in data:
            trainer.step(inputs, targets)
        return trainer

    outer = run(outer=decentral.DiLoCo(every=1, lr=1.0, momentum=0.0))
    torch.testing.assert_close(outer.params, run().params, rtol=0, atol=1e-14)
    local = run(outer=decentral.DiLoCo(every=2))
    assert local.bytes_sent[0] == outer.bytes_sent[0] * 2 / 5  # two rounds in five steps
