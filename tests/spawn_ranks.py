"""``python tests/spawn_ranks.py N PROGRAM...``: N processes of ``python PROGRAM...`` (a script and
its arguments, or ``-m module ...``) with the environment torchrun gives its ranks (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT), on this machine.

What the rank tests need of torchrun, without its cost: torchrun imports torch and runs an
elastic agent, about 4 s of a core before the first rank starts, in every launch of the suite.
As torchrun does, the ranks' output goes to this process's, the first rank to fail stops the
others (none is left waiting in an exchange), and the exit code is that rank's. The README's
torchrun snippet still runs under torchrun itself (tests/test_readme.py).

Each rank is a fork of this process once it has imported what every rank imports first (torch,
its distributed package and the compiler functorch loads, Numba and steadystep: 4-6 s of a core
a process here), and runs the program as ``python`` would, as ``__main__``. No thread runs when
it forks (the launches set OMP_NUM_THREADS=1, so OpenBLAS starts none), no process group exists
yet, and no kernel has been loaded: each rank starts from what a fresh interpreter would hold
after those imports."""

from __future__ import annotations

import importlib
import os
import runpy
import signal
import socket
import sys
import time

# what every rank script and `-m steadystep` import before their own work
PRELOADED = ("numpy", "torch", "torch.distributed", "torch._dynamo", "numba", "steadystep", "steadystep.torch")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(program: list[str]) -> None:
    """``python PROGRAM...`` in this (forked) process, as ``__main__``."""
    if program[0] == "-m":
        sys.argv = [program[1], *program[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(program)
        sys.path[0] = os.path.dirname(os.path.abspath(program[0]))
        runpy.run_path(program[0], run_name="__main__")


def _start(program: list[str], environment: dict[str, str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.environ.update(environment)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _run(program)
        # The rank ends as the interpreter ends a program: this, the program's own SystemExit or
        # an uncaught exception leaves through the launcher's frames, none of which catches it
        sys.exit(0)
    return pid


def _poll(pid: int) -> int | None:
    """The exit code of ``pid`` once it has ended (-signal if a signal ended it), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def main(arguments: list[str]) -> int:
    ranks, program = int(arguments[0]), arguments[1:]
    for name in PRELOADED:
        importlib.import_module(name)
    shared = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0"}
    shared.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    processes = [_start(program, {**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(ranks)]
    running = list(processes)
    while running:
        for pid in list(running):
            code = _poll(pid)
            if code is None:
                continue
            running.remove(pid)
            if code != 0:
                for other in running:
                    os.kill(other, signal.SIGTERM)
                deadline = time.monotonic() + 10
                for other in running:
                    while _poll(other) is None:
                        if time.monotonic() > deadline:
                            os.kill(other, signal.SIGKILL)
                            os.waitpid(other, 0)
                            break
                        time.sleep(0.02)
                sys.stderr.write(f"spawn_ranks: rank {processes.index(pid)} exited with {code}\n")
                return code
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
