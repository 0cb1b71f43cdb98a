"""The CPU and CUDA kernel files come from one formula source, and are up to date."""

import ast
import functools
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from steadystep import codegen
from steadystep.kernels import FORMULA_MODULES


@functools.cache
def fresh() -> dict[Path, str]:
    """One generation (seconds), made by the first test that reads it (not at collection, which
    every pytest process does); the tests that change kernels/ make their own."""
    return codegen.generated_files()


# the generated files' paths, known without generating them (test_the_generated_files_are_the_ones_listed checks)
PATHS = sorted(
    [codegen.generated_path(target, module) for module in FORMULA_MODULES for target in codegen.TARGETS]
    + [codegen.generated_path(target, "__init__") for target in codegen.TARGETS]
)


def test_the_generated_files_are_the_ones_listed():
    assert sorted(fresh()) == PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_committed_kernels_equal_a_fresh_generation(path):
    committed, fresh_text = path.read_text(), fresh()[path]
    if sys.version_info < (3, 11):  # ast.unparse put tuple targets in parentheses before 3.11
        committed, fresh_text = (ast.unparse(ast.parse(text)) for text in (committed, fresh_text))
    assert committed == fresh_text, f"{path} is stale: run `python -m steadystep.codegen` and commit the result"


def _bodies(module_source: str, suffix: str) -> dict[str, str]:
    tree = ast.parse(module_source)
    return {
        node.name: ast.unparse(node.body)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.endswith(f"_{suffix}")
    }


@pytest.mark.parametrize("module", FORMULA_MODULES)
@pytest.mark.parametrize("suffix", ["f32", "f64"])
def test_cpu_and_cuda_device_functions_share_every_body(module, suffix):
    cpu = _bodies(fresh()[codegen.generated_path(codegen.CPU, module)], suffix)
    cuda = _bodies(fresh()[codegen.generated_path(codegen.CUDA, module)], suffix)
    shared = set(cpu) & set(cuda)
    # Each target may take a helper from its own primitives: the GPU cospi from libdevice, the
    # CPU log1p (float32 from logf); every other function is compiled on both from one body.
    assert set(cuda) - {f"{name}_{suffix}" for name in codegen.CPU.native_helpers} <= set(cpu)
    assert set(cpu) - {f"{name}_{suffix}" for name in codegen.CUDA.native_helpers} <= set(cuda)
    # the same but for min and max, which the GPU calls under names of its own
    for builtin, renamed in codegen.CUDA.builtins.items():
        cuda = {name: body.replace(f"{renamed}(", f"{builtin}(") for name, body in cuda.items()}
    assert shared and all(cpu[name] == cuda[name] for name in shared)


def test_literals_are_cast_and_clamped_to_the_dtype():
    assert codegen.dtype_literal(1e308, np.float32) == float(np.finfo(np.float32).max)
    assert codegen.dtype_literal(-1e308, np.float32) == -float(np.finfo(np.float32).max)
    assert codegen.dtype_literal(1e-300, np.float32) == float(np.finfo(np.float32).tiny)
    assert codegen.dtype_literal(1e-300, np.float64) == 1e-300
    assert codegen.dtype_literal(0.1, np.float32) == float(np.float32(0.1))
    assert codegen.dtype_literal(0.0, np.float32) == 0.0


def test_float32_functions_only_contain_float32_literals():
    source = fresh()[codegen.generated_path(codegen.CPU, "gradient_descent")]
    for name, body in _bodies(source, "f32").items():
        assert "float64(" not in body, name
    assert "float32(1.0) - lr * weight_decay" in source


