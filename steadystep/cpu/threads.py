"""How many threads the CPU target's parallel kernels may use when several processes (ranks)
share the machine. Numba starts a thread per core in every process, so N ranks on one machine
would run N threads a core, each launch waiting on the others'. The MPI and torch.distributed
communicators call ``share_cores`` when they are made; the CPU backend applies the share at its
next parallel launch (a process that launches none starts no threads for it).
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["share", "share_cores"]

_share: Optional[int] = None  # None: Numba's default, a thread a core


def share_cores(processes: int) -> int:
    """Runs this process's parallel CPU kernels on at most its share of the machine's cores
    when ``processes`` processes share the machine, and returns that share. It only ever
    lowers the count: a user's smaller ``numba.set_num_threads`` stands."""
    global _share
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _share = max(1, cores // max(1, processes))
    return _share


def share() -> Optional[int]:
    """The threads a parallel launch may use, or None when no share was set."""
    return _share
