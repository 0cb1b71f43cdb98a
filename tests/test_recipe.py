"""ARCHITECTURE.md's "Adding a formula" recipe, followed for a toy module: the formula file
is generated for both targets, and the public function made from it runs on the target this
process tests (the CPU, or the CUDA kernels on Numba's simulator) and agrees with NumPy."""

import importlib.util
import shutil
import sys

import numpy as np
import pytest

from steadystep import codegen, registry

TOY = '''"""A toy formula module, as the recipe adds one."""


def scaled_difference(a, b, scale):
    """The difference of a and b, scaled.

    (a − b)·scale
    """
    return (a - b) * scale
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


def test_the_recipe_lists_every_step():
    from pathlib import Path

    recipe = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text()
    section = recipe.split("## Adding a formula", 1)[1].split("\n## ", 1)[0]
    steps = ["steadystep/kernels/", "elementwise(", "__all__", "tests/reference.py", "python -m steadystep.codegen"]
    for needed in [*steps, "FORMULA_MODULES", "registry.MODULES", "tests/test_recipe.py"]:
        assert needed in section, needed
