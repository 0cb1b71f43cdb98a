"""Runs every test that takes the ``target`` fixture on each target this process can reach.

The README's test command runs pytest twice: a plain process (target "cpu", plus the
CPU-only tests) and one with NUMBA_ENABLE_CUDASIM=1, where only the target tests run,
on target "cuda" through Numba's CUDA simulator. On a machine with a GPU,
STEADYSTEP_TEST_TARGETS=cpu,cuda runs both for real (ci/gpu_check.sh).
"""

import os

# Each xdist worker holds two OpenMP runtimes (torch's and the one Numba's parallel kernels
# use), each with a thread per core that spins after its work: two workers on two cores then
# spend most of their time preempting each other's spinning threads. Sleeping instead made
# the CPU suite 2.5x faster (435 -> 176 s). Set before either runtime loads (torch is imported
# by the test modules, Numba's runtime at the first parallel launch); subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from numba import config  # noqa: E402

SIMULATOR = bool(config.ENABLE_CUDASIM)


def _targets():
    chosen = os.environ.get("STEADYSTEP_TEST_TARGETS")
    if chosen:
        return [name.strip() for name in chosen.split(",") if name.strip()]
    return ["cuda"] if SIMULATOR else ["cpu"]


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", _targets())


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip = pytest.mark.skip(reason="CPU-only test; the simulator process runs the target tests")
    for item in items:
        if "target" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
