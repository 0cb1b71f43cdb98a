"""The CPU and CUDA kernel files come from one formula source, and are up to date."""

import ast
import sys

import numpy as np
import pytest

from steadystep import codegen
from steadystep.kernels import FORMULA_MODULES


@pytest.mark.parametrize("path", sorted(codegen.generated_files()), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_committed_kernels_equal_a_fresh_generation(path):
    committed, fresh = path.read_text(), codegen.generated_files()[path]
    if sys.version_info < (3, 11):  # ast.unparse put tuple targets in parentheses before 3.11
        committed, fresh = (ast.unparse(ast.parse(text)) for text in (committed, fresh))
    assert committed == fresh, f"{path} is stale: run `python -m steadystep.codegen` and commit the result"


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
    files = codegen.generated_files()
    cpu = _bodies(files[codegen.generated_path(codegen.CPU, module)], suffix)
    cuda = _bodies(files[codegen.generated_path(codegen.CUDA, module)], suffix)
    shared = set(cpu) & set(cuda)
    # Each target may take a helper from its own primitives: the GPU cospi from libdevice, the
    # CPU log1p (float32 from logf); every other function is compiled on both from one body.
    assert set(cuda) - {f"{name}_{suffix}" for name in codegen.CPU.native_helpers} <= set(cpu)
    assert set(cpu) - {f"{name}_{suffix}" for name in codegen.CUDA.native_helpers} <= set(cuda)
    assert shared and all(cpu[name] == cuda[name] for name in shared)


def test_literals_are_cast_and_clamped_to_the_dtype():
    assert codegen.dtype_literal(1e308, np.float32) == float(np.finfo(np.float32).max)
    assert codegen.dtype_literal(-1e308, np.float32) == -float(np.finfo(np.float32).max)
    assert codegen.dtype_literal(1e-300, np.float32) == float(np.finfo(np.float32).tiny)
    assert codegen.dtype_literal(1e-300, np.float64) == 1e-300
    assert codegen.dtype_literal(0.1, np.float32) == float(np.float32(0.1))
    assert codegen.dtype_literal(0.0, np.float32) == 0.0


def test_float32_functions_only_contain_float32_literals():
    source = codegen.generated_files()[codegen.generated_path(codegen.CPU, "gradient_descent")]
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
