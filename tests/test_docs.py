"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib
import inspect
import re
from pathlib import Path

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
    "steadystep.quantization",
    "steadystep.torch",
    "steadystep.torch.low_bit",
    "steadystep.torch.decentral",
    "steadystep.torch.curvature",
    "steadystep.lm",
    "steadystep.warmup",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.startswith("steadystep.torch") or name == "steadystep.lm":
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"steadystep": steadystep}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0 or name in ("steadystep.registry",)


SPHINX_ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj|ref):`")


def test_no_docstring_has_a_sphinx_role_the_site_would_show_as_text():
    """The site renders docstrings as Markdown (mkdocstrings), where ":class:`X`" stays literal
    text: a cross-reference is an autorefs link, [`X`][steadystep.module.X], and
    ``mkdocs build --strict`` fails on one that does not resolve."""
    package = Path(__file__).resolve().parent.parent / "steadystep"
    found = [
        f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if SPHINX_ROLE.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_optimizer_guide_names_every_fused_step_and_drop_in():
    """The guide's lists are checked against the modules (a new optimizer is one formula and
    one export line; its mention here is what this test asks for)."""
    torch_faces = pytest.importorskip("steadystep.torch")
    from steadystep import optim

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "optimizers.md").read_text()
    steps = [
        name
        for name in optim.__all__
        if callable(getattr(optim, name))
        and list(inspect.signature(getattr(optim, name)).parameters)[:2] == ["param", "grad"]
    ]
    assert {"adamw", "lars", "lion"} <= set(steps)
    for name in [*steps, *torch_faces.__all__]:
        assert f"`{name}`" in guide, name
