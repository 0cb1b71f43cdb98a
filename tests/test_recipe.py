"""ARCHITECTURE.md's "Adding a formula" and "Adding an optimizer" recipes, followed for a toy
module: the formula file is generated for both targets, and the public function made from it
runs on the target this process tests (the CPU, or the CUDA kernels on Numba's simulator) and
agrees with NumPy; a fused optimizer declared in the same file becomes a functional step with
one export line, and its torch drop-in follows from it."""

import importlib.util
import inspect
import shutil
import sys

import numpy as np
import pytest

from steadystep import codegen, registry

TOY = '''"""A toy formula module, as the recipe adds one."""

from steadystep.kernels import Step


def scaled_difference(a, b, scale):
    """The difference of a and b, scaled.

    (a − b)·scale
    """
    return (a - b) * scale


def heavy_ball_step(param, grad, velocity, decay, lr, momentum, weight_decay, gradient_sign):
    """Heavy-ball momentum with decoupled weight decay.

    v ← μ·v + g; p ← p − lr·(v + λ·p)
    """
    velocity = momentum * velocity + grad * gradient_sign
    return param - lr * (velocity + weight_decay * decay * param), velocity


STEPS = (
    Step(
        "heavy_ball",
        "heavy_ball_step",
        ("param", "grad", "velocity"),
        ("param", "velocity"),
        gradient="grad",
        mask="decay",
        sign="gradient_sign",
        names=(("decay", "decay_mask"),),
        hyperparameters=(("lr", 1e-3), ("momentum", 0.9), ("weight_decay", 0.0)),
        drop_in="HeavyBall",
    ),
)
'''


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy(tmp_path, monkeypatch, target):
    kernels = tmp_path / "kernels"
    shutil.copytree(codegen.KERNELS, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    (kernels / "toy.py").write_text(TOY)  # step 1: the formula
    monkeypatch.setattr(codegen, "KERNELS", kernels)
    # step 4: generate it for both targets (each file where codegen would write it, here a copy)
    for each in codegen.TARGETS:
        generated = tmp_path / each.name / "toy.py"
        generated.parent.mkdir()
        generated.write_text(codegen.generate_module("toy", each))
        _load(f"steadystep.{each.name}._generated.toy", generated)  # where dispatch finds a target's kernels
    formulas = _load("steadystep.kernels.toy", kernels / "toy.py")
    yield registry.elementwise(formulas.scaled_difference)  # step 2: the public function
    for name in ("steadystep.kernels.toy", *(f"steadystep.{each.name}._generated.toy" for each in codegen.TARGETS)):
        sys.modules.pop(name, None)


def test_a_new_formula_generates_and_runs_on_the_target(toy, target):
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a, b = rng.normal(size=(2, 37)).astype(dtype)
        result = toy(a, b, dtype(0.5), target=target)
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, (a - b) * dtype(0.5))  # step 3: its NumPy reference
    assert toy(3.0, 1.0, 2.0) == 4.0  # Python numbers: the float64 formula directly
    assert toy.formula.formula == "(a − b)·scale" and toy.formula.module == "toy"


def _heavy_ball(param, grad, velocity, lr=1e-3, momentum=0.9, weight_decay=0.0, decay=1.0, sign=1.0, scale=1.0):
    """The toy optimizer in plain NumPy: the reference."""
    velocity = momentum * velocity + grad * scale * sign
    return param - lr * (velocity + weight_decay * decay * param), velocity


@pytest.fixture
def heavy_ball(toy, monkeypatch):
    from steadystep import optim

    monkeypatch.setattr(optim, "FUSED", dict(optim.FUSED))  # what fused_step registers goes with the test
    return optim.fused_step("heavy_ball", module="toy")  # the export line (in optim.py: module "optim")


