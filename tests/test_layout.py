"""The package's rooms talk through public names (ARCHITECTURE.md): no module imports another's
private name or reaches for one through it, and the module-level imports form no cycle.

Two kinds of leading underscore are not a module's private name here: a private module itself
(``steadystep._arrays``, the package's internal layer, whose names are public to the package),
and a piece of a formula source in ``steadystep/kernels/`` (a function there without an
underscore is a catalog formula, test_catalog; pieces such as the softmax folds are shared
between formula sources the way codegen inlines them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="reads the sources")

PACKAGE = Path(__file__).resolve().parent.parent / "steadystep"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_generated" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level_imports(module: str) -> set[str]:
    """The package modules ``module`` imports when it is imported (not the lazy ones inside
    functions, nor those under ``if TYPE_CHECKING``)."""
    imported = set()
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            imported |= {
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names
            }
    return {name for name in imported if name in MODULES and name != module}


def _private_reaches(module: str, text: str) -> list[str]:
    """Where the source ``text`` of ``module`` imports another package module's private name,
    or reads one through a name it bound to another package module."""
    found = []
    tree = ast.parse(text)
    names = {}  # local name -> the package module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if not source.startswith("steadystep"):
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in MODULES:
                    names[alias.asname or alias.name] = target
                elif _private(alias.name) and source != module and not source.startswith("steadystep.kernels"):
                    found.append(f"{module}:{node.lineno}: from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    names[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
            target = names.get(node.value.id)
            if target is not None and target != module:
                found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_or_reaches_for_another_modules_private_name():
    assert [reach for module, path in MODULES.items() for reach in _private_reaches(module, path.read_text())] == []


def test_the_check_finds_a_private_import_and_a_private_reach():
    """It can fail: both ways of taking another module's private name are found; a private
    module's public name, and a module's own private names, are not."""
    source = (
        "from steadystep.diagnostics import _rows, Estimate\n"
        "from steadystep import ranks, _arrays\n"
        "ranks._joined\n_arrays.classify\n_own = 1\n"
    )
    assert [reach.split(": ", 1)[1] for reach in _private_reaches("steadystep.curvature", source)] == [
        "from steadystep.diagnostics import _rows",
        "ranks._joined",
    ]


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """The import cycles a depth-first walk of ``graph`` meets (each as 'a -> b -> a')."""
    state: dict[str, str] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                cycles.append(" -> ".join(path[path.index(imported) :] + [imported]))
            elif imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_the_module_level_imports_form_no_cycle():
    assert _cycles({module: _top_level_imports(module) for module in MODULES}) == []


def test_the_cycle_check_can_fail():
    """The graph holds what a module imports at its top, and a cycle in it is found."""
    assert "steadystep.diagnostics" in _top_level_imports("steadystep.curvature")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]


def _defines(text: str) -> list[str]:
    """What a module's top level does beyond its docstring, imports and ``__all__``."""
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [
        ast.unparse(node).splitlines()[0]
        for node in body
        if not isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"])
    ]


@pytest.mark.parametrize("face", ["steadystep.torch", "steadystep.decentral"])
def test_a_package_face_only_re_exports(face):
    """The drop-ins live in steadystep/torch/optim.py, the decentralized pieces in their own
    files: the package's __init__ names them and defines nothing."""
    assert _defines(MODULES[face].read_text()) == []
    assert _defines("'''doc'''\nimport x\nfrom y import z\n__all__ = ['z']\ndef f(): pass\n") == ["def f():"]
