"""Writes the CPU and CUDA kernel files from the formula sources in ``steadystep/kernels``.

Run ``python -m steadystep.codegen`` after editing a formula; ``tests/test_codegen.py``
fails while the committed files differ from what this module generates, so the CPU
and CUDA builds can only ever come from the same source.

For every formula ``f`` and dtype (float32 as ``f32``, float64 as ``f64``) each target
file gets:

* ``f_f32``: the formula's own body with every numeric literal cast to the dtype, and
  calls to helpers/formulas renamed to their ``_f32`` twins (so float32 stays float32);
* ``f_f32_kernel(out, *args)``: the elementwise loop. Each argument is a 1-D array of
  ``out``'s length or a scalar; ``at(x, i)`` picks ``x[i]`` or ``x`` at compile time.

Generated files are real modules on disk, so Numba's ``cache=True`` works for them.
"""

from __future__ import annotations

import ast
import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from steadystep.kernels import ELEMENTWISE_MODULES

PACKAGE = Path(__file__).resolve().parent
KERNELS = PACKAGE / "kernels"
HELPERS = "_numerics"
DTYPES = {"f32": np.float32, "f64": np.float64}
MATH_CONSTANTS = {"pi", "e", "tau", "inf", "nan"}
RESERVED = {"out", "i", "at", "cuda", "math", "float32", "float64"}


@dataclass(frozen=True)
class Target:
    name: str
    imports: str
    native_helpers: frozenset[str]  # helpers the target's primitives module provides
    device_decorator: str
    kernel_decorator: str
    loop: str


CPU = Target(
    name="cpu",
    imports="import math  # noqa: F401  (formulas may call math functions)\n\nfrom numba import njit\nfrom numpy import float32, float64  # noqa: F401  (literal casts)\n\nfrom steadystep.cpu.primitives import at",
    native_helpers=frozenset(),
    device_decorator='@njit(error_model="numpy", cache=True)',
    kernel_decorator='@njit(error_model="numpy", cache=True)',
    loop="for i in range(out.shape[0]):",
)
CUDA = Target(
    name="cuda",
    imports="from numba import cuda\nfrom numpy import float32, float64  # noqa: F401  (literal casts)\n\nfrom steadystep.cuda.primitives import at, math",
    native_helpers=frozenset({"cospi"}),
    device_decorator='@cuda.jit(device=True, inline="always")',
    kernel_decorator="@cuda.jit(cache=True)",
    loop="for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):",
)
TARGETS = (CPU, CUDA)


def dtype_literal(value: float, dtype: type[np.floating]) -> float:
    """The literal a kernel of ``dtype`` uses for ``value``.

    A magnitude the dtype cannot hold means the dtype's own limit: above its largest
    finite value it is that value, below its smallest normal value (but non-zero) it is
    that normal value. So ``|x| <= 1e308`` still rejects inf in float32, and
    ``|den| < 1e-300`` still treats a float32 subnormal as too small.
    """
    info = np.finfo(dtype)
    magnitude = abs(value)
    if math.isfinite(magnitude) and magnitude > float(info.max):
        return math.copysign(float(info.max), value)
    if 0.0 < magnitude < float(info.tiny):
        return math.copysign(float(info.tiny), value)
    return float(dtype(value))


class _Specialize(ast.NodeTransformer):
    """Casts literals to one dtype and renames calls to their dtype twins."""

    def __init__(self, suffix: str, renamed: set[str]):
        self.suffix = suffix
        self.dtype = DTYPES[suffix]
        self.renamed = renamed

    def _cast(self, value: float) -> ast.expr:
        literal = ast.Constant(dtype_literal(float(value), self.dtype))
        return ast.Call(ast.Name(self.dtype.__name__, ast.Load()), [literal], [])

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return self._cast(node.value)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH_CONSTANTS:
            return self._cast(getattr(math, node.attr))
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.renamed:
            return ast.Name(f"{node.id}_{self.suffix}", node.ctx)
        return node


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _called_names(function: ast.FunctionDef) -> set[str]:
    return {node.func.id for node in ast.walk(function) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def _without_docstring(function: ast.FunctionDef) -> list[ast.stmt]:
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _device_function(function: ast.FunctionDef, suffix: str, renamed: set[str], decorator: str) -> str:
    clone = ast.FunctionDef(
        name=f"{function.name}_{suffix}",
        args=function.args,
        body=[_Specialize(suffix, renamed).visit(copy.deepcopy(statement)) for statement in _without_docstring(function)],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    return f"{decorator}\n{ast.unparse(ast.fix_missing_locations(clone))}"


def _kernel(function: ast.FunctionDef, suffix: str, target: Target) -> str:
    params = [arg.arg for arg in function.args.args]
    clash = RESERVED.intersection(params)
    if clash:
        raise ValueError(f"formula {function.name} uses reserved parameter names {sorted(clash)}")
    loads = ", ".join(f"at({name}, i)" for name in params)
    return (
        f"{target.kernel_decorator}\n"
        f"def {function.name}_{suffix}_kernel(out, {', '.join(params)}):\n"
        f"    {target.loop}\n"
        f"        out[i] = {function.name}_{suffix}({loads})\n"
    )


def _needed_helpers(formulas: dict[str, ast.FunctionDef], helpers: dict[str, ast.FunctionDef]) -> list[str]:
    needed: set[str] = set()
    pending = [name for function in formulas.values() for name in _called_names(function)]
    while pending:
        name = pending.pop()
        if name in helpers and name not in needed:
            needed.add(name)
            pending.extend(_called_names(helpers[name]))
    return [name for name in helpers if name in needed]


def generate_module(module: str, target: Target) -> str:
    """Source of ``steadystep/<target>/<module>.py`` generated from ``kernels/<module>.py``."""
    formulas = {name: node for name, node in _functions(KERNELS / f"{module}.py").items() if not name.startswith("_")}
    helpers = _functions(KERNELS / f"{HELPERS}.py")
    used_helpers = _needed_helpers(formulas, helpers)
    renamed = set(formulas) | set(used_helpers)
    native = [name for name in used_helpers if name in target.native_helpers]
    imports = target.imports + "".join(f", {name}_{suffix}" for name in native for suffix in DTYPES)
    blocks = []
    for suffix in DTYPES:
        for name in used_helpers:
            if name in native:
                continue
            blocks.append(_device_function(helpers[name], suffix, renamed, target.device_decorator))
        for function in formulas.values():
            blocks.append(_device_function(function, suffix, renamed, target.device_decorator))
            blocks.append(_kernel(function, suffix, target))
    header = (
        f'"""{target.name.upper()} kernels generated from steadystep/kernels/{module}.py.\n\n'
        "Do not edit: change the formula there and run `python -m steadystep.codegen`.\n"
        '"""\n\n'
        f"{imports}\n"
    )
    return header + "\n\n" + "\n\n\n".join(block.rstrip("\n") for block in blocks) + "\n"


def generated_files() -> dict[Path, str]:
    """Every generated file, keyed by its path."""
    return {
        PACKAGE / target.name / f"{module}.py": generate_module(module, target)
        for module in ELEMENTWISE_MODULES
        for target in TARGETS
    }


def main() -> int:
    for path, text in generated_files().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(PACKAGE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
