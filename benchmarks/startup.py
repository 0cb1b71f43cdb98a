"""Start-up time, each case in fresh processes. Run: python -m benchmarks.startup

- Numba's floor: ``import numba`` and the first call of one cached ``@njit`` kernel.
- torch: ``import torch``, a small model, ``torch.optim.AdamW(fused=True)`` and its first step.
- steadystep: ``import steadystep.torch``, the same model, ``steadystep.torch.AdamW`` and its
  first step, with a warm Numba cache and with a cold one (an empty ``NUMBA_CACHE_DIR``), and
  after ``python -m steadystep warmup`` on an empty one.

Each process then takes a first step under ``torch.amp.GradScaler`` (a kernel variant of its
own), timed apart. Medians of three processes; steadystep's extra is its time minus torch's.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine

FLOOR = """
import time
start = time.perf_counter()
import numpy as np
from numba import njit
@njit(cache=True, error_model="numpy")
def kernel(a):
    for i in range(a.shape[0]):
        a[i] += 1.0
kernel(np.zeros(8, np.float32))
print(time.perf_counter() - start, 0.0, 0.0)
"""

STEP = """
import time
start = time.perf_counter()
import torch
{imports}
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
optimizer = {optimizer}(model.parameters(), lr=1e-3{options})
model(torch.randn(8, 64)).sum().backward()
built = time.perf_counter()
optimizer.step()
first = time.perf_counter() - built
scaler = torch.amp.GradScaler("cpu")
scaling = time.perf_counter()
scaler.scale(model(torch.randn(8, 64)).sum()).backward()
scaler.step(optimizer)
scaler.update()
print(built - start, first, time.perf_counter() - scaling)
"""

TORCH = STEP.format(imports="", optimizer="torch.optim.AdamW", options=", fused=True")
OURS = STEP.format(imports="import steadystep.torch", optimizer="steadystep.torch.AdamW", options="")


def _environment(cache: str) -> dict[str, str]:
    """A child's environment: Numba's cache in ``cache``, OpenMP threads that sleep when idle."""
    return {**os.environ, "NUMBA_CACHE_DIR": cache, "OMP_WAIT_POLICY": "PASSIVE"}


def seconds(code: str, cache: str, runs: int = 3, fresh: bool = False) -> list[float]:
    """Median seconds of what a script reports (imports and building; the first step; the first
    step under GradScaler), each run a new process (Numba caches what a file defines)."""
    script = os.path.join(tempfile.mkdtemp(), "case.py")
    with open(script, "w") as file:
        file.write(code)
    times = []
    for _ in range(runs):
        directory = tempfile.mkdtemp() if fresh else cache
        result = subprocess.run(
            [sys.executable, script], capture_output=True, text=True, env=_environment(directory), check=True
        )
        times.append([float(value) for value in result.stdout.strip().splitlines()[-1].split()])
    return [statistics.median(column) for column in zip(*times)]


def warmed_up(cache: str) -> float:
    """Seconds ``python -m steadystep warmup`` takes to fill an empty cache (float32, CPU)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "steadystep", "warmup"], capture_output=True, env=_environment(cache), check=True
    )
    return time.perf_counter() - start


def main() -> None:
    print(f"start-up, CPU: {machine()}")
    cache = tempfile.mkdtemp()
    floor = seconds(FLOOR, cache)[0]  # its first run fills the cache: the median is warm
    torch_times = seconds(TORCH, cache)
    cold = seconds(OURS, cache, fresh=True)
    seconds(OURS, cache, runs=1)  # fill the cache
    warm = seconds(OURS, cache)
    shared = tempfile.mkdtemp()
    warmup_seconds = warmed_up(shared)
    after = seconds(OURS, shared)
    print(f"Numba's floor (import, one cached kernel's first call): {floor:.2f} s")
    print(f"{'case':<44} {'import+build':>12} {'first step':>11} {'GradScaler':>11} {'all':>7} {'over torch':>11}")
    for name, (built, first, scaled) in [
        ("torch, AdamW(fused=True)", torch_times),
        ("steadystep, warm cache", warm),
        ("steadystep, cold cache", cold),
        (f"steadystep, after the warmup ({warmup_seconds:.0f} s, once)", after),
    ]:
        total = built + first + scaled
        over = "" if name.startswith("torch") else f"{total - sum(torch_times):+.2f} s"
        print(f"{name:<44} {built:>10.2f} s {first:>9.3f} s {scaled:>9.3f} s {total:>5.2f} s {over:>11}")
    extra = sum(warm) - sum(torch_times)
    print(
        f"warm: extra over torch {extra:+.2f} s, Numba's floor + 0.10 s = {floor + 0.10:.2f} s (target: extra ≤ that)"
    )
    print(f"cold: first step {cold[1]:.2f} s, first GradScaler step {cold[2]:.2f} s (target ≤ 5 s)")


if __name__ == "__main__":
    main()
