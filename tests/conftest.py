"""Runs every test that takes the ``target`` fixture on each target this process can reach.

The README's test command runs pytest twice: a plain process (target "cpu", plus the
CPU-only tests) and one with NUMBA_ENABLE_CUDASIM=1, where only the target tests run,
on target "cuda" through Numba's CUDA simulator. On a machine with a GPU,
STEADYSTEP_TEST_TARGETS=cpu,cuda runs both for real (ci/gpu_check.sh), and
STEADYSTEP_TEST_TARGETS=cuda the target tests alone on the GPU.
"""

import gc
import os
import sys

# The suite starts well over a hundred Python processes (xdist workers, ranks, notebook kernels,
# scripts), and each would compile the package's and the tests' sources again where
# PYTHONDONTWRITEBYTECODE is set (as container images often do): their bytecode is kept in
# __pycache__, beside the kernels Numba keeps there already. Cleared here, before the package and
# the test modules are imported, and for every process started from this one.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# Each xdist worker holds two OpenMP runtimes (torch's and the one Numba's parallel kernels
# use), each with a thread per core that spins after its work: two workers on two cores then
# spend most of their time preempting each other's spinning threads. Sleeping instead made
# the CPU suite 2.5x faster (435 -> 176 s). Set before either runtime loads (torch is imported
# by the test modules, Numba's runtime at the first parallel launch); subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# MPICH's ranks poll for messages without yielding the core; the tests start 3 or 4 ranks on
# 2 cores beside the other pytest worker, where a waiting rank then takes the core from the
# rank it waits for. Yielding instead: the 4-rank MPI launch 20 -> 15 s on an idle machine.
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")

import pytest  # noqa: E402
from numba import config  # noqa: E402

from tests.helpers import simulate_blocks_in_one_thread  # noqa: E402

SIMULATOR = bool(config.ENABLE_CUDASIM)

simulate_blocks_in_one_thread()


def _log_compiles(directory: str) -> None:
    """STEADYSTEP_COMPILE_LOG=DIR: each process appends the kernels it compiles, with their
    seconds, to DIR/<pid>.tsv (to see where a cold run's time goes, and what two workers both
    compile)."""
    import time

    from numba.core import event

    path = os.path.join(directory, f"{os.getpid()}.tsv")
    started = {}

    class Compiles(event.Listener):
        def on_start(self, e):
            started[id(e.data["dispatcher"]), str(e.data["args"])] = time.perf_counter()

        def on_end(self, e):
            key = id(e.data["dispatcher"]), str(e.data["args"])
            seconds = time.perf_counter() - started.pop(key, time.perf_counter())
            with open(path, "a") as log:
                log.write(f"{e.data['dispatcher'].py_func.__qualname__}\t{e.data['args']}\t{seconds:.3f}\n")

    event.register("numba:compile", Compiles())


if os.environ.get("STEADYSTEP_COMPILE_LOG"):
    _log_compiles(os.environ["STEADYSTEP_COMPILE_LOG"])


def _targets():
    chosen = os.environ.get("STEADYSTEP_TEST_TARGETS")
    if chosen:
        return [name.strip() for name in chosen.split(",") if name.strip()]
    return ["cuda"] if SIMULATOR else ["cpu"]


TARGETS = _targets()  # what the ``target`` fixture takes in this process


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", TARGETS)


# The modules of the tests that start processes of their own (ranks under torchrun or mpiexec,
# a cold-cache job, mypy, a wheel in a fresh environment, notebook kernels) or assemble every
# kernel with ptxas: marked slow, so that `pytest -m "not slow"` is the contributors' quick run.
SLOW_MODULES = {
    "test_rank_backends",
    "test_distributed_trainer",
    "test_distributed",
    "test_mpi",
    "test_ptx",
    "test_release",
    "test_notebooks",
    "test_warmup",
    "test_typing",
}

# Tests that take long in a process (tens of seconds): started first, so that no pytest worker
# is still on one of them when the other has run out of work. (xdist's loadgroup hands each
# worker a unit, a group's cases or a single test, whenever it has two tests or fewer left, in
# this order: --no-loadscope-reorder keeps xdist from sorting the units by their sizes.)
# The slow modules start first: their processes wait on one another at times, which the other
# worker's compiles fill. (Started last, with the kernels cached by then, they took no less.)
# Except the modules of one process each that load what the others compiled: the notebook
# kernels and the warmup's job, run cold, took 2-2.5x their time on a warm cache. They come
# after the other tests, before the PTX checks, with the tests marked slow one by one: a
# fresh process each, which then loads from the cache the kernels the other tests compiled
# instead of compiling them cold.
STARTED_FIRST = (
    "test_stochastic_rounding",
    "test_the_demo_runs_on_the_cuda_target",
    "test_random_shapes_topologies_and_extreme_gradients_match_the_reference",
    "test_every_cpu_kernel_gives_the_same_bits_in_parts_as_whole",
    "test_large_elementwise_and_row_calls_run_in_parallel_with_the_whole_loops_results",
    "test_every_python_block_of_the_readme_and_the_docs_runs_as_written",
    "test_report_has_every_configuration_with_consistent_curves",
    "test_cases_that_could_read_or_write_out_of_bounds_are_refused_in_a_subprocess",
)


# Modules whose cases compile nothing that another case would reuse (PTX is not cached; each
# notebook runs in a kernel of its own): their cases stay units of their own, for balance.
UNGROUPED_MODULES = {"test_ptx", "test_notebooks"}
WARM_CACHE_MODULES = {"test_notebooks", "test_warmup"}


def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2]


def _weight(item) -> int:
    """0 for what starts first: slow modules, then the long tests, then the rest, then the
    processes that want a warm cache, and last the PTX checks (hundreds of short units, which
    even out the two workers' ends)."""
    module = _module(item)
    if module == "test_ptx":
        return 4
    slow = item.get_closest_marker("slow") is not None
    if module in WARM_CACHE_MODULES or (slow and module not in SLOW_MODULES):
        return 3
    if slow:
        return 0
    return 1 if item.name.startswith(STARTED_FIRST) else 2


def _freeze_survivors(phase: str, info: dict) -> None:
    """After a full collection, whatever survived it (torch, Numba, the package, the tests,
    the kernels compiled so far: most of the process) is left out of later ones. Each walked
    all of it: half a million objects and more, 22 s of a pytest worker's run even with what
    collection left frozen. What the tests make afterwards is collected as before; an object
    frozen here and dropped later is still freed when nothing refers to it, but a cycle of such
    objects stays: memory the run's end returns."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def pytest_collection_finish(session):
    gc.collect()  # and frozen, above: what collecting the tests left
    gc.callbacks.append(_freeze_survivors)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        module = _module(item)
        if module in SLOW_MODULES:
            item.add_marker(slow)
        # The cases of one test function mostly run the same kernels: on two workers at once,
        # each would compile them (a cold run compiled ~120 s twice). So they are one unit of
        # work, on one worker, where the first case compiles and the others load them. (A name
        # two modules share makes one unit of both: no harm.)
        if item.get_closest_marker("xdist_group") is None and module not in UNGROUPED_MODULES:
            item.add_marker(pytest.mark.xdist_group(getattr(item, "originalname", item.name)))
    items.sort(key=_weight)  # stable: the order within each weight stays the modules' own
    if "cpu" in TARGETS:
        return
    # the simulator, or STEADYSTEP_TEST_TARGETS=cuda on a GPU: the target tests alone
    skip = pytest.mark.skip(reason="CPU-only test; this process runs the target tests on cuda")
    for item in items:
        if "target" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