def test_a_new_fused_optimizer_is_a_functional_step_from_its_catalog_entry(heavy_ball, target):
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        param, grad, velocity = rng.normal(size=(3, 41)).astype(dtype)
        mask = (rng.random(41) < 0.5).astype(dtype)
        expected = _heavy_ball(
            param, grad, velocity, lr=0.1, momentum=0.5, weight_decay=0.01, decay=mask, sign=-1.0, scale=0.5
        )
        heavy_ball(
            param, grad, velocity, lr=0.1, momentum=0.5, weight_decay=0.01,
            maximize=True, decay_mask=mask, grad_scale=0.5, target=target,
        )  # fmt: skip
        tolerance = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=0)
        np.testing.assert_allclose(param, expected[0].astype(dtype), **tolerance)
        np.testing.assert_allclose(velocity, expected[1].astype(dtype), **tolerance)
        before = param.copy(), velocity.copy()
        heavy_ball(param, grad, velocity, found_inf=np.ones(1, dtype), target=target)  # AMP's overflow: nothing moves
        np.testing.assert_array_equal(param, before[0])
        np.testing.assert_array_equal(velocity, before[1])
        heavy_ball(param, grad, velocity, target=target)  # the declared defaults
        np.testing.assert_allclose(param, _heavy_ball(before[0], grad, before[1])[0].astype(dtype), **tolerance)
    with pytest.raises(ValueError, match="momentum"):
        heavy_ball(param, grad, velocity, momentum=-0.5)
    with pytest.raises(TypeError, match="beta"):
        heavy_ball(param, grad, velocity, beta=0.5)
    names = ["param", "grad", "velocity", "lr", "momentum", "weight_decay"]
    assert list(inspect.signature(heavy_ball).parameters)[:6] == names
    assert "v ← μ·v + g" in heavy_ball.__doc__


def test_a_new_fused_optimizer_gets_its_torch_drop_in(heavy_ball):
    torch = pytest.importorskip("torch")
    from steadystep.torch.optim import drop_in

    HeavyBall = drop_in(heavy_ball)
    assert HeavyBall.__name__ == "HeavyBall"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    reference = [p.detach().clone() for p in model.parameters()]
    velocities = [torch.zeros_like(p) for p in reference]
    matrices, biases = list(model.parameters())[0::2], list(model.parameters())[1::2]
    optimizer = HeavyBall([{"params": matrices, "weight_decay": 0.1}, {"params": biases}], 0.05, momentum=0.8)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    inputs = torch.randn(8, 5, dtype=torch.float64)
    for step in range(4):
        optimizer.zero_grad()
        model(inputs).square().sum().backward()
        lr = 0.05 * 0.5 ** (step // 2)
        for index, (p, parameter) in enumerate(zip(reference, model.parameters())):
            decay = 0.1 if index % 2 == 0 else 0.0
            new, velocities[index] = _heavy_ball(
                p, parameter.grad, velocities[index], lr=lr, momentum=0.8, weight_decay=decay
            )
            p.copy_(new)
        optimizer.step()
        scheduler.step()
        for p, parameter in zip(reference, model.parameters()):
            torch.testing.assert_close(parameter.detach(), p, rtol=1e-13, atol=1e-15)
    state = optimizer.state_dict()["state"][0]
    assert set(state) == {"velocity", "step"} and float(state["step"]) == 4
    torch.testing.assert_close(state["velocity"], velocities[0], rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="lr"):
        HeavyBall(model.parameters(), lr=-1.0)


def test_the_recipe_lists_every_step():
    from pathlib import Path

    recipe = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text()
    section = recipe.split("## Adding a formula", 1)[1].split("\n## ", 1)[0]
    steps = ["steadystep/kernels/", "elementwise(", "__all__", "tests/reference.py", "python -m steadystep.codegen"]
    for needed in [*steps, "FORMULA_MODULES", "registry.MODULES", "tests/test_recipe.py"]:
        assert needed in section, needed
    section = recipe.split("## Adding an optimizer", 1)[1].split("\n## ", 1)[0]
    for needed in ["steadystep/kernels/optim.py", "STEPS", "hyperparameters=", "drop_in=", 'fused_step("name")']:
        assert needed in section, needed
