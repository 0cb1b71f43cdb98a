"""``python tests/spawn_ranks.py N PROGRAM...``: N processes of ``python PROGRAM...`` (a script and
its arguments, or ``-m module ...``) with the environment torchrun gives its ranks (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT), on this machine.

What the rank tests need of torchrun, without its cost: torchrun imports torch and runs an
elastic agent, about 4 s of a core before the first rank starts, in every launch of the suite.
As torchrun does, the ranks' output goes to this process's, the first rank to fail stops the
others (none is left waiting in an exchange), and the exit code is that rank's. The README's
torchrun snippet still runs under torchrun itself (tests/test_readme.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(arguments: list[str]) -> int:
    ranks, program = int(arguments[0]), arguments[1:]
    shared = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0"}
    shared.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    processes = [
        subprocess.Popen(
            [sys.executable, *program], env={**os.environ, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        )
        for rank in range(ranks)
    ]
    running = list(processes)
    while running:
        for process in list(running):
            code = process.poll()
            if code is None:
                continue
            running.remove(process)
            if code != 0:
                for other in running:
                    other.send_signal(signal.SIGTERM)
                for other in running:
                    try:
                        other.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        other.kill()
                sys.stderr.write(f"spawn_ranks: rank {processes.index(process)} exited with {code}\n")
                return code
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
