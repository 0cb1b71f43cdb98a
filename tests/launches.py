"""Many rank cases, one launch: the rank tests' cases that share a launcher, a rank count and a
worker script run one after another in one ``torchrun`` or ``mpiexec`` of that script.

Starting N ranks (each importing torch and loading the kernels) costs seconds; one case's
steps on a 37-wide row cost milliseconds. So a test module declares its cases at import
(``Launches.case``), and the first test that asks for a case's result launches every case of
its group once; each rank loops over the cases, running the script's ``main`` on each with a
directory of its own, and writes what the case printed and returned there. A test then reads
its case as it read its own launch before: a return code, the ranks' output, the files.

A case that raises what its script does not expect ends the launch (the launcher stops the
other ranks instead of leaving them waiting in an exchange): that case's test and the cases
after it fail, with the launch's output.

Test modules of ranks are ``xdist_group``-marked, and the suite runs with ``--dist loadgroup``,
so that all cases of a group are asked for on one pytest worker and launched once.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import simulate_blocks_in_one_thread

CASES_OPTION = "--cases"


@dataclass(frozen=True)
class Finished:
    """One case of a launch, as a launch of its own would have ended: ``returncode`` is 0 when
    every rank returned 0 (else the first other code), ``stdout`` the ranks' output in rank
    order, ``stderr`` the launch's, ``out`` the case's own directory."""

    returncode: int
    stdout: str
    stderr: str
    out: Path


@dataclass
class Case:
    launches: Launches
    ranks: int
    options: tuple[str, ...]
    simulator: bool
    prepare: Callable[[Path], None] | None = None
    results: dict[str, Finished] = field(default_factory=dict)

    def run(self, backend: str) -> Finished:
        """This case's result under ``backend``, launching its group first if it has not run."""
        if backend not in self.results:
            self.launches.launch_group(backend, self.ranks, self.simulator)
        return self.results[backend]


class Launches:
    """The cases of one worker ``script``, grouped by (backend, ranks, simulator) at launch."""

    def __init__(self, script: Path, launch: Callable[..., subprocess.CompletedProcess]):
        self.script = script
        self._launch = launch  # rank_worker.launch: (backend, ranks, out, *options, simulator=, timeout=, script=)
        self.cases: list[Case] = []

    def case(
        self, ranks: int, *options: str, simulator: bool = False, prepare: Callable[[Path], None] | None = None
    ) -> Case:
        """Declare a case (at import, before any test runs): ``options`` for the script on
        ``ranks`` ranks, where ``{out}`` stands for the case's directory; ``prepare(out)``
        writes what the case reads there before the launch."""
        case = Case(self, ranks, tuple(options), simulator, prepare)
        self.cases.append(case)
        return case

    def launch_group(self, backend: str, ranks: int, simulator: bool) -> None:
        group = [case for case in self.cases if (case.ranks, case.simulator) == (ranks, simulator)]
        root = Path(tempfile.mkdtemp(prefix=f"steadystep-{backend}-{ranks}-ranks-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        listing = []
        for index, case in enumerate(group):
            out = root / f"case{index}"
            out.mkdir()
            if case.prepare is not None:
                case.prepare(out)
            listing.append({"out": str(out), "options": list(case.options)})
        (root / "cases.json").write_text(json.dumps(listing))
        launched = self._launch(
            backend,
            ranks,
            root,
            CASES_OPTION,
            str(root / "cases.json"),
            simulator=simulator,
            timeout=120 + 30 * len(group),
            script=self.script,
        )
        for index, case in enumerate(group):
            out = root / f"case{index}"
            codes = [_read(out / f"rank{rank}.returncode") for rank in range(ranks)]
            if any(code is None for code in codes):  # the launch ended before this case finished
                case.results[backend] = Finished(
                    launched.returncode or 1,
                    f"the launch of {len(group)} cases ended at or before this one (case {index}):\n{launched.stdout}",
                    launched.stderr,
                    out,
                )
                continue
            stdout = "".join((out / f"rank{rank}.stdout").read_text() for rank in range(ranks))
            failed = [code for code in codes if code]
            case.results[backend] = Finished(failed[0] if failed else 0, stdout, launched.stderr, out)


def _read(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


def rank_of_this_process() -> int:
    """This process's rank, as torchrun (RANK) or MPICH's hydra (PMI_RANK) tells it."""
    return int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))


def compile_one_rank_at_a_time(lock: Path) -> None:
    """The ranks of a launch start together and, on a cold cache, would each compile every
    kernel: N times the work on the same cores. Behind one file ``lock`` (one for every rank the
    tests start, whatever their launch), the first rank to
    need a kernel compiles it while the others wait, then load it from Numba's cache (which
    ``Dispatcher.compile`` reads before compiling). A kernel compiled inside another's
    compilation (a callee) is already under the lock."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: each rank compiles for itself
        return
    import threading

    from numba.core import dispatcher

    compile_ = dispatcher.Dispatcher.compile
    held = threading.local()

    def compile_alone(self, signature):
        if getattr(held, "depth", 0):
            return compile_(self, signature)
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.depth = 1
            try:
                return compile_(self, signature)
            finally:
                held.depth = 0

    dispatcher.Dispatcher.compile = compile_alone


def serve(main: Callable[[list[str]], int], barrier: Callable[[], None], arguments: list[str]) -> int:
    """The worker script's entry: ``main(arguments)`` once, or, given ``--cases FILE``, on every
    case listed there (its options and ``--out`` its directory), each case's output and return
    code written into its directory, the ranks meeting at a ``barrier`` between cases."""
    compile_one_rank_at_a_time(Path(tempfile.gettempdir()) / "steadystep-rank-compiles.lock")
    simulate_blocks_in_one_thread()
    if CASES_OPTION not in arguments:
        return main(arguments)
    listing = json.loads(Path(arguments[arguments.index(CASES_OPTION) + 1]).read_text())
    rank = rank_of_this_process()
    backend = arguments[arguments.index("--backend") + 1] if "--backend" in arguments else None
    for case in listing:
        out = Path(case["out"])
        options = [option.replace("{out}", str(out)) for option in case["options"]]
        own = [*options, "--out", str(out)] + (["--backend", backend] if backend else [])
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                code = main(own)
        except BaseException:
            raised = traceback.format_exc()
            (out / f"rank{rank}.stdout").write_text(printed.getvalue() + raised)
            sys.stdout.write(f"rank {rank} stopped the launch in {out.name}:\n{raised}")
            sys.stdout.flush()
            raise
        (out / f"rank{rank}.stdout").write_text(printed.getvalue())
        (out / f"rank{rank}.returncode").write_text(str(code))
        barrier()
    return 0
