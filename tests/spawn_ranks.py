"""``python tests/spawn_ranks.py N PROGRAM...``: N processes of ``python PROGRAM...`` (a script and
its arguments, or ``-m module ...``) with the environment torchrun gives its ranks (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT), on this machine.

What the rank tests need of torchrun, without its cost: torchrun imports torch and runs an
elastic agent, about 4 s of a core before the first rank starts, in every launch of the suite.
As torchrun does, the ranks' output goes to this process's, the first rank to fail stops the
others (none is left waiting in an exchange), and the exit code is that rank's. The docs' first
torchrun script still runs under torchrun itself (tests/test_readme.py).

Each rank is a fork of this process once it has imported what every rank imports first (torch,
its distributed package and the compiler functorch loads, Numba and steadystep: 4-6 s of a core
a process here), and runs the program as ``python`` would, as ``__main__``. No thread runs when
it forks (the launches set OMP_NUM_THREADS=1, so OpenBLAS starts none), no process group exists
yet, and no kernel has been loaded: each rank starts from what a fresh interpreter would hold
after those imports.

Those imports are most of a small launch's cost, so a pytest worker pays them once:
``--serve SOCKET`` is a process that imports them and then serves launches, forking a launcher
for each (``serve``); ``--via SOCKET PID N PROGRAM...`` is the light client a test runs instead
(``client``): it hands the server its arguments, environment, directory and standard streams,
and ends with the launch's exit code. A launch whose environment would change what those
imports did (another NUMBA_* or PYTHON* setting, such as the simulator's) is refused by the
server, and the client runs it as above, in a process of its own. Killing the client (a test's
timeout) stops its launch.

MPI ranks are started by mpiexec, not here, so for them the server stands in for one rank:
``mpiexec -n N python tests/spawn_ranks.py --join SOCKET PID PROGRAM...`` runs N light clients,
each handing the server its streams, environment and its connection to mpiexec's process manager
(the descriptor PMI_FD names), and the server forks the rank, which runs PROGRAM and initialises
MPI over that connection as the process mpiexec started would have."""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
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


def _fork() -> int:
    """os.fork(), with this process's buffered output written first (else both would write it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


def _rank(program: list[str]) -> None:
    """This (forked) process becomes a rank running ``program``, and ends with it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _run(program)
    # The rank ends as the interpreter ends a program: this, the program's own SystemExit or
    # an uncaught exception leaves through the launcher's frames, none of which catches it
    sys.exit(0)


def _start(program: list[str], environment: dict[str, str]) -> int:
    pid = _fork()
    if pid == 0:
        os.environ.update(environment)
        _rank(program)
    return pid


