"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel; the wheel holds
the generated kernels and the type marker, not the tests; installed into a fresh virtual
environment it runs kernels from outside the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(SIMULATOR, reason="packaging, on the CPU")

RUN = """
import numpy as np, steadystep, sys
from steadystep import optim
assert steadystep.__file__.startswith(sys.prefix), steadystep.__file__  # the wheel's copy, not the source
assert steadystep.execute("autograd_graph", "gradient_norm_clip_scale", [8.0, 2.0]) == {"result": 0.25}
param, grad = np.ones(1000, np.float32), np.full(1000, 0.5, np.float32)
exp_avg, exp_avg_sq = np.zeros_like(param), np.zeros_like(param)
optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, lr=1e-3, weight_decay=0.0)
assert np.allclose(param, 1.0 - 1e-3), param[:3]
print("ran", steadystep.__version__)
"""


def test_the_wheel_installs_and_runs_kernels_outside_the_source_tree(tmp_path):
    pytest.importorskip("build")
    dist, source = tmp_path / "dist", tmp_path / "source"
    # from a copy of what the sdist takes: the build's scratch (build/, *.egg-info) stays out of the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "steadystep", source / "steadystep", ignore=shutil.ignore_patterns("__pycache__", "*.nb[ic]")
    )
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("steadystep-*.whl")
    (sdist,) = dist.glob("steadystep-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "steadystep/py.typed" in names and "steadystep/cpu/_generated/__init__.py" in names
    assert any(name.startswith("steadystep/cuda/_generated/") for name in names)
    assert not any(name.startswith("tests/") or "__pycache__" in name for name in names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    with tarfile.open(sdist) as archive:
        assert any(name.endswith("/LICENSE") for name in archive.getnames())

    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The test environment's NumPy and Numba, as a plain path after the venv's own: its .pth
    # files (an editable steadystep's finder among them) are not run, so steadystep comes
    # from the wheel only.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "test_environment.pth").write_text(
        "\n".join(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])) + "\n"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plain = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}  # no source tree in sight
    result = subprocess.run(
        [str(python), "-c", RUN], capture_output=True, text=True, timeout=600, cwd=outside, env=plain
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "ran " + __import__("steadystep").__version__


def test_the_cupy_extra_brings_cupy_for_the_cuda_runtime_numba_cuda_uses():
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    runtime = re.search(r"numba-cuda\[cu(\d+)\]", " ".join(extras["cuda"]))
    assert runtime, extras["cuda"]
    assert set(extras["cuda"]) <= set(extras["cupy"])  # the CUDA target itself, and CuPy beside it
    cupy = [requirement for requirement in extras["cupy"] if requirement.startswith("cupy")]
    assert len(cupy) == 1 and re.fullmatch(rf"cupy-cuda{runtime[1]}x(\[ctk\])?>=\d+(\.\d+)*", cupy[0]), cupy
