"""steadystep ships its type hints (py.typed): the package passes mypy, and code written
against the public API type-checks, with wrong arguments caught rather than taken as Any."""

import os
from pathlib import Path

import pytest

import steadystep

# a dev extra, so always there in CI; a GPU machine without PyPI (ci/gpu_check.sh) may lack it
api = pytest.importorskip("mypy.api")

# one worker runs all three, so the one mypy run of the module's fixture serves them all
pytestmark = pytest.mark.xdist_group("typing")

GOOD = """
import numpy as np
import torch

import steadystep
import steadystep.torch
from steadystep import decentral, diagnostics, models, numerical_stability, optim
from steadystep.arena import Arena

arena = Arena.pack([np.random.randn(256, 128), np.zeros(128)])
grads, exp_avg, exp_avg_sq = (arena.zeros_like().buffer for _ in range(3))
norm = optim.clip_grad_norm(grads, max_norm=1.0)
optim.adamw(arena.buffer, grads, exp_avg, exp_avg_sq, step=1, lr=1e-3, decay_mask=arena.layout.mask())
probabilities = numerical_stability.softmax(np.zeros((4, 10)), out=None, target="cpu")
entries: list[dict] = steadystep.catalog()

optimizer = steadystep.torch.AdamW(torch.nn.Linear(4, 2).parameters(), lr=1e-3, betas=(0.9, 0.999))
optimizer.step()
optimizer.zero_grad(set_to_none=True)

mlp = models.mlp(features=64, hidden=32, classes=10)
params = mlp.init(workers=8)
workers = decentral.DecentralizedAdamW(params, topology=decentral.ring(), lr=1e-2)
workers.step(np.zeros_like(params))
distance: float = decentral.consensus_distance(workers.params)
hvp = diagnostics.model_hvp(mlp, params[0], np.zeros((5, 64), np.float32), np.zeros(5, np.int64))
reference = diagnostics.isotropic_reference(hvp, mlp.dim, support=mlp.parameter_indices)
"""

# one wrong argument per line, each line's error named by its argument
BAD = {
    "lr": 'optim.adamw(buffer, buffer, buffer, buffer, step=1, lr="fast")',
    "betas": "steadystep.torch.AdamW(torch.nn.Linear(4, 2).parameters(), betas=0.9)",
    "activation": "models.mlp(features=64, hidden=32, classes=10, activation=None)",
    "topology": 'decentral.DecentralizedAdamW(buffer, topology="ring")',
}


BAD_HEADER = (
    "import numpy as np\nimport torch\nimport steadystep.torch\nfrom steadystep import decentral, models, optim\n"
)
BAD_FIRST_LINE = 6  # BAD_HEADER's four lines, then the buffer's


@pytest.fixture(scope="module")
def errors(tmp_path_factory) -> dict[str, list[str]]:
    """mypy's errors in the package and in two user files, from one run (each run reads the
    stubs of NumPy and torch again: ~12 s)."""
    folder = tmp_path_factory.mktemp("typing")
    package = Path(steadystep.__file__).parent
    paths = {"steadystep": package, "good": folder / "good.py", "bad": folder / "bad.py"}
    paths["good"].write_text(GOOD)
    paths["bad"].write_text(
        BAD_HEADER + "buffer = np.zeros(4, np.float32)\n" + "".join(f"{call}\n" for call in BAD.values())
    )
    options = ["--config-file", str(package.parent / "pyproject.toml"), "--cache-dir", os.devnull]
    stdout, stderr, status = api.run([*map(str, paths.values()), *options])
    report = stdout + stderr
    # 1: errors found; 2 would be mypy failing to run at all, which finds none
    assert status == 1 and f"Found {len(BAD)} errors in 1 file" in report, report
    lines = [line for line in report.splitlines() if ": error:" in line]
    return {name: [line for line in lines if line.startswith(str(path))] for name, path in paths.items()}


def test_package_passes_mypy(errors):
    assert errors["steadystep"] == []


def test_public_api_type_checks_in_user_code(errors):
    assert errors["good"] == []


def test_wrong_arguments_are_type_errors(errors):
    assert len(errors["bad"]) == len(BAD)
    for error, (line, name) in zip(errors["bad"], enumerate(BAD, start=BAD_FIRST_LINE)):
        assert f'bad.py:{line}: error: Argument "{name}"' in error
