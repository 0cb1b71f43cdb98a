"""Start-up time, each case in fresh processes. Run: python -m benchmarks.startup

- Numba's floor: ``import numba`` and the first call of one cached ``@njit`` kernel.
- torch: ``import torch``, a small model, ``torch.optim.AdamW(fused=True)`` and its first step.
- steadystep: ``import steadystep.torch``, the same model, ``steadystep.torch.AdamW`` and its
  first step, with a warm Numba cache and with a cold one (an empty ``NUMBA_CACHE_DIR``).

Medians of three processes; steadystep's extra is its time minus torch's.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

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
print(time.perf_counter() - start)
"""

STEP = """
import time
start = time.perf_counter()
import torch
{imports}
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
optimizer = {optimizer}(model.parameters(), lr=1e-3{options})
model(torch.randn(8, 64)).sum().backward()
optimizer.step()
print(time.perf_counter() - start)
"""

TORCH = STEP.format(imports="", optimizer="torch.optim.AdamW", options=", fused=True")
OURS = STEP.format(imports="import steadystep.torch", optimizer="steadystep.torch.AdamW", options="")


def seconds(code: str, cache: str, runs: int = 3, fresh: bool = False) -> float:
    """Median seconds a script reports, each run a new process (Numba caches what a file defines)."""
    script = os.path.join(tempfile.mkdtemp(), "case.py")
    with open(script, "w") as file:
        file.write(code)
    times = []
    for _ in range(runs):
        directory = tempfile.mkdtemp() if fresh else cache
        environment = {**os.environ, "NUMBA_CACHE_DIR": directory, "OMP_WAIT_POLICY": "PASSIVE"}
        result = subprocess.run([sys.executable, script], capture_output=True, text=True, env=environment, check=True)
        times.append(float(result.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main() -> None:
    print(f"start-up, CPU: {machine()}")
    cache = tempfile.mkdtemp()
    floor = seconds(FLOOR, cache)  # its first run fills the cache: the median is warm
    torch_time = seconds(TORCH, cache)
    cold = seconds(OURS, cache, fresh=True)
    seconds(OURS, cache, runs=1)  # fill the cache
    warm = seconds(OURS, cache)
    print(f"Numba's floor (import, one cached kernel's first call): {floor:.2f} s")
    print(f"torch: import, build, first fused AdamW step:          {torch_time:.2f} s")
    print(f"steadystep, warm cache:                                 {warm:.2f} s (+{warm - torch_time:.2f} s)")
    print(f"steadystep, cold cache:                                 {cold:.2f} s (+{cold - torch_time:.2f} s)")
    print(f"warm extra over Numba's floor: {warm - torch_time - floor:+.2f} s (target ≤ +0.10 s)")


if __name__ == "__main__":
    main()
