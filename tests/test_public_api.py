"""Every public module says what it exports: ``__all__`` names only what exists and is public,
and in the user-facing modules every public function and class the module defines is in it
(so completion and ``from ... import *`` show the API, not ``np`` or ``Any``)."""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="imports only")

USER_FACING = [
    "steadystep.arena",
    "steadystep.curvature",
    "steadystep.decentral",
    "steadystep.diagnostics",
    "steadystep.models",
    "steadystep.optim",
    "steadystep.checks",
    "steadystep.autograd_graph",
    "steadystep.autograd_ops",
    "steadystep.gradient_descent",
    "steadystep.numerical_stability",
    "steadystep.training_stability",
    "steadystep.registry",
    "steadystep.warmup",
]
TORCH = ["steadystep.torch", "steadystep.torch.curvature", "steadystep.torch.decentral", "steadystep.torch.distributed"]
TOOLS = [  # entry points and the machinery under the API: __all__ lists what other code may use
    "steadystep",
    "steadystep.codegen",
    "steadystep.demo",
    "steadystep.demo.cli",
    "steadystep.demo.digits",
    "steadystep.demo.lm",
    "steadystep.demo.report",
    "steadystep.dispatch",
    "steadystep.examples",
    "steadystep.lm",
    "steadystep.decentral.checkpoint",
    "steadystep.decentral.consensus",
    "steadystep.decentral.optimizer",
    "steadystep.decentral.ranked",
    "steadystep.decentral.schedules",
    "steadystep.decentral.topology",
]


def _module(name):
    if name in TORCH or name == "steadystep.lm":
        pytest.importorskip("torch")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", USER_FACING + TORCH + TOOLS)
def test_all_names_what_exists_and_is_public(name):
    module = _module(name)
    exported = module.__all__
    assert exported and len(set(exported)) == len(exported), "__all__ is empty or lists a name twice"
    for item in exported:
        assert not item.startswith("_"), item
        assert hasattr(module, item), f"{name}.__all__ lists {item!r}, which it does not define"
        if name != "steadystep":  # the package lists its submodules
            assert not isinstance(getattr(module, item), types.ModuleType), item


@pytest.mark.parametrize("name", USER_FACING + TORCH)
def test_every_public_function_and_class_of_a_user_facing_module_is_exported(name):
    module = _module(name)
    defined = {
        item
        for item, value in vars(module).items()
        if not item.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == name
    }
    assert defined <= set(module.__all__), (
        f"defined in {name} but not in __all__: {sorted(defined - set(module.__all__))}"
    )


def test_the_version_is_written_once():
    """pyproject.toml reads it from steadystep.__version__; the installed metadata says the same."""
    from importlib.metadata import version
    from pathlib import Path

    import steadystep

    assert version("steadystep") == steadystep.__version__
    project = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in project and '\nversion = "' not in project


@pytest.mark.parametrize("name", USER_FACING + TORCH + ["steadystep.decentral.mpi", "steadystep.decentral.ranked"])
def test_every_public_module_has_its_api_page_in_the_site(name):
    """A user finds any function's documentation on the site: each public module has a page
    that renders its docstrings, listed in the navigation and in the reference's index."""
    from tests.helpers import ROOT

    page = name.removeprefix("steadystep.") + ".md"
    text = (ROOT / "docs" / "api" / page).read_text()
    assert f"::: {name}\n" in text
    assert f"api/{page}" in (ROOT / "mkdocs.yml").read_text()
    assert f"]({page})" in (ROOT / "docs" / "api" / "index.md").read_text()