def test_a_formula_change_changes_both_targets(tmp_path, monkeypatch):
    """Generation reads only kernels/: editing a formula there rewrites both files."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for path in codegen.KERNELS.glob("*.py"):
        (kernels / path.name).write_text(path.read_text())
    edited = (
        (kernels / "autograd_ops.py").read_text().replace("return other * upstream", "return other * upstream * 2.0")
    )
    (kernels / "autograd_ops.py").write_text(edited)
    monkeypatch.setattr(codegen, "KERNELS", kernels)
    for target in codegen.TARGETS:
        assert "other * upstream * float32(2.0)" in codegen.generate_module("autograd_ops", target)


PACKAGE_KERNELS = codegen.KERNELS


def _generate(tmp_path, monkeypatch, source: str, module: str = "toy"):
    """Generate ``source`` as kernels/<module>.py of a copy of the formula folder."""
    kernels = Path(tempfile.mkdtemp(dir=tmp_path)) / "kernels"
    shutil.copytree(PACKAGE_KERNELS, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    (kernels / f"{module}.py").write_text(source)
    monkeypatch.setattr(codegen, "KERNELS", kernels)
    sys.modules.pop(f"steadystep.kernels.{module}", None)
    try:
        return [codegen.generate_module(module, target) for target in codegen.TARGETS]
    finally:
        sys.modules.pop(f"steadystep.kernels.{module}", None)


@pytest.mark.parametrize(
    "body, line",
    [
        ("return 1 - x", "the integer literal 1 in arithmetic"),
        ("return x * 2", "the integer literal 2 in arithmetic"),
        ("return x / -3", "the integer literal 3 in arithmetic"),
        ("y = x\n    y += 1\n    return y", "the integer literal 1 in arithmetic"),
    ],
)
def test_an_integer_literal_in_arithmetic_fails_at_generation_saying_what_to_write(tmp_path, monkeypatch, body, line):
    source = f'def f(x):\n    """Doc.\n\n    f\n    """\n    {body}\n'
    with pytest.raises(ValueError, match=f"{line} computes in float64 in a float32 kernel; write"):
        _generate(tmp_path, monkeypatch, source)


def test_integer_literals_in_indices_ranges_and_comparisons_are_allowed(tmp_path, monkeypatch):
    source = (
        "from steadystep.kernels import Grid\n\n\n"
        "def g(row, column, xs, out):\n"
        "    total = 0.0\n"
        "    for k in range(xs.shape[1] - 1):\n"
        "        total += xs[row, k + 1]\n"
        "    if column == 0:\n"
        "        out[row, column] = total\n\n\n"
        'GRIDS = (Grid("g"),)\n'
    )
    cpu, cuda = _generate(tmp_path, monkeypatch, source)
    assert "def g_f32_grid(rows, columns, xs, out, part, parts):" in cpu and "def g_f64_grid(" in cuda


@pytest.mark.parametrize(
    "source, message",
    [
        # an elementwise formula's parameter that the loop uses as its index
        ('def f(x, i):\n    """D.\n\n    f\n    """\n    return x * i\n', r"elementwise kernels use the name 'i'"),
        ('def f(x, at):\n    """D.\n\n    f\n    """\n    return x * at\n', r"use the name 'at'"),
        # a step buffer the CPU's indexed loop uses for a block bound
        (
            "from steadystep.kernels import Step\n\n\ndef s(size, grad, lr):\n    return (size - lr * grad,)\n\n\n"
            'STEPS = (Step("s", "s", ("size", "grad"), ("size",), gradient="grad"),)\n',
            r"step kernels use the name 'size'",
        ),
        # a name the step makes from a buffer's (new_<buffer>)
        (
            "from steadystep.kernels import Step\n\n\ndef s(param, new_param):\n    return (param * new_param,)\n\n\n"
            'STEPS = (Step("s", "s", ("param",), ("param",)),)\n',
            r"step kernels use the name 'new_param'",
        ),
        # a fold state named as the row kernels' own loop variable
        (
            "from steadystep.kernels import Fold, Row\n\n\n"
            "def lift(x):\n    return (x,)\n\n\ndef merge(a, b):\n    return (a + b,)\n\n\n"
            "def finish(row, length):\n    return row\n\n\n"
            'ROWS = (Row("r", "d", "f", (Fold(("row",), (0.0,), "lift", "merge"),), finish="finish"),)\n',
            r"row kernels use the name 'row'",
        ),
        (
            "from steadystep.kernels import Grid\n\n\ndef g(row, column, flat):\n    flat[row, column] = 1.0\n\n\n"
            'GRIDS = (Grid("g"),)\n',
            r"grid kernels use the name 'flat'",
        ),
        ('def f(x, __y__):\n    """D.\n\n    f\n    """\n    return x\n', r"'__y__' is a dunder name"),
    ],
)
def test_a_name_the_kernels_use_themselves_fails_at_generation_saying_what_to_write(
    tmp_path, monkeypatch, source, message
):
    with pytest.raises(ValueError, match=message + r".*rename it"):
        _generate(tmp_path, monkeypatch, source)


def test_a_mixing_formula_must_take_what_its_declaration_says(tmp_path, monkeypatch):
    declaration = 'MIXINGS = (Mixing("peer", "update", ("param", "exp_avg", "exp_avg_sq"), "grad", "clip", "decay"),)\n'
    swapped = (
        "from steadystep.kernels import Mixing\n\n\n"
        "def update(param, exp_avg, grad, exp_avg_sq, clip, decay, lr):\n"
        "    return param - lr * grad, exp_avg, exp_avg_sq\n\n\n" + declaration
    )
    with pytest.raises(
        ValueError, match="must start with the parameters param, grad, exp_avg, exp_avg_sq, clip, decay"
    ):
        _generate(tmp_path, monkeypatch, swapped)
    clashing = (
        "from steadystep.kernels import Mixing\n\n\n"
        "def update(param, grad, exp_avg, exp_avg_sq, clip, decay, lane):\n"
        "    return param - lane * grad, exp_avg, exp_avg_sq\n\n\n" + declaration
    )
    with pytest.raises(ValueError, match="mixing kernels use the name 'lane'"):
        _generate(tmp_path, monkeypatch, clashing)


def test_template_placeholders_are_dunder_names_and_none_is_left_unfilled():
    assert codegen._fill("a = __x__ + ROW_THREADS", x="b") == "a = b + ROW_THREADS"
    assert codegen._fill("    __block__\n", block="a = 1\nb = 2") == "    a = 1\n    b = 2"
    with pytest.raises(ValueError, match=r"placeholders \['__y__'\] were not filled"):
        codegen._fill("a = __x__ + __y__", x="b")
