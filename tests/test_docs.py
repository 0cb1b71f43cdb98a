"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import pytest

import steadystep
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="docstring examples run on the CPU")

MODULES = [
    "steadystep",
    "steadystep.registry",
    "steadystep.autograd_graph",
    "steadystep.autograd_ops",
    "steadystep.gradient_descent",
    "steadystep.training_stability",
    "steadystep.numerical_stability",
    "steadystep.checks",
    "steadystep.optim",
    "steadystep.arena",
    "steadystep.decentral",
    "steadystep.diagnostics",
    "steadystep.curvature",
    "steadystep.models",
    "steadystep.torch",
    "steadystep.torch.decentral",
    "steadystep.torch.curvature",
    "steadystep.lm",
    "steadystep.warmup",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in ("steadystep.torch", "steadystep.torch.decentral", "steadystep.torch.curvature", "steadystep.lm"):
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"steadystep": steadystep}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0 or name in ("steadystep.registry",)