def _poll(pid: int) -> int | None:
    """The exit code of ``pid`` once it has ended (-signal if a signal ended it), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def _preload() -> None:
    for name in PRELOADED:
        importlib.import_module(name)
    # What every rank holds from here on, out of the collector's sight (Python's advice for
    # forked workers): a forked rank ending otherwise spends a second of a core collecting, and
    # copying the pages of, torch's objects
    gc.freeze()


def main(arguments: list[str]) -> int:
    ranks, program = int(arguments[0]), arguments[1:]
    _preload()
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


# What decides the preloaded modules' state: a launch that sets these otherwise is refused
IMPORT_SETTINGS = ("NUMBA_", "PYTHON", "OMP_", "OPENBLAS_", "MKL_", "TORCH", "CUDA")
REFUSED = -1000  # the reply to a refused launch; any other reply is the launch's exit code
MESSAGE = 1 << 20  # the largest request: arguments, environment and directory, as JSON


def _settings(environment: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in environment.items() if key.startswith(IMPORT_SETTINGS)}


def serve(path: str) -> None:
    """Serve launches at the socket ``path`` until the process that started this one ends.

    Single-threaded, so that each fork copies no other thread. Its frames catch nothing and
    clean nothing up: a forked launcher, and each rank it forks, leave through them as a
    program leaves the interpreter."""
    settings = _settings(dict(os.environ))  # as started: torch's imports add settings of their own
    _preload()
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".binding")
    listener.listen(16)
    os.rename(path + ".binding", path)  # clients wait for the path: it appears ready
    launches: dict[int, socket.socket | None] = {}  # launcher pid -> its client's connection
    while os.getppid() == parent:
        waiting = [connection for connection in launches.values() if connection is not None]
        ready, _, _ = select.select([listener, *waiting], [], [], 0.02)
        for connection in ready:
            if connection is listener:
                _accept(listener, launches, settings)
            else:  # readable before its reply: the client ended (a test's timeout): stop its launch
                pid = next(pid for pid, client in launches.items() if client is connection)
                launches[pid] = None
                connection.close()
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid, connection in list(launches.items()):
            code = _poll(pid)
            if code is not None:
                del launches[pid]
                if connection is not None:
                    try:
                        connection.send(struct.pack("i", code))
                    except OSError:
                        pass  # the client is gone
                    connection.close()


def _accept(listener: socket.socket, launches: dict[int, socket.socket | None], settings: dict[str, str]) -> None:
    connection, _ = listener.accept()
    message, descriptors, _, _ = socket.recv_fds(connection, MESSAGE, 4)
    request = json.loads(message)
    joining = request.get("join", False)  # one MPI rank: its streams and its PMI connection
    if len(descriptors) != 3 + joining or _settings(request["environment"]) != settings:
        connection.send(struct.pack("i", REFUSED))
        connection.close()
        for descriptor in descriptors:
            os.close(descriptor)
        return
    pid = _fork()
    if pid == 0:
        os.setpgrp()  # the launcher and its ranks: one group, stopped together
        listener.close()
        for client in launches.values():
            if client is not None:
                client.close()
        connection.close()
        for stream, descriptor in enumerate(descriptors[:3]):
            os.dup2(descriptor, stream)
            os.close(descriptor)
        os.environ.clear()
        os.environ.update(request["environment"])
        os.chdir(request["directory"])
        if joining:  # this process is the rank: MPI finds mpiexec's connection at its number here
            os.environ["PMI_FD"] = str(descriptors[3])
            _rank(request["arguments"])
        code = main(request["arguments"])  # a rank leaves main by its program's own end, through these frames
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the launcher's own end: the server's objects need no teardown
    for descriptor in descriptors:
        os.close(descriptor)
    launches[pid] = connection


def client(path: str, server: int, arguments: list[str], join: bool = False) -> int:
    """Launch ``arguments`` (N PROGRAM..., or PROGRAM... to ``join`` as an MPI rank) through the
    server at ``path`` (process ``server``), or in this process if it refuses them or is gone."""
    if join and "PMI_FD" not in os.environ:  # another process manager than hydra's: no fd to hand over
        return _direct(arguments, join)
    while not os.path.exists(path):
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return _direct(arguments, join)
        time.sleep(0.02)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(path)
    except OSError:
        return _direct(arguments, join)
    request = {"arguments": arguments, "environment": dict(os.environ), "directory": os.getcwd(), "join": join}
    descriptors = [0, 1, 2, int(os.environ["PMI_FD"])] if join else [0, 1, 2]
    try:
        socket.send_fds(connection, [json.dumps(request).encode()], descriptors)
    except OSError:  # a stream closed, or the server gone before it read the request
        return _direct(arguments, join)
    reply = connection.recv(4)
    if len(reply) != 4:  # the server ended with the launch unfinished
        sys.stderr.write("spawn_ranks: the launch server ended during the launch\n")
        return 1
    (code,) = struct.unpack("i", reply)
    if code == REFUSED:
        return _direct(arguments, join)
    if code < 0:  # the launcher was ended by a signal: end as it did
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _direct(arguments: list[str], join: bool = False) -> int:
    """The launch in a process of its own, which imports everything itself (a rank to join:
    the program itself, in this process, as mpiexec would have started it)."""
    launch = [*arguments] if join else [os.path.abspath(__file__), *arguments]
    os.execv(sys.executable, [sys.executable, *launch])
    return 1  # not reached


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    elif sys.argv[1] in ("--via", "--join"):
        sys.exit(client(sys.argv[2], int(sys.argv[3]), sys.argv[4:], join=sys.argv[1] == "--join"))
    else:
        sys.exit(main(sys.argv[1:]))
